"""Hostile programs, each contained on both the bwrap and the Docker backend.

One pool per backend serves the whole suite (pool size 1, so every program runs in the same worker
or container as the previous ones). After every program: the host canaries are untouched, the pool
still answers, and no process of the program remains. At teardown nothing of the sandbox remains.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from sandbox_canaries import CANARY_ENV, HostCanaries

from agentrl.tools.fleet import FleetSandbox
from agentrl.tools.sandbox import ExecResult, Sandbox, create_sandbox
from agentrl.tools.sandbox.base import WORKER_SOURCE
from agentrl.tools.sandbox.bwrap import BwrapSandbox
from agentrl.tools.sandbox.docker import DockerSandbox
from agentrl.tools.sandbox.pool import process_tree_memory

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TIMEOUT_S = 3.0
CPU_S = 2
OUTPUT_CAP = 16384
# An idle bwrap worker that has served a call is 6 processes: bwrap, bwrap's init, the worker's
# waiter, the worker, and the next execution's prepared PID 1 and program process.
IDLE_BWRAP_PROCESSES = 6


@dataclass(frozen=True)
class Case:
    id: str
    code: str
    check: Callable[[ExecResult, HostCanaries], Any]
    language: str = "python"


def failed(*exceptions: str) -> Callable[[ExecResult, HostCanaries], None]:
    """The program must not succeed; if it raised, the exception must be one of ``exceptions``."""

    def check(r: ExecResult, c: HostCanaries) -> None:
        assert not r.ok, r
        if exceptions and r.claimed_exception is not None:
            assert r.claimed_exception in exceptions, r
    return check


def killed(*reasons: str) -> Callable[[ExecResult, HostCanaries], None]:
    def check(r: ExecResult, c: HostCanaries) -> None:
        assert r.killed_reason in reasons or r.claimed_exception in ("MemoryError", "BlockingIOError", "RuntimeError"), r
        assert r.duration_s < TIMEOUT_S + 5, r
    return check


def stdout_is(expected: str) -> Callable[[ExecResult, HostCanaries], None]:
    def check(r: ExecResult, c: HostCanaries) -> None:
        assert r.ok and r.stdout.strip() == expected, r
    return check


def no_host_traffic(r: ExecResult, c: HostCanaries) -> None:
    assert not c.tcp_hits and not c.udp_hits, (c.tcp_hits, c.udp_hits, r)


def tcp_refused(r: ExecResult, c: HostCanaries) -> None:
    failed("ConnectionRefusedError", "OSError", "TimeoutError")(r, c)
    no_host_traffic(r, c)


def host_path_absent(path: str) -> Callable[[ExecResult, HostCanaries], None]:
    def check(r: ExecResult, c: HostCanaries) -> None:
        assert not r.ok, r
        assert not os.path.exists(c.fill(path)), c.fill(path)
    return check


def env_clean(r: ExecResult, c: HostCanaries) -> None:
    assert r.ok, r
    keys = set(eval(r.stdout))  # the program prints sorted(os.environ)
    assert keys <= {"PATH", "HOME", "LANG", "PWD", "HOSTNAME"}, keys
    assert CANARY_ENV not in keys


def ptrace_denied(r: ExecResult, c: HostCanaries) -> None:
    assert r.ok, r
    assert all(v == "-1" for v in r.stdout.split()), r


def flood_capped(r: ExecResult, c: HostCanaries) -> None:
    assert r.truncated, r
    assert len(r.stdout.encode()) <= OUTPUT_CAP + 200, len(r.stdout)
    assert "output truncated" in r.stdout


def binary_flood(r: ExecResult, c: HostCanaries) -> None:
    assert r.ok and r.truncated and r.stdout_bytes >= 20 << 20, r.stdout_bytes
    assert len(r.stdout) <= OUTPUT_CAP + 200


def timed_out(r: ExecResult, c: HostCanaries) -> None:
    assert r.timed_out and r.killed_reason == "timeout", r
    assert TIMEOUT_S <= r.duration_s < TIMEOUT_S + 3, r.duration_s


def anything_but_host_harm(r: ExecResult, c: HostCanaries) -> None:
    assert os.getppid() > 0  # the test process and its parent are alive; the pool check follows


def non_utf8(r: ExecResult, c: HostCanaries) -> None:
    assert r.ok and "abc" in r.stdout and "\ufffd" in r.stdout and "\ufffd" in r.stderr, r


PTRACE = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for pid in (os.getppid() or 1, 1, HOSTPID):
    print(libc.ptrace(16, pid, 0, 0))
"""
FORK_BOMB = """import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
DOUBLE_FORK = """import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(300)
    os._exit(0)
print("daemonized")
"""
THREAD_BOMB = """import threading, time
threads = []
while True:
    t = threading.Thread(target=time.sleep, args=(100,))
    t.start()
    threads.append(t)
"""
SCAN_ENVIRON = """import os
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            print(p, open(f"/proc/{p}/environ", "rb").read())
        except OSError as e:
            print(p, e)
