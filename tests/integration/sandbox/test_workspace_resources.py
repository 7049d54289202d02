"""Workspaces under attack, part 3: memory the model chooses, a full workspace, real repositories' files.

Each test runs on bwrap and on Docker (skipped with the reason where no daemon can run), through the
public workspace API and the model's tools:

- empty files stop at the workspace's inode cap (``WorkspaceSpec.max_files``), in ``/work`` and in
  ``/tmp``, and the workspace goes on working;
- a sparse file costs what it holds: hashing and snapshotting a workspace with a 1 GiB sparse file
  read only its allocated blocks (the snapshot is no larger than the workspace's cap, restores the
  file, and the tree of the process running the workspace API, the trainer's or a fleet executor's,
  does not grow by the file's apparent size); a member's check is not done by the process its group
  shares;
- memory a killed kernel left behind stays charged to its member (a restart is no fresh budget);
- a workspace whose container or holder died answers every call with a typed failure;
- a full workspace (``/work``, ``/tmp``, ``/dev/shm``) still runs commands, cells and the grader,
  and recovers once the model deletes files;
- file tools on what real repositories hold: a long file is read a page at a time with a note, a
  big file is written whole (or refused with a typed error past ``max_file_mb``), a name that is not
  UTF-8 is listed escaped (and the escaped name works), and the per-step hash never goes silent.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psutil
import pytest
import pytest_asyncio

from agentrl.chat.types import FailureKind
from agentrl.tools.sandbox import SandboxLimits
from agentrl.tools.workspace import (
    Workspace,
    WorkspaceError,
    Workspaces,
    WorkspaceSession,
    WorkspaceSpec,
    workspace_tools,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(300)]

LIMITS = SandboxLimits(timeout_s=20.0, cpu_s=20, memory_mb=256, tmp_mb=16, max_file_mb=8)
SIZE_MB = 16


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    if request.param == "docker":
        return "docker", {"docker": {"docker_host": request.getfixturevalue("docker_host")}}
    return "bwrap", {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def wss(backend: tuple[str, dict[str, Any]]) -> AsyncIterator[Workspaces]:
    workspaces = Workspaces(backend_options=backend[1])
    yield workspaces
    await workspaces.close()
    assert workspaces.leftovers() == {"workspaces": 0}


@pytest.fixture(scope="module")
def workspace_processes() -> int:
    """The process whose tree runs the workspaces' API (digests, snapshots, holders): this one."""
    return os.getpid()


HolderOf = Callable[[Workspace], Awaitable[int]]


@pytest.fixture(scope="module")
def holder_of() -> HolderOf:
    """The pid of a bwrap workspace's holder (the process its group shares)."""
    async def pid(ws: Workspace) -> int:
        return int(ws.group.holder.pid)  # type: ignore[attr-defined]
    return pid


@pytest.fixture(scope="module")
def spec(backend: tuple[str, dict[str, Any]]) -> WorkspaceSpec:
    return WorkspaceSpec(backend=backend[0], size_mb=SIZE_MB, limits=LIMITS, kernel_memory_mb=192, cell_timeout_s=20.0)


class PeakRSS:
    """The largest resident memory of process ``pid`` and all its descendants, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = self.base = self.sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        me = psutil.Process(self.pid)
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.sample())

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def grown_mb(self) -> float:
        return (self.peak - self.base) / 2**20


# --------------------------------------------------------------------------- inodes

FILL_FILES = """
import errno, os, sys
os.makedirs(sys.argv[1], exist_ok=True)
n = 0
try:
    while n < 2_000_000:
        open(os.path.join(sys.argv[1], str(n)), "w").close()
        n += 1
    print(n, "no limit")
except OSError as exc:
    print(n, errno.errorcode.get(exc.errno))
"""


async def test_empty_files_stop_at_the_inode_cap(wss: Workspaces, spec: WorkspaceSpec) -> None:
    ws = await wss.create(spec)
    cap = getattr(spec, 'file_cap', SIZE_MB * 256)
    try:
        for where in ("/work/many", "/tmp/many"):
            out = await ws.run(f"python3 -c '{FILL_FILES}' {where}")
            count, reason = out.stdout.split()
            assert reason == "ENOSPC" and int(count) <= cap, (where, out)
        cell = await ws.python(FILL_FILES.replace("sys.argv[1]", "'/tmp/kernel-many'"))
        count, reason = cell.stdout.split()
        assert reason == "ENOSPC" and int(count) <= cap, cell
        assert (await ws.run("rm -r /work/many && echo x > f && cat f")).stdout == "x\n"  # recovers
    finally:
        await wss.remove(ws)


# --------------------------------------------------------------------------- sparse files, hashes, snapshots

SPARSE = """
import os
with open("sparse", "wb") as f:
    f.write(b"head")
    f.seek(700 << 20)
    f.write(b"tail")
    f.truncate(1 << 30)
with open("data", "wb") as f:
    f.write(os.urandom(3_000_000))
