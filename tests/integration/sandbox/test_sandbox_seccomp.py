"""The seccomp filter in the real kernel: blocked calls fail with EPERM, ordinary programs work.

A bwrap pool without the filter (``seccomp=False``) is the control: there the same probes get
other answers, which shows the filter, not a missing capability, is what refuses them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from agentrl.tools.sandbox import Sandbox, create_sandbox
from agentrl.tools.sandbox.bwrap import BwrapSandbox
from agentrl.tools.sandbox.seccomp import blocked_numbers

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

NUMBERS = blocked_numbers()
# Each blocked call with arguments that are harmless (and mostly invalid) when not blocked.
PROBE = """import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
for name, nr in NUMBERS.items():
    args = {"keyctl": (0, -4, 0), "ptrace": (-1, 0, 0, 0)}.get(name, (0, 0, 0, 0, 0))  # not PTRACE_TRACEME
    ret = libc.syscall(nr, *args)
    out[name] = "ok" if ret >= 0 else os.strerror(ctypes.get_errno())
status = open("/proc/self/status").read()
out["Seccomp"] = status.split("Seccomp:")[1].split()[0]
print(json.dumps(out))
"""
ORDINARY = """import asyncio, json, multiprocessing, os, socket, subprocess, sys, threading, time
out = {}
out["subprocess"] = subprocess.run("echo $((6 * 7))", shell=True, capture_output=True, text=True).stdout.strip()
out["exec"] = subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True).stdout.strip()
t = threading.Thread(target=lambda: out.__setitem__("thread", "ran")); t.start(); t.join()
with multiprocessing.Pool(2) as pool:
    out["pool"] = pool.map(abs, [-1, -2, -3])
lock = multiprocessing.Lock()  # a POSIX semaphore in /dev/shm
with lock:
    out["semaphore"] = "held"
async def echo():
    server = await asyncio.start_server(lambda r, w: (w.write(b"pong"), w.close()), "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname())
    data = await reader.read(4)
    writer.close(); server.close()
    return data.decode()
out["asyncio"] = asyncio.run(echo())
out["mmap"] = len(bytearray(64 << 20))
print(json.dumps(out))
"""
NUMPY = """import numpy as np
a = np.random.default_rng(0).standard_normal((300, 300))
print(round(float(np.linalg.eigvalsh(a @ a.T).max()), 3) > 0, np.linalg.solve(np.eye(3) * 2, np.ones(3)).tolist())
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def filtered() -> AsyncIterator[Sandbox]:
    async with create_sandbox("bwrap", pool_size=1, timeout_s=20, memory_mb=512, max_processes=64) as sb:
        yield sb


async def test_blocked_calls_fail_with_eperm(filtered: Sandbox) -> None:
    r = await filtered.run(f"NUMBERS = {NUMBERS!r}\n" + PROBE)
    assert r.ok, r
    seen = json.loads(r.stdout)
    assert seen.pop("Seccomp") == "2"
    assert seen == {name: "Operation not permitted" for name in NUMBERS}, seen
    caps = filtered.capabilities()
    assert "io_uring_setup" in caps.enforced["seccomp"] and caps.scope("seccomp") == "execution"


async def test_without_the_filter_the_same_calls_answer_differently() -> None:
    async with BwrapSandbox(pool_size=1, seccomp=False) as control:
        r = await control.run(f"NUMBERS = {NUMBERS!r}\n" + PROBE)
        caps = control.capabilities()
    seen = json.loads(r.stdout)
    assert seen.pop("Seccomp") == "0"
    assert seen["io_uring_setup"] != "Operation not permitted"  # EFAULT: the call itself was reached
    assert seen["keyctl"] != "Operation not permitted"  # the user keyring's id
    assert "seccomp" in caps.not_enforced and caps.scope("keyrings") == "worker"


async def test_ordinary_programs_work_under_the_filter(filtered: Sandbox) -> None:
    r = await filtered.run(ORDINARY)
    assert r.ok, r
    assert json.loads(r.stdout) == {"subprocess": "42", "exec": "child", "thread": "ran", "pool": [1, 2, 3],
                                    "semaphore": "held", "asyncio": "pong", "mmap": 64 << 20}


async def test_numpy_works_under_the_filter(filtered: Sandbox) -> None:
    has = await filtered.run("import importlib.util\nprint(importlib.util.find_spec('numpy') is not None)")
    if has.stdout.strip() != "True":
        pytest.skip("numpy is not installed for the sandbox's /usr/bin/python3 (apt-get install python3-numpy)")
    r = await filtered.run(NUMPY)
    assert r.ok and r.stdout == "True [0.5, 0.5, 0.5]\n", r
