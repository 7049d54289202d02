"""Workspace hardening without a sandbox: the host's reading of the kernel channel (a fake channel sends
what a broken or forged kernel could), the layer program's hash and snapshot (sparse files, names that
are not UTF-8, deep folders) on real folders, the file tools' pages and escaped names, the inode cap's
figure, and a replay that cannot check a step's files."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import struct
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from agentrl.tools.sandbox.base import tmpfs_files
from agentrl.tools.workspace import WorkspaceReplayError, WorkspaceSpec
from agentrl.tools.workspace.kernel import Kernel, frame_cap
from agentrl.tools.workspace.programs import PROGRAM_DIR, snapshot_cap
from agentrl.tools.workspace.tools import page_text


def _program(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, PROGRAM_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_resolve = _program("_resolve")
_fsops = _program("_fsops")
_layer = _program("_layer")

CAP = 64


# -- the kernel channel, as the host reads it ----------------------------------------------------
class FakeChannel:
    """A kernel channel whose answers a test writes: ``reply(request) -> bytes`` (frames, raw)."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.pid: int | None = 7
        self.buffer = bytearray(self.frame({"ready": True, "pid": 7}))
        self.killed = 0
        self.read_total = 0

    @staticmethod
    def frame(obj: Any) -> bytes:
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        return struct.pack(">I", len(body)) + body

    async def send(self, data: bytes) -> None:
        request = json.loads(data[4:])
        self.buffer += self.reply(request)

    async def read_exact(self, n: int) -> bytes:
        if len(self.buffer) < n:
            from agentrl.tools.workspace.kernel import KernelDied

            raise KernelDied("closed")
        out, self.buffer = bytes(self.buffer[:n]), self.buffer[n:]
        self.read_total += n
        return out

    async def kill(self) -> str:
        self.killed += 1
        return "killed by SIGKILL"


def answer(request: dict[str, Any], out: bytes = b"ok\n", **fields: Any) -> dict[str, Any]:
    return {"nonce": request["nonce"], "stdout": base64.b64encode(out).decode(), "stderr": "",
            "stdout_bytes": len(out), "stderr_bytes": 0, "exception": None, "timed_out": False,
            "duration_s": 0.0, **fields}


def run_cell(reply: Any) -> tuple[Any, FakeChannel]:
    channels: list[FakeChannel] = []

    async def start() -> FakeChannel:
        channels.append(FakeChannel(reply))
        return channels[-1]

    async def go() -> Any:
        kernel = Kernel(start, timeout_s=5.0, max_output_bytes=CAP, memory_mb=64)
        return await kernel.run("1")

    return asyncio.run(go()), channels[0]


def test_a_good_answer_is_decoded() -> None:
    cell, channel = run_cell(lambda r: FakeChannel.frame(answer(r)))
    assert cell.stdout == "ok\n" and cell.restarted is None and channel.killed == 0


@pytest.mark.parametrize(("name", "reply", "why"), [
    ("oversize", lambda r: struct.pack(">I", 12 << 20) + b"A" * 100, "more than the"),
    ("not json", lambda r: FakeChannel.frame(b"{not json"), "not JSON"),
    ("not an object", lambda r: FakeChannel.frame([1, 2]), "expected an object"),
    ("another cell's", lambda r: FakeChannel.frame(answer({"nonce": "forged"})), "another cell"),
    ("no nonce", lambda r: FakeChannel.frame({k: v for k, v in answer(r).items() if k != "nonce"}), "another cell"),
    ("ill-typed", lambda r: FakeChannel.frame(answer(r, stdout=5)), "no valid 'stdout'"),
    ("not base64", lambda r: FakeChannel.frame(answer(r, stdout="!!!")), "not base64"),
    ("over the cap", lambda r: FakeChannel.frame(answer(r, b"A" * (CAP + 1))), "over the cap"),
    ("a smaller total", lambda r: FakeChannel.frame(answer(r, b"A" * 10, stdout_bytes=3)), "over the cap"),
    ("broken", lambda r: FakeChannel.frame({"nonce": r["nonce"], "broken": "a status frame of 9 bytes"}), "9 bytes"),
])
def test_a_bad_answer_is_a_typed_restart_never_an_exception(name: str, reply: Any, why: str) -> None:
    cell, channel = run_cell(reply)
    assert cell.exception == "KernelBroken" and cell.restarted and why in cell.restarted, (name, cell)
    assert channel.killed == 1  # the kernel is ended: the next cell starts a fresh one
    assert channel.read_total <= frame_cap(CAP) + 8  # an oversize frame is refused from its length, unread


def test_a_died_answer_says_how() -> None:
    cell, channel = run_cell(lambda r: FakeChannel.frame({"nonce": r["nonce"], "died": "killed by SIGSEGV"}))
    assert cell.exception == "KernelDied" and "SIGSEGV" in str(cell.restarted) and channel.killed == 1


# -- the layer program: hash and snapshot ------------------------------------------------------------
def make_tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_bytes(b"x" * 10_000)
    with open(root / "sparse", "wb") as f:
        f.write(b"head")
        f.seek(700 << 20)
        f.write(b"tail")
        f.truncate(1 << 30)
    (root / "link").symlink_to("a/b/f.txt")
    (Path(os.fsdecode(bytes(root) + b"/caf\xe9"))).write_bytes(b"latin")