os.stat("sparse").st_blocks * 512 < (1 << 20)
"""


async def test_a_sparse_file_costs_what_it_holds(wss: Workspaces, spec: WorkspaceSpec,
                                                 workspace_processes: int) -> None:
    ws = await wss.create(spec)
    try:
        made = await ws.python(SPARSE)  # (the kernel has no file-size limit; commands have max_file_mb)
        assert made.stdout == "True\n", made  # a few allocated KiB
        with PeakRSS(workspace_processes) as rss:
            before = await ws.digest()
            snapshot = await ws.snapshot()
        assert rss.grown_mb < 64 + 2 * SIZE_MB, rss.grown_mb
        assert len(snapshot) <= (SIZE_MB << 20) + (1 << 20), len(snapshot)
        changed = await ws.python("with open('sparse', 'r+b') as f:\n    f.seek(700 << 20)\n    f.write(b'TAIL')")
        assert changed.exception is None, changed
        assert await ws.digest() != before  # the hash sees the data past the holes
    finally:
        await wss.remove(ws)
    restored = await wss.restore(spec, {}, snapshot)
    try:
        check = await restored.run("stat -c %s sparse; head -c 4 sparse; tail -c +$(((700 << 20) + 1)) sparse "
                                   "| head -c 4; echo; cmp -n 4096 sparse /dev/zero 2>&1 | head -c 20; echo")
        assert check.stdout.splitlines()[:2] == [str(1 << 30), "headtail"], check
    finally:
        await wss.remove(restored)


async def test_a_members_check_is_not_the_groups(wss: Workspaces, spec: WorkspaceSpec,
                                                 backend: tuple[str, Any], holder_of: HolderOf) -> None:
    """The per-step hash of one member's 4 GiB of holes is neither done by the process its group shares
    (the bwrap holder) nor as long as the holes: the sibling's calls are not queued behind it."""
    a, b = await wss.create(spec), await wss.create(spec)
    try:
        made = await a.python("with open('holes', 'wb') as f:\n    f.truncate(4 << 30)\n    f.seek(0, 2)\n"
                              "    f.write(b'x')\nimport os\nos.path.getsize('holes')")
        assert made.stdout == f"{(4 << 30) + 1}\n", made
        assert (await b.run("echo b > b.txt")).ok
        holder = psutil.Process(await holder_of(a)) if backend[0] == "bwrap" else None
        spent = sum(holder.cpu_times()[:2]) if holder is not None else 0.0
        digests = await asyncio.gather(a.digest(), b.digest(), b.run("cat b.txt"))
        assert digests[2].stdout == "b\n"
        if holder is not None:
            assert sum(holder.cpu_times()[:2]) - spent < 0.5  # the holder read none of the 4 GiB
    finally:
        await wss.remove(a)
        await wss.remove(b)


async def test_memory_a_killed_kernel_left_stays_with_its_member(wss: Workspaces, spec: WorkspaceSpec,
                                                                 backend: tuple[str, Any]) -> None:
    if backend[0] == "docker":
        pytest.skip("Docker caps the kernel with RLIMIT_AS: what it wrote counts in its container's limit")
    big = spec.replace(size_mb=160)
    ws = await wss.create(big)
    try:
        wrote = await ws.python("with open('/work/blob', 'wb') as f:\n    for _ in range(120):\n"
                                "        f.write(b'x' * (1 << 20))\nimport os\nos.path.getsize('/work/blob')")
        assert wrote.stdout == f"{120 << 20}\n", wrote
        died = await ws.python("hog = [b'y' * (1 << 20) for _ in range(400)]")
        assert died.restarted and "out of memory" in died.restarted, died
        # 120 MiB of the 192 MiB cap are still the member's (its files): a restart is no fresh budget
        again = await ws.python("hog = [b'y' * (1 << 20) for _ in range(120)]\nlen(hog)")
        assert again.restarted and "out of memory" in again.restarted, again
    finally:
        await wss.remove(ws)


# --------------------------------------------------------------------------- a dead workspace, a full one

async def kill_workspace(ws: Workspace, backend: str, holder_of: HolderOf) -> None:
    """What a memory death does to a workspace: its container (Docker) or holder (bwrap) is gone."""
    if backend == "docker":
        container = ws.container  # type: ignore[attr-defined]
        await asyncio.to_thread(container.kill)
        await asyncio.to_thread(container.wait, timeout=30)  # kill returns before the container has stopped
    else:
        holder = psutil.Process(await holder_of(ws))
        holder.kill()
        for _ in range(600):  # polled, not waited for: the workspace's own code reaps its child
            try:
                if holder.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            await asyncio.sleep(0.05)


