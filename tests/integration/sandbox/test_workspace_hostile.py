"""Workspaces under attack, on both backends: what one episode does stays in its own workspace.

Each test runs on bwrap and on Docker (skipped with the reason where no daemon can run). The base
folder belongs to root on the host (bwrap stages a copy the sandbox user owns); its hash is checked
after every test. Attempts: reading or writing another episode's workspace or the base, ``..`` and
symlink escapes through the file tools, filling the size cap, a kernel that forks and leaves
processes, state carried into the next episode forked from the same prepared state, a kernel past
its limits; and a kill -9 of the process that owns workspaces (the reaper removes them).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio

from agentrl.tools.sandbox import SandboxLimits
from agentrl.tools.workspace import Workspace, Workspaces, WorkspaceSession, WorkspaceSpec, workspace_tools

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

LIMITS = SandboxLimits(timeout_s=10.0, cpu_s=10, memory_mb=256, tmp_mb=16)
SIZE_MB = 8
KERNEL_MB = 192


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ws-base")
    os.chmod(root, 0o755)
    folder = root / "base"
    (folder / "pkg").mkdir(parents=True)
    (folder / "base.txt").write_text("from the base\n")
    (folder / "pkg" / "mod.py").write_text("VALUE = 1\n")
    return folder


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    if request.param == "docker":
        return "docker", {"docker": {"docker_host": request.getfixturevalue("docker_host")}}
    return "bwrap", {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def wss(backend: tuple[str, dict[str, Any]], base: Path) -> AsyncIterator[Workspaces]:
    before = tree_hash(base)
    workspaces = Workspaces(backend_options=backend[1])
    yield workspaces
    await workspaces.close()
    assert workspaces.leftovers() == {"workspaces": 0}
    assert tree_hash(base) == before


@pytest.fixture(scope="module")
def spec(backend: tuple[str, dict[str, Any]], base: Path) -> WorkspaceSpec:
    return WorkspaceSpec(base=str(base), backend=backend[0], size_mb=SIZE_MB, limits=LIMITS,
                         kernel_memory_mb=KERNEL_MB, cell_timeout_s=2.0, setup=("echo prepared > setup.txt",))


@pytest.fixture(autouse=True)
def base_untouched(base: Path) -> Any:
    before = tree_hash(base)
    yield
    assert tree_hash(base) == before


async def sh(ws: Workspace, command: str) -> Any:
    return await ws.run(command)


async def test_state_persists_within_an_episode(wss: Workspaces, spec: WorkspaceSpec) -> None:
    session = WorkspaceSession(spec, {"task.txt": "the task\n"}, workspaces=wss)
    bash, python, read, write, edit, listing = workspace_tools(session)
    try:
        assert (await bash(command="cat base.txt task.txt setup.txt && mkdir -p sub && cd sub && echo a > a.txt")
                ).content == "from the base\nthe task\nprepared\n"
        assert (await bash(command="pwd && cat a.txt")).content == "/work/sub\na\n"  # the directory carried over
        assert (await python(code="import os\nnames = sorted(os.listdir('sub'))")).content == ""
        assert (await python(code="names, open('task.txt').read()")).content == "(['a.txt'], 'the task\\n')\n"
        assert (await python(code="from pkg.mod import VALUE\nVALUE + 1")).content == "2\n"  # /work imports
        assert not (await write(path="/work/sub/b.txt", content="b")).is_error
        assert not (await edit(path="sub/b.txt", old_text="b", new_text="bee")).is_error
        assert (await read(path="sub/b.txt")).content == "bee"
        assert (await listing(path="sub")).content == "a.txt (2 bytes)\nb.txt (3 bytes)"
    finally:
        await session.remove()


async def test_file_tools_cannot_leave_the_workspace(wss: Workspaces, spec: WorkspaceSpec) -> None:
    session = WorkspaceSession(spec, workspaces=wss)
    bash, _, read, write, edit, listing = workspace_tools(session)
    try:
        planted = await bash(command="ln -s /etc/passwd abs && ln -s ../../../../etc/passwd rel && ln -s / root "
                                     "&& ln -s /proc/self/root magic && ln -s .. up && echo ok")
        assert planted.content == "ok\n", planted
        for path in ("/etc/passwd", "../etc/passwd", "sub/../../etc/passwd", "abs", "rel", "root/etc/passwd",
                     "magic/etc/passwd", "up/etc/passwd", "/work/../etc/passwd"):
            for result in (await read(path=path), await write(path=path, content="pwned"),
                           await edit(path=path, old_text="root", new_text="pwned")):
                assert result.is_error, (path, result)
                assert "outside the workspace" in result.content or "no such file" in result.content, (path, result)
        assert (await listing(path="root")).is_error
        assert (await bash(command="grep -rls pw''ned /work /tmp /etc 2>/dev/null | wc -l")).content == "0\n"
    finally:
        await session.remove()


async def test_episodes_cannot_reach_each_other_or_the_base(wss: Workspaces, spec: WorkspaceSpec) -> None:
    a, b = await wss.create(spec), await wss.create(spec)
    try:
        assert (await sh(a, "echo secret-a > mine.txt && rm base.txt && echo changed > pkg/mod.py")).ok
        where = getattr(a, "merged", None)
        seen = await sh(b, "cat mine.txt; cat base.txt pkg/mod.py; "
                           f"ls {where or '/nonexistent'} 2>&1; grep -rs secret''-a /work /tmp /mnt /run /var /opt /srv /home "
                           "2>/dev/null | head -3; true")
        assert seen.stdout.startswith("from the base\nVALUE = 1\n"), seen
        assert "secret-a" not in seen.stdout, seen
        if where is not None:  # bwrap: a's layer is mounted only in its holder's namespace, bound only into a
            assert "No such file" in seen.stdout
        again = await wss.create(spec)  # a later fork of the same prepared state: pristine
        try:
            assert (await sh(again, "cat base.txt; test -e mine.txt || echo clean")).stdout == "from the base\nclean\n"
        finally:
            await wss.remove(again)
    finally:
        await wss.remove(a)
        await wss.remove(b)


async def test_filling_the_size_cap_stops_at_the_cap(wss: Workspaces, spec: WorkspaceSpec) -> None:
    a, b = await wss.create(spec), await wss.create(spec)
    try:
        full = await sh(a, f"dd if=/dev/zero of=big bs=1M count={SIZE_MB * 4} 2>&1; ls -s big")
        assert "No space left on device" in full.stdout, full
        assert int(full.stdout.split()[-2]) <= SIZE_MB * 1024, full
        assert (await sh(b, "echo fine > f && cat f")).stdout == "fine\n"  # another episode is unaffected
        assert (await sh(a, "rm big && echo room > f && cat f")).stdout == "room\n"  # and a recovers
    finally:
        await wss.remove(a)
        await wss.remove(b)


def marked(token: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if token in " ".join(p.info["cmdline"] or []):
            found.append(p.pid)
    return found


async def test_a_kernel_that_forks_leaves_nothing_behind(wss: Workspaces, spec: WorkspaceSpec) -> None:
    token = f"leftover-{os.getpid()}-{time.time_ns()}"
    ws = await wss.create(spec)
    cell = f"""