def test_hash_and_snapshot_cost_what_the_files_hold(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    make_tree(src)
    digest = _layer.digest(str(src), [])
    assert digest["entries"] == 6 and digest["bytes"] < 1 << 20  # the holes were not read
    out = bytearray()
    size = _layer.write_snapshot(str(src), out.extend, 1 << 20)
    assert size == len(out) < 64 << 10
    with pytest.raises(_layer.TooLarge):
        _layer.write_snapshot(str(src), bytearray().extend, 4096)
    view = memoryview(bytes(out))
    pos = 0

    def read_exact(n: int) -> bytes:
        nonlocal pos
        pos += n
        return bytes(view[pos - n:pos])

    assert _layer.read_snapshot(str(dst), read_exact) == 6
    assert _layer.digest(str(dst), []) == digest
    assert os.path.getsize(dst / "sparse") == 1 << 30 and os.stat(dst / "sparse").st_blocks * 512 < 1 << 20
    assert (dst / "link").readlink() == Path("a/b/f.txt")


def test_a_sparse_files_hash_is_its_content_not_its_holes(tmp_path: Path) -> None:
    def one(name: str, write: Any) -> str:
        folder = tmp_path / name
        folder.mkdir()
        with open(folder / "f", "wb") as f:
            write(f)
        return str(_layer.digest(str(folder), [])["digest"])

    def holes(f: Any) -> None:
        f.write(b"a")
        f.seek(1 << 20)
        f.write(b"b")

    def some_zeros_written(f: Any) -> None:  # the same content, a hole of another shape
        f.write(b"a")
        f.write(bytes(3 * 4096))
        f.seek(1 << 20)
        f.write(b"b")

    def other(f: Any) -> None:
        f.write(b"a")
        f.seek(1 << 20)
        f.write(b"c")

    assert one("holes", holes) == one("zeros", some_zeros_written)
    assert one("holes2", holes) != one("other", other)


def test_a_tree_nested_too_deep_is_refused(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(_layer.MAX_DEPTH + 1):  # (a chain by fd: the path would be too long to name)
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
    with pytest.raises(_layer.TooDeep):
        _layer.digest(str(tmp_path), [])


# -- the file tools: pages, escaped names --------------------------------------------------------------
def test_a_long_file_is_read_a_page_at_a_time(tmp_path: Path) -> None:
    lines = [f"line {i:05d}\n" for i in range(5000)]
    (tmp_path / "long.txt").write_text("".join(lines))
    (tmp_path / "one.json").write_text("[" + "1," * 50_000 + "1]")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        page = _fsops.read(fd, "long.txt", max_chars=1000)
        assert page["content"] == "".join(lines[:90]) and (page["first"], page["last"], page["lines"]) == (1, 90, 5000)
        text = page_text(page, 1000)
        assert text.endswith("[lines 1-90 of 5000 shown; read on with start_line=91]")
        last = _fsops.read(fd, "long.txt", start_line=4991, max_chars=1000)
        assert page_text(last, 1000).endswith("[lines 4991-5000 of 5000 shown]")
        assert "past the end" in page_text(_fsops.read(fd, "long.txt", start_line=6000), 1000)
        cut = _fsops.read(fd, "one.json", max_chars=1000)
        assert len(cut["content"]) == 1000 and "only its start is shown" in page_text(cut, 1000)
        os.mkdir(os.path.join(bytes(tmp_path), b"d\xff"))
        with open(os.path.join(bytes(tmp_path), b"d\xff", b"caf\xe9.txt"), "wb") as f:
            f.write(b"latin")
        listing = _fsops.list_dir(fd, ".", depth=2)["entries"]
        assert "d\\xff/" in listing and "d\\xff/caf\\xe9.txt (5 bytes)" in listing
        json.dumps(listing).encode("utf-8")
        assert _fsops.read(fd, "d\\xff/caf\\xe9.txt")["content"] == "latin"  # the shown name names the file
    finally:
        os.close(fd)


def test_caps_follow_the_sizes() -> None:
    assert tmpfs_files(16 << 20) == 4096 and tmpfs_files(1 << 20) == 1024
    spec = WorkspaceSpec(size_mb=64)
    assert spec.file_cap == 16384 and WorkspaceSpec(size_mb=64, max_files=10).file_cap == 10
    assert snapshot_cap(16, 4096) <= 2 * (16 << 20) + (4 << 20)
    with pytest.raises(ValueError, match=r"WorkspaceSpec.max_files: expected a positive integer, got 0"):
        WorkspaceSpec(max_files=0)


# -- a replay that cannot check a step ---------------------------------------------------------------
def test_a_replayed_step_without_a_recorded_hash_restarts_the_episode() -> None:
    from test_workspace_unit import FakeBackend, session_on

    async def go() -> None:
        backend = FakeBackend(["aaaa"])
        session = session_on(backend)
        session.workspaces._bind_loop()
        session.workspaces._backends["bwrap"] = backend
        session.begin_replay([], [None])
        await session.get()
        with pytest.raises(WorkspaceReplayError, match="cannot be checked"):
            await session.after_step({})
        await session.remove()

    asyncio.run(go())
