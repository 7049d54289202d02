"""Workspaces under attack, part 2: the trainer's secrets, the grader, the kernel's result channel.

Each test runs on bwrap and on Docker (skipped with the reason where no daemon can run), through the
public workspace API and the model's tools only:

- no environment variable of the trainer is readable from any process of a workspace or a sandbox
  (a canary in the trainer's environment, searched for in every readable ``/proc/*/environ``,
  ``/proc/*/cmdline`` and every file a sandbox can reach but the read-only ``/usr``);
- a reward's command cannot be seen or changed by anything the model started: watchers left behind
  by a cell and by a shell that stop the grader and rewrite its hidden tests change nothing in
  ``FixTestEnv``'s reward, and ``Workspace.grade`` runs where none of them exists any more, from
  files the model never could write;
- processes a cell started do not survive a kernel restart;
- a cell that writes its own result frames (oversize, malformed, ill-typed, extra) gets a typed
  result, never an exception, never more than the output cap, and the next cell gets its own result.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psutil
import pytest
import pytest_asyncio

from agentrl.environments.fix_test import FixTestEnv
from agentrl.environments.fix_test_data import make_fix_rows
from agentrl.tools.sandbox import SandboxLimits, create_sandbox
from agentrl.tools.workspace import Workspaces, WorkspaceSession, WorkspaceSpec, workspace_tools

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(300)]

LIMITS = SandboxLimits(timeout_s=20.0, cpu_s=20, memory_mb=256, tmp_mb=16, max_output_bytes=8192)
SECRET_ENV = "AGENTRL_WORKSPACE_TEST_TOKEN"
SECRET = "trainer-secret-" + secrets.token_hex(12)


@pytest.fixture(scope="module", params=["bwrap", "docker"])
def backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    if request.param == "docker":
        return "docker", {"docker": {"docker_host": request.getfixturevalue("docker_host")}}
    return "bwrap", {}


@pytest.fixture(scope="module")
def trainer_secret() -> Any:
    """A secret in the trainer's environment before any holder, kernel or worker starts."""
    os.environ[SECRET_ENV] = SECRET
    yield SECRET
    os.environ.pop(SECRET_ENV, None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def wss(backend: tuple[str, dict[str, Any]], trainer_secret: str) -> AsyncIterator[Workspaces]:
    workspaces = Workspaces(backend_options=backend[1])
    yield workspaces
    await workspaces.close()
    assert workspaces.leftovers() == {"workspaces": 0}


@pytest.fixture(scope="module")
def spec(backend: tuple[str, dict[str, Any]]) -> WorkspaceSpec:
    return WorkspaceSpec(backend=backend[0], size_mb=16, limits=LIMITS, kernel_memory_mb=256, cell_timeout_s=5.0)


def marked(token: str) -> list[int]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if token in " ".join(p.info["cmdline"] or []):
            found.append(p.pid)
    return found


# --------------------------------------------------------------------------- the trainer's secrets

# Searches what this process can read for the secret, which it rebuilds from its reversed form (so
# that neither its own command line nor its source holds it): every /proc/*/environ and cmdline,
# then every file below / but /proc, /sys and the read-only /usr (the host's or the image's).
SCAN = r"""
import os, stat
token = TOKEN[::-1]
found = []
def check(path):
    try:
        with open(path, "rb") as f:
            if token.encode() in f.read(1 << 22):
                found.append(path)
    except OSError:
        pass
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            check(f"/proc/{pid}/{name}")
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                check(f"/proc/{pid}/task/{tid}/environ")
        except OSError:
            pass
for top in sorted(os.listdir("/")):
    if top in ("proc", "sys", "usr") or os.path.islink("/" + top):  # /bin, /lib...: links into /usr
        continue
    for folder, dirs, files in os.walk("/" + top):
        for name in files:
            path = os.path.join(folder, name)
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    check(path)
            except OSError:
                pass
print("visible:", sorted(p for p in os.listdir("/proc") if p.isdigit()), "found:", found)
"""


async def test_no_trainer_secret_reaches_any_process_or_file(wss: Workspaces, spec: WorkspaceSpec,
                                                             backend: tuple[str, dict[str, Any]]) -> None:
    assert os.environ[SECRET_ENV] == SECRET
    scan = SCAN.replace("TOKEN", repr(SECRET[::-1]))
    ws = await wss.create(spec)
    try:
        results = {"kernel": await ws.python(scan),
                   "bash": await ws.run(f"python3 -I - <<'EOF'\n{scan}\nEOF\n"),
                   "bash background": await ws.run("sleep 30 & python3 -I - <<'EOF'\n" + scan + "\nEOF\n")}
        options = backend[1].get(backend[0], {})
        async with create_sandbox(backend[0], pool_size=1, timeout_s=20, memory_mb=256, tmp_mb=16,
                                  **options) as sandbox:
            results["sandbox"] = await sandbox.run(scan)
    finally:
        await wss.remove(ws)
    for where, result in results.items():
        assert "found: []" in result.stdout, (where, result)
        assert SECRET not in result.stdout + result.stderr, where


async def test_a_named_variable_does_reach_the_workspace(wss: Workspaces, spec: WorkspaceSpec) -> None:
    ws = await wss.create(spec.replace(env=(("NAMED", "given"),)))
    try:
        assert (await ws.run("echo $NAMED")).stdout == "given\n"
        assert (await ws.python("import os\nos.environ.get('NAMED')")).stdout == "'given'\n"
    finally:
        await wss.remove(ws)


# --------------------------------------------------------------------------- the grader

# A watcher the model leaves behind. It follows /tmp with inotify. The moment a grader's folder
# appears there, it stops every process that looks like a grader (a python reading its program from
# stdin, or anything with "grade" in its command line) and plants in that folder a compiled
# test_hidden module that Python loads without looking at the source (an unchecked hash-based .pyc),
# holding as many passing tests as the grader's script (readable in /tmp) has hidden ones; then it
# lets the grader go on. It also rewrites hidden tests it sees written, and any under /grader, /work
# or /dev/shm.
WATCHER = r"""
import ctypes, importlib.util, os, re, select, signal, struct, sys, time
from importlib._bootstrap_external import _code_to_hash_pyc
end = time.time() + WAIT
me = os.getpid()
log = open("/work/.watch.log", "a")
libc = ctypes.CDLL(None, use_errno=True)
IN_CLOSE_WRITE, IN_CREATE, IN_ISDIR = 0x8, 0x100, 0x40000000
ino = libc.inotify_init1(0)
folders = {libc.inotify_add_watch(ino, b"/tmp", IN_CREATE | IN_CLOSE_WRITE): "/tmp"}
def note(text):
    log.write(text + "\n")
    log.flush()
def graders():
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if cmd.startswith(b"python3\0-I\0-\0") or b"grade" in cmd.lower():
            out.append(int(pid))
    return out
def hidden_count():  # from the scripts the sandbox worker writes into /tmp (the grader's among them)
    found = 0
    for name in os.listdir("/tmp"):
        if name.startswith(".cell"):
            try:
                found = max(found, open(os.path.join("/tmp", name), errors="replace").read().count("def test_"))
            except OSError:
                pass
    return found or 3
def passing(n):
    return ("import unittest\nclass T(unittest.TestCase):\n"
            + "".join(f"    def test_{i}(self): pass  # TAMPERED\n" for i in range(n)))
def plant(folder):
    source = passing(hidden_count()).encode()
    data = _code_to_hash_pyc(compile(source, "test_hidden.py", "exec"), importlib.util.source_hash(source), False)
    try:
        os.makedirs(f"{folder}/__pycache__", exist_ok=True)
        with open(f"{folder}/__pycache__/test_hidden.{sys.implementation.cache_tag}.pyc", "wb") as f:
            f.write(data)
        note(f"planted in {folder}")
    except OSError as exc:
        note(f"failed {folder}: {exc}")
def tamper(path):
    try:
        source = open(path).read()
        if "TAMPERED" in source:
            return
        with open(path, "w") as f:
            f.write(passing(len(re.findall(r"def test_", source))))
        note(f"tampered {path}")
    except OSError as exc:
        note(f"failed {path}: {exc}")
def signal_all(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass
note("watching")
while time.time() < end:
    for top in ("/grader", "/work", "/dev/shm"):
        for folder, dirs, files in os.walk(top):
            for name in files:
                if name.startswith("test_hidden") and name.endswith(".py"):
                    tamper(os.path.join(folder, name))
    if not select.select([ino], [], [], 0.2)[0]:
        continue
    data = os.read(ino, 65536)
    pos = 0
    while pos < len(data):
        wd, mask, _, size = struct.unpack_from("iIII", data, pos)
        name = data[pos + 16:pos + 16 + size].rstrip(b"\0").decode(errors="replace")
        pos += 16 + size
        path = os.path.join(folders.get(wd, "/tmp"), name)
        if mask & IN_CREATE and mask & IN_ISDIR:
            pids = graders()
            signal_all(pids, signal.SIGSTOP)
            folders[libc.inotify_add_watch(ino, path.encode(), IN_CREATE | IN_CLOSE_WRITE)] = path
            plant(path)
            signal_all(pids, signal.SIGCONT)
        elif mask & IN_CLOSE_WRITE and name.startswith("test_hidden") and name.endswith(".py"):
            pids = graders()
            signal_all(pids, signal.SIGSTOP)
            tamper(path)
            signal_all(pids, signal.SIGCONT)
"""


async def watching(log: Callable[[], Awaitable[str]], count: int) -> str:
    """Waits until ``count`` watchers follow ``/tmp`` (each notes it in ``/work/.watch.log``)."""
    text = ""
    for _ in range(100):
        text = await log()
        if text.count("watching") >= count:
            return text
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} watcher(s) expected, the log holds: {text!r}")