async def test_a_dead_workspace_answers_with_typed_failures(wss: Workspaces, spec: WorkspaceSpec,
                                                            backend: tuple[str, Any], holder_of: HolderOf) -> None:
    session = WorkspaceSession(spec, workspaces=wss)
    tools = workspace_tools(session)
    bash, python, read, write, edit, listing = tools
    try:
        assert (await bash(command="echo alive")).content == "alive\n"
        assert (await python(code="1")).content == "1\n"
        assert session.workspace is not None
        await kill_workspace(session.workspace, backend[0], holder_of)
        calls: list[tuple[Callable[..., Any], dict[str, Any]]] = [
            (bash, {"command": "echo hi"}), (python, {"code": "2"}), (read, {"path": "x"}),
            (write, {"path": "x", "content": "y"}), (edit, {"path": "x", "old_text": "a", "new_text": "b"}),
            (listing, {})]
        for tool, arguments in calls:  # a value every time, never an exception; Docker: a typed failure
            result = await tool(**arguments)
            if backend[0] == "docker" or result.is_error:
                assert result.is_error and result.error_kind in (FailureKind.SANDBOX_ERROR, FailureKind.TOOL_ERROR), \
                    (tool.name, result)
        if backend[0] == "docker":
            with pytest.raises(WorkspaceError):
                await session.workspace.digest()
            info: dict[str, Any] = {}
            await session.after_step(info)
            assert info["workspace"]["digest"] is None and info["workspace"]["error"], info
        graded = await session.workspace.grade("echo graded")  # bwrap: a new sandbox in the dead holder's namespace
        assert not graded.ok and graded.killed_reason == "sandbox_error", graded
    finally:
        await session.remove()


FILL = ("for d in /work /tmp /dev/shm; do for i in 1 2 3 4 5; do head -c 4M /dev/zero > $d/full$i 2>/dev/null; "
        "done; done; i=0; while { : > /tmp/f$i; } 2>/dev/null; do i=$((i+1)); done; echo filled")


async def test_a_full_workspace_recovers(wss: Workspaces, spec: WorkspaceSpec) -> None:
    session = WorkspaceSession(spec, workspaces=wss)
    bash, python, _, write, *_ = workspace_tools(session)
    try:
        await python(code="kept = 1")
        assert (await bash(command=FILL)).content == "filled\n"
        await python(code="open('/tmp/k', 'wb').write(b'z' * (40 << 20))")
        assert (await bash(command="echo still")).content == "still\n"
        assert (await python(code="kept + 1")).content == "2\n"
        assert (await python(code="import os\nos.abort()")).is_error  # a restart while /tmp is full
        assert (await python(code="3 * 3")).content == "9\n"
        assert session.workspace is not None
        graded = await session.workspace.grade("cat /grader/t; ls /work", files={"t": "graded\n"})
        assert graded.ok and graded.stdout.startswith("graded\nfull1\n"), graded
        assert (await bash(command="rm -f /work/full* /tmp/full* /tmp/f* /dev/shm/full*; echo ok > /work/f; cat /work/f")
                ).content == "ok\n"
        assert not (await write(path="after.txt", content="room again")).is_error
    finally:
        await session.remove()


# --------------------------------------------------------------------------- file tools on real repositories

async def test_file_tools_handle_what_repositories_hold(wss: Workspaces, spec: WorkspaceSpec) -> None:
    session = WorkspaceSession(spec, workspaces=wss)
    bash, _, read, write, edit, listing = workspace_tools(session)
    try:
        lines = [f"line {i:05d} " + "x" * 60 for i in range(3000)]  # ~200 KB
        long_text = "\n".join(lines) + "\n"
        assert not (wrote := await write(path="long.txt", content=long_text)).is_error, wrote
        assert (await bash(command="wc -c < long.txt")).content == f"{len(long_text)}\n"
        page = await read(path="long.txt")
        assert not page.is_error and page.content.startswith(lines[0]), page.content[:200]
        assert "start_line=" in page.content and len(page.content) <= 4000, page.content[-300:]
        shown = [ln for ln in page.content.splitlines() if ln.startswith("line ")]
        following = await read(path="long.txt", start_line=len(shown) + 1)
        assert following.content.startswith(lines[len(shown)]), following.content[:200]
        one_line = await write(path="min.json", content="[" + ",".join(["1234567890"] * 30000) + "]")
        assert not one_line.is_error
        assert not (await read(path="min.json")).is_error

        big = "y" * 300_000 + "MARK" + "y" * 299_996
        assert not (await write(path="big.txt", content=big)).is_error
        assert (await bash(command="wc -c < big.txt")).content == "600000\n"
        assert not (await edit(path="big.txt", old_text="MARK", new_text="z" * 300_000)).is_error
        assert (await bash(command="wc -c < big.txt")).content == f"{600_000 - 4 + 300_000}\n"
        too_big = await write(path="huge.txt", content="h" * ((LIMITS.max_file_mb << 20) + 1))
        assert too_big.is_error and too_big.error_kind == FailureKind.TOOL_ERROR, too_big.content[:300]
        assert "max_file_mb" in too_big.content

        assert (await bash(command="printf 'latin' > $'caf\\xe9.txt' && mkdir $'d\\xff' && echo ok")).content == "ok\n"
        listed = await listing()
        listed.content.encode("utf-8")  # no lone surrogate: the chat template can render it
        assert "caf\\xe9.txt" in listed.content and "d\\xff/" in listed.content, listed.content
        assert (await read(path="caf\\xe9.txt")).content == "latin"
        info: dict[str, Any] = {}
        await session.after_step(info)
        assert isinstance(info["workspace"]["digest"], str), info
    finally:
        await session.remove()