"""

CASES = [
    Case("dns_lookup", 'import socket\nsocket.getaddrinfo("deb.debian.org", 80)', failed("gaierror")),
    Case("tcp_external", 'import socket\nsocket.create_connection(("151.101.2.132", 80), timeout=2)',
         failed("OSError", "TimeoutError")),
    Case("tcp_host_loopback", 'import socket\nsocket.create_connection(("127.0.0.1", TCPPORT), timeout=2).recv(9)',
         tcp_refused),
    Case("udp_host_loopback", 'import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n'
         's.sendto(b"ping", ("127.0.0.1", UDPPORT))\nimport time; time.sleep(0.3)', no_host_traffic),
    Case("raw_socket", "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)",
         failed("PermissionError")),
    Case("packet_socket", "import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW)", failed("PermissionError")),
    Case("interfaces", "import socket\nprint(sorted(n for _, n in socket.if_nameindex()))", stdout_is("['lo']")),
    Case("read_project_file", 'print(open("PROJECT/pyproject.toml").read())', failed("FileNotFoundError")),
    Case("list_project_dir", 'import os\nprint(os.listdir("PROJECT"))', failed("FileNotFoundError")),
    Case("list_root_home", 'import os\nprint(os.listdir("/root"))', failed("FileNotFoundError", "PermissionError")),
    Case("read_etc_shadow", 'print(open("/etc/shadow").read())', failed("FileNotFoundError", "PermissionError")),
    Case("read_proc1_environ", 'print(open("/proc/1/environ", "rb").read())', anything_but_host_harm),
    Case("environ_dump", "import os\nprint(sorted(os.environ))", env_clean),
    Case("scan_proc_environ", SCAN_ENVIRON, anything_but_host_harm),
    Case("signal_host_pid", "import os\nos.kill(HOSTPID, 0)", failed("ProcessLookupError", "PermissionError")),
    Case("write_usr", 'open("/usr/lib/agentrl-NONCE", "w").write("x")',
         host_path_absent("/usr/lib/agentrl-NONCE")),
    Case("write_project", 'open("PROJECT/PWNED-NONCE", "w").write("x")', host_path_absent("PROJECT/PWNED-NONCE")),
    Case("write_worker_program", 'open("/opt/agentrl/worker.py", "a").write("#")', failed()),
    Case("write_tmp_then_check_fresh", 'open("/tmp/leftover-NONCE", "w").write("x")\nprint("written")',
         stdout_is("written")),
    Case("tmp_is_fresh", 'import os\nprint(sorted(os.listdir("/tmp")))', stdout_is("[]")),
    Case("fill_tmp", 'open("/tmp/big", "wb").write(b"0" * (100 << 20))', failed("OSError", "MemoryError")),
    Case("fork_bomb", FORK_BOMB, killed("timeout", "cpu_time", "memory", "signal")),
    Case("thread_bomb", THREAD_BOMB, killed("timeout", "cpu_time", "memory", "signal")),
    Case("memory_bomb_alloc", "b = bytearray(2 << 30)", killed("memory")),
    Case("memory_bomb_grow", "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))", killed("memory")),
    Case("cpu_spin", "while True:\n    pass", killed("cpu_time", "timeout")),
    Case("output_flood", 'while True:\n    print("x" * 1000)', flood_capped),
    Case("stderr_flood", 'import sys\nwhile True:\n    sys.stderr.write("y" * 1000)',
         lambda r, c: (r.truncated and len(r.stderr.encode()) <= OUTPUT_CAP + 200) or pytest.fail(repr(r))),
    Case("binary_flood", 'import sys\nsys.stdout.buffer.write(b"\\xff" * (20 << 20))', binary_flood),
    Case("sleep_past_timeout", "import time\ntime.sleep(60)", timed_out),
    Case("close_stdio_and_hang", "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(60)", timed_out),
    Case("kill_parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('parent killed')",
         anything_but_host_harm),
    Case("kill_pid1", "import os, signal\nos.kill(1, signal.SIGKILL)", anything_but_host_harm),
    Case("kill_everything", "import os, signal\nos.kill(-1, signal.SIGKILL)", anything_but_host_harm),
    Case("ptrace", PTRACE, ptrace_denied),
    Case("background_process", 'import subprocess\nsubprocess.Popen(["sleep", "300"], start_new_session=True)\n'
         'print("left behind")', stdout_is("left behind")),
    Case("double_fork_daemon", DOUBLE_FORK, stdout_is("daemonized")),
    Case("bash_background", "nohup sleep 300 >/dev/null 2>&1 &\necho started", stdout_is("started"), "bash"),
    Case("non_utf8_output", 'import sys\nsys.stdout.buffer.write(b"\\xff\\xfe\\x80 abc\\n")\n'
         'sys.stderr.buffer.write(b"\\xc3\\x28\\n")', non_utf8),
    Case("deep_recursion", "def f(n):\n    return f(n + 1)\nf(0)", failed("RecursionError")),
    Case("c_stack_overflow", "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)",
         failed("RecursionError", "MemoryError")),
    Case("huge_argument_list", 'import subprocess\nsubprocess.run(["/bin/true"] + ["x" * 100000] * 200)',
         failed("OSError")),
    Case("huge_program", "x = '" + "a" * 300_000 + "'\nprint(len(x))", stdout_is("300000")),
    Case("setuid_root", "import os\nos.setuid(0)", failed("PermissionError", "OSError")),
    Case("mount_tmpfs", 'import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n'
         'print(libc.mount(b"tmpfs", b"/usr", b"tmpfs", 0, None))', stdout_is("-1")),
    Case("new_user_namespace", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
         "print(libc.unshare(0x10000000))", stdout_is("-1")),
    Case("fd_exhaustion", 'files = [open("/dev/null") for _ in range(100000)]', failed("OSError")),
    Case("sysrq_trigger", 'open("/proc/sysrq-trigger", "w").write("h")',
         failed("PermissionError", "OSError", "FileNotFoundError")),
    Case("read_dev_mem", 'open("/dev/mem", "rb").read(16)', failed("PermissionError", "FileNotFoundError", "OSError")),
    Case("stop_self", "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\nprint('resumed')",
         lambda r, c: r.duration_s < TIMEOUT_S + 3 or pytest.fail(repr(r))),
]
assert len(CASES) >= 30


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["bwrap", "docker"])
async def hostile_sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    options: dict[str, Any] = {}
    if request.param == "docker":
        options["docker_host"] = request.getfixturevalue("docker_host")
    request.getfixturevalue("canaries")  # the secret must be in the environment before workers start
    sandbox = create_sandbox(request.param, pool_size=1, timeout_s=TIMEOUT_S, cpu_s=CPU_S, memory_mb=256,
                             max_processes=32, max_output_bytes=OUTPUT_CAP, tmp_mb=16, **options)
    await sandbox.start()
    cgroup_dirs = sandbox.cgroup_dirs() if isinstance(sandbox, BwrapSandbox) else []
    yield sandbox
    await sandbox.close()
    await assert_nothing_left(sandbox, cgroup_dirs)


async def assert_nothing_left(sandbox: Sandbox, cgroup_dirs: list[str]) -> None:
    if isinstance(sandbox, BwrapSandbox):
        assert sandbox.worker_pids() == []
        assert [d for d in cgroup_dirs if os.path.exists(d)] == []
    elif isinstance(sandbox, DockerSandbox):
        assert sandbox.container_ids() == []


async def assert_clean(sandbox: Sandbox) -> None:
    """No process of a program remains: idle workers have their fixed shape, containers only PID 1. (A
    sandbox fleet's: its executors' bwrap workers, on this host: test_fleet_hostile_sandbox.py.)"""
    if isinstance(sandbox, BwrapSandbox | FleetSandbox):
        pids = sandbox.worker_pids() if isinstance(sandbox, BwrapSandbox) else await sandbox.worker_pids()
        assert pids, "the pool lost its worker"
        for _ in range(40):  # the next execution's PID 1 and process are being set up: allow them 2 s
            count = process_tree_memory(pids)["processes"]
            if count == IDLE_BWRAP_PROCESSES * len(pids):
                break
            await asyncio.sleep(0.05)
        assert count == IDLE_BWRAP_PROCESSES * len(pids), count
    elif isinstance(sandbox, DockerSandbox):
        # The exec'd runner itself may still be exiting when its output stream closes: allow it 2 s.
        for _ in range(20):
            containers = await sandbox.container_processes()
            if all(len(procs) == 1 for procs in containers.values()):
                break
            await asyncio.sleep(0.1)
        for cid, procs in containers.items():
            assert len(procs) == 1, (cid, procs)  # only PID 1, the reaper


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_hostile_program_is_contained(hostile_sandbox: Sandbox, canaries: HostCanaries, case: Case) -> None:
    worker_hash = hashlib.sha256(WORKER_SOURCE.read_bytes()).hexdigest()
    result = await hostile_sandbox.run(canaries.fill(case.code), language=case.language)
    case.check(result, canaries)
    assert canaries.token not in result.stdout + result.stderr, result
    assert hashlib.sha256(WORKER_SOURCE.read_bytes()).hexdigest() == worker_hash
    follow_up = await hostile_sandbox.run("print(6 * 7)")
    assert follow_up.ok and follow_up.stdout == "42\n", follow_up
    await assert_clean(hostile_sandbox)


async def test_pool_serves_after_the_suite(hostile_sandbox: Sandbox) -> None:
    results = [await hostile_sandbox.run(f"print({i} ** 2)") for i in range(5)]
    assert [r.stdout for r in results] == [f"{i ** 2}\n" for i in range(5)]
    await assert_clean(hostile_sandbox)