async def until(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Polls ``check`` every 0.1 s for up to ``seconds``; its last answer."""
    for _ in range(int(seconds * 10)):
        if check():
            return True
        await asyncio.sleep(0.1)
    return check()


def watcher_cell(token: str, wait_s: float = 90.0) -> str:
    program = WATCHER.replace("WAIT", repr(wait_s))
    return (f"import os, subprocess, sys\nsource = {program!r}\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv('/usr/bin/python3', ['python3', '-c', source, {token!r}])\n    os._exit(0)\n"
            "os.wait()\n'watching'\n")


async def test_leftover_watchers_cannot_change_the_fix_test_reward(wss: Workspaces,
                                                                   backend: tuple[str, dict[str, Any]]) -> None:
    row = make_fix_rows(1, seed=7)[0]
    env = FixTestEnv(row, backend=backend[0])
    assert env.workspace_session is not None
    env.workspace_session._workspaces = wss
    bash, python, *_ = workspace_tools(env.workspace_session)
    token = f"watcher-{time.time_ns()}"
    try:
        assert (await python(code=watcher_cell(token))).content == "'watching'\n"
        script = WATCHER.replace("WAIT", "90.0")
        started = await bash(command=f"cat > /tmp/w.py <<'EOF'\n{script}\nEOF\n"
                                     f"setsid nohup python3 /tmp/w.py {token} >/dev/null 2>&1 & echo ok")
        assert started.content == "ok\n", started

        async def log() -> str:
            return (await bash(command="cat /work/.watch.log 2>/dev/null; true")).content

        # bwrap ends what a command left running with its call: the cell's watcher stays there
        await watching(log, 2 if backend[0] == "docker" else 1)
        reward = await env.reward(None)  # type: ignore[arg-type]  # the reward does not read the trajectory
        text = await log()
        # the bug is not fixed: only tampered hidden tests could pass
        assert reward.value == 0.0, (reward, text)
        assert reward.info.get("tests_run") == row["hidden_count"], reward
    finally:
        await env.close()
    assert await until(lambda: not marked(token), 5.0), marked(token)


async def test_grade_runs_where_nothing_the_model_started_exists(wss: Workspaces, spec: WorkspaceSpec) -> None:
    token = f"grade-watch-{time.time_ns()}"
    ws = await wss.create(spec)
    try:
        assert (await ws.python(watcher_cell(token))).stdout == "'watching'\n"
        assert (await ws.run("echo model > answer.txt; sleep 1000 & echo ok")).ok

        async def log() -> str:
            return (await ws.run("cat /work/.watch.log 2>/dev/null; true")).stdout

        await watching(log, 1)
        hidden = "import unittest\nclass TestHidden(unittest.TestCase):\n    def test_0(self):\n        self.fail()\n"
        graded = await ws.grade(
            "cat /work/answer.txt; ls /grader; ps -eo pid,args --no-headers | grep -v 'ps -eo' | wc -l; "
            "echo x > /grader/test_hidden.py 2>/dev/null || echo read-only; touch /work/graded && echo writable; "
            "cd /grader && python3 -m unittest -q test_hidden 2>&1 | tail -n 1",
            files={"test_hidden.py": hidden})
        lines = graded.stdout.splitlines()
        assert lines[:2] == ["model", "test_hidden.py"], graded
        assert int(lines[2]) <= 4, graded  # the grader's own shell, pipeline and init: no leftover of the model
        assert lines[3:5] == ["read-only", "writable"], graded
        assert lines[5] == "FAILED (failures=1)", graded
        assert marked(token) == []  # the cell's watcher is gone
    finally:
        await wss.remove(ws)


async def test_cell_processes_do_not_survive_a_kernel_restart(wss: Workspaces, spec: WorkspaceSpec) -> None:
    token = f"restart-{time.time_ns()}"
    ws = await wss.create(spec)
    cell = f"""
import os, subprocess
subprocess.Popen(["/bin/sh", "-c", "sleep 1000; : {token}"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 999; : {token}"])
    os._exit(0)
os.wait()
'spawned'
"""
    try:
        for restart in ("import os\nos.abort()",
                        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass"):
            assert (await ws.python(cell)).stdout == "'spawned'\n"
            assert await until(lambda: len(marked(token)) == 2), marked(token)
            died = await ws.python(restart)
            assert died.restarted, died
            assert await until(lambda: not marked(token), 3.0), (restart, marked(token))
            assert (await ws.python("1 + 1")).stdout == "2\n"
    finally:
        await wss.remove(ws)


# --------------------------------------------------------------------------- the kernel's result channel

def forging_cell(frame: bytes, copies: int = 1) -> str:
    """A cell that writes ``frame`` (with its 4-byte length) to every pipe or socket it holds."""
    return f"""
import os, stat, struct
frame = {frame!r}
for fd in range(3, 1024):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        for _ in range({copies}):
            try:
                os.write(fd, struct.pack(">I", len(frame)) + frame)
            except OSError:
                pass
'forged'
"""


def result_frame(stdout: bytes, **fields: Any) -> bytes:
    import json

    body = {"stdout": base64.b64encode(stdout).decode(), "stderr": "", "stdout_bytes": len(stdout),
            "stderr_bytes": 0, "exception": None, "timed_out": False, "duration_s": 0.0, **fields}
    return json.dumps(body).encode()


async def test_a_cell_cannot_forge_the_kernels_results(wss: Workspaces, spec: WorkspaceSpec) -> None:
    session = WorkspaceSession(spec, workspaces=wss)
    _, python, *_ = workspace_tools(session)
    cap = spec.limits.max_output_bytes
    forged = {
        "oversize": result_frame(b"A" * (12 << 20)),
        "malformed": b"{not json",
        "ill-typed": b'{"stdout": 5, "stderr": [], "stdout_bytes": "x", "stderr_bytes": null}',
        "not an object": b"[1, 2, 3]",
        "extra": result_frame(b"forged output\n"),
    }
    try:
        for i, (name, frame) in enumerate(forged.items()):
            result = await python(code=forging_cell(frame, copies=3 if name == "extra" else 1))
            assert len(result.content) <= 4000 + 200, (name, len(result.content))
            assert "forged output" not in result.content and "AAAA" not in result.content, (name, result.content[:300])
            cell = await session.workspace.python(forging_cell(frame)) if session.workspace else None
            assert cell is not None and len(cell.stdout) <= cap + 200 and len(cell.stderr) <= cap + 200, name
            for k in range(3):  # the next cells answer for themselves: no shifted result
                answer = await python(code=f"{i * 10 + k} + 1")
                assert answer.content == f"{i * 10 + k + 1}\n", (name, k, answer)
    finally:
        await session.remove()