import os, subprocess
subprocess.Popen(["/bin/sh", "-c", "sleep 1000; : {token}"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 999; : {token}"])
    os._exit(0)
'spawned'
"""
    try:
        assert (await ws.python(cell)).stdout == "'spawned'\n"
        assert (await sh(ws, f"nohup setsid sh -c 'sleep 998; : {token}' >/dev/null 2>&1 & echo started")).ok
        deadline = time.monotonic() + 30
        while len(marked(token)) < 2 and time.monotonic() < deadline:  # the double fork's exec lands after the cell
            await asyncio.sleep(0.05)
        assert len(marked(token)) >= 2  # the kernel's: alive while the episode runs (the shell's ended with its call)
    finally:
        await wss.remove(ws)
    for _ in range(50):
        if not marked(token):
            break
        await asyncio.sleep(0.1)
    assert marked(token) == []


async def test_the_next_episode_from_the_same_state_starts_clean(wss: Workspaces, spec: WorkspaceSpec) -> None:
    first = WorkspaceSession(spec, {"task.txt": "t"}, workspaces=wss)
    bash, python, *_ = workspace_tools(first)
    await bash(command="cd pkg && echo left > left.txt && echo x > /tmp/tmpfile; export LEAK=1; "
                       "mkdir -p /work/.cache && chmod 000 /work/.cache")
    await python(code="import builtins\nbuiltins.leaked = 'yes'\nsecret = 42")
    await first.remove()
    second = WorkspaceSession(spec, {"task.txt": "t"}, workspaces=wss)
    bash2, python2, *_ = workspace_tools(second)
    try:
        out = await bash2(command="pwd; ls -A; ls pkg; test -e /tmp/tmpfile || echo no-tmp; echo leak=${LEAK:-}")
        assert out.content == ("/work\nbase.txt\npkg\nsetup.txt\ntask.txt\nmod.py\nno-tmp\nleak=\n"), out.content
        cell = await python2(code="import builtins\n(hasattr(builtins, 'leaked'), 'secret' in globals())")
        assert cell.content == "(False, False)\n"
    finally:
        await second.remove()


async def test_kernel_limits_and_restarts(wss: Workspaces, spec: WorkspaceSpec, backend: tuple[str, Any]) -> None:
    session = WorkspaceSession(spec, workspaces=wss)
    _, python, *_ = workspace_tools(session)
    try:
        await python(code="kept = 'still here'")
        soft = await python(code="import time\ntime.sleep(60)")
        assert soft.is_error and "CellTimeout" in soft.content
        assert (await python(code="kept")).content == "'still here'\n"  # interrupted, not restarted
        hard = await python(code="import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass")
        assert hard.is_error and "kernel was restarted" in hard.content and "time limit" in hard.content
        assert "NameError" in (await python(code="kept")).content  # a fresh kernel
        big = await python(code=f"x = bytearray({KERNEL_MB * 3} << 20)\nlen(x)")
        assert big.is_error and ("MemoryError" in big.content or "out of memory" in big.content), big.content
        if backend[0] == "bwrap":  # a cgroup per kernel: the OOM killer, reported as such
            assert "out of memory (the kernel's cap is 192 MiB)" in big.content
        crash = await python(code="import os\nos.abort()")
        assert crash.is_error and "the kernel died" in crash.content
        assert (await python(code="1 + 1")).content == "2\n"
    finally:
        await session.remove()


async def test_snapshot_and_restore_rebuild_the_files(wss: Workspaces, spec: WorkspaceSpec) -> None:
    ws = await wss.create(spec, {"task.txt": "t"})
    try:
        assert (await sh(ws, "rm base.txt && mkdir -p d/e && echo 1 > d/e/f && ln -s d/e/f link && chmod 600 task.txt"
                             " && rm -r pkg && mkdir pkg && echo new > pkg/only.py")).ok
        listing = (await sh(ws, "ls -lR --time-style=+ . | sort")).stdout
        digest = await ws.digest()
        snapshot = await ws.snapshot()
    finally:
        await wss.remove(ws)
    restored = await wss.restore(spec, {"task.txt": "t"}, snapshot)
    try:
        assert (await sh(restored, "ls -lR --time-style=+ . | sort")).stdout == listing
        assert await restored.digest() == digest
    finally:
        await wss.remove(restored)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE and "agentrl._reaper" not in " ".join(p.cmdline())
    except psutil.Error:
        return False


OWNER = r"""
import asyncio, json, sys, time
from agentrl.tools.sandbox import SandboxLimits
from agentrl.tools.workspace import Workspaces, WorkspaceSpec

async def main():
    wss = Workspaces(backend_options=json.loads(sys.argv[2]))
    spec = WorkspaceSpec(backend=sys.argv[1], size_mb=8, limits=SandboxLimits(timeout_s=10, memory_mb=128, tmp_mb=8))
    ws = await wss.create(spec)
    await ws.python("import subprocess\np = subprocess.Popen(['/bin/sh', '-c', 'sleep 1000; : %s'])" % sys.argv[3])
    await ws.run("echo started")
    print(json.dumps({"container": getattr(getattr(ws, "container", None), "id", None)}), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_a_killed_owner_leaves_nothing(backend: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    token = f"owner-{os.getpid()}-{time.time_ns()}"
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(OWNER))
    proc = subprocess.Popen([sys.executable, str(script), backend[0], json.dumps(backend[1]), token],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        owned = [p for p in psutil.Process(proc.pid).children(recursive=True)]
        assert marked(token)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the owner's group only: the reaper has a session of its own
        proc.wait()
    for _ in range(150):  # the reaper: SIGTERM, up to 3 s of grace, SIGKILL, then containers and folders
        alive = [p.pid for p in owned if _alive(p)]
        groups = list(Path("/sys/fs/cgroup").glob(f"*/agentrl-sandbox-{proc.pid}-*"))
        if not alive and not marked(token) and not groups:
            break
        await asyncio.sleep(0.1)
    assert not alive and not marked(token) and not groups
    if info["container"]:
        import docker
        from docker.errors import NotFound

        client = docker.DockerClient(base_url=backend[1]["docker"]["docker_host"])
        for _ in range(100):
            try:
                client.containers.get(info["container"])
            except NotFound:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"container {info['container']} outlived its owner")
        client.close()
