"""The worker pool's protocol errors, against tiny stand-in worker programs (not the sandbox)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from agentrl.tools.sandbox.base import SandboxUnavailableError
from agentrl.tools.sandbox.pool import WorkerError, WorkerLaunch, WorkerPool

# A worker that says it is ready, then answers every request with ``REPLY`` (one frame).
FAKE_WORKER = """
import struct, sys
out, inp = sys.stdout.buffer, sys.stdin.buffer
def send(body):
    out.write(struct.pack(">I", len(body)) + body); out.flush()
send(READY)
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    inp.read(struct.unpack(">I", head)[0])
    send(REPLY)
"""


def pool_of(ready: bytes, reply: bytes) -> WorkerPool:
    program = f"READY = {ready!r}\nREPLY = {reply!r}\n{FAKE_WORKER}"
    return WorkerPool(lambda index: WorkerLaunch([sys.executable, "-I", "-c", program]), size=1, max_concurrency=1)


async def test_a_reply_that_is_not_json_is_a_worker_error_and_the_worker_is_replaced() -> None:
    pool = pool_of(b'{"ready": true}', b"{not json")
    try:
        with pytest.raises(WorkerError, match="not JSON"):
            await pool.execute({"code": "1"}, timeout_s=5)
        assert pool.replaced == 1
    finally:
        await pool.close()


async def test_a_ready_frame_that_is_not_json_means_the_sandbox_cannot_start() -> None:
    pool = pool_of(b"\xff garbage", b"{}")
    try:
        with pytest.raises(SandboxUnavailableError, match=r"failed to start.*not JSON"):
            await pool.start()
    finally:
        await pool.close()


async def test_a_well_formed_reply_comes_back() -> None:
    pool = pool_of(b'{"ready": true}', b'{"exit_code": 0}')
    try:
        assert await pool.execute({"code": "1"}, timeout_s=5) == {"exit_code": 0}
        assert pool.first_info == {"ready": True}
    finally:
        await pool.close()


# A worker that answers every request with its own PID and the request's "reply" fields.
ECHO_WORKER = """
import json, os, struct, sys
out, inp = sys.stdout.buffer, sys.stdin.buffer
def send(obj):
    body = json.dumps(obj).encode()
    out.write(struct.pack(">I", len(body)) + body); out.flush()
send({"ready": True})
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    req = json.loads(inp.read(struct.unpack(">I", head)[0]))
    send(dict(req.get("reply", {}), pid=os.getpid()))
"""


def echo_pool(size: int) -> WorkerPool:
    return WorkerPool(lambda index: WorkerLaunch([sys.executable, "-I", "-c", ECHO_WORKER]), size=size,
                      max_concurrency=size)


async def test_idle_workers_are_handed_out_least_recently_used_first() -> None:
    pool = echo_pool(2)
    try:
        pids = [(await pool.execute({}, timeout_s=5))["pid"] for _ in range(4)]
        assert pids[0] != pids[1] and pids[:2] == pids[2:]  # a, b, a, b: each gets time to prepare
    finally:
        await pool.close()


@pytest.mark.parametrize(("reply", "reason"), [
    ({"clean": False, "unclean": "/tmp still holds ['x']"}, "not verified clean after the call: /tmp still holds"),
    ({"killed_reason": "memory"}, "the memory limit was hit"),
    ({"error": "setup failed"}, "the sandbox machinery failed"),
])
async def test_a_worker_that_cannot_vouch_for_its_state_is_replaced(reply: dict[str, object], reason: str) -> None:
    pool = echo_pool(1)
    try:
        first = await pool.execute({"reply": reply}, timeout_s=5)
        assert first["pid"] not in pool.pids() and pool.replaced == 1
        assert [r for r in pool.retired if r.startswith(reason)], pool.retired
        second = await pool.execute({"reply": {"clean": True}}, timeout_s=5)
        assert second["pid"] != first["pid"] and second["pid"] in pool.pids()  # kept: it is clean
    finally:
        await pool.close()


async def test_an_observer_can_amend_the_result_and_retire_the_worker() -> None:
    pool = echo_pool(1)

    def observe(launch: WorkerLaunch) -> Callable[[dict[str, Any]], str | None]:
        def check(data: dict[str, Any]) -> str | None:
            data["seen"] = True
            return "observer says no" if data.get("bad") else None
        return check

    try:
        good = await pool.execute({"reply": {}}, timeout_s=5, observe=observe)
        assert good["seen"] and good["pid"] in pool.pids()
        bad = await pool.execute({"reply": {"bad": True}}, timeout_s=5, observe=observe)
        assert bad["pid"] not in pool.pids() and pool.retired == {"observer says no": 1}
    finally:
        await pool.close()


# Ready, then on the first request: exit with code 3, or kill itself with SIGKILL.
DYING_WORKER = """
import os, signal, struct, sys
out, inp = sys.stdout.buffer, sys.stdin.buffer
body = b'{"ready": true}'
out.write(struct.pack(">I", len(body)) + body); out.flush()
inp.read(4)
if HOW == "exit":
    sys.exit(3)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(("how", "ended"), [("exit", "it exited with code 3"), ("kill", "it was killed by SIGKILL")])
async def test_a_worker_dying_mid_call_says_how_it_ended_not_how_to_start_it(how: str, ended: str) -> None:
    program = f"HOW = {how!r}\n{DYING_WORKER}"
    pool = WorkerPool(lambda index: WorkerLaunch([sys.executable, "-I", "-c", program], hint="HOW TO START IT"),
                      size=1, max_concurrency=1)
    try:
        with pytest.raises(WorkerError) as info:
            await pool.execute({"code": "1"}, timeout_s=5)
        assert str(info.value) == f"the sandbox worker exited: {ended} after it had started"
        assert "HOW TO START IT" not in str(info.value) and pool.replaced == 1
    finally:
        await pool.close()


async def test_a_worker_that_never_starts_gets_the_launch_hint() -> None:
    pool = WorkerPool(lambda index: WorkerLaunch([sys.executable, "-I", "-c", "import sys; sys.exit(1)"],
                                                 hint="HOW TO START IT"), size=1, max_concurrency=1)
    try:
        with pytest.raises(SandboxUnavailableError, match=r"failed to start.*HOW TO START IT"):
            await pool.start()
    finally:
        await pool.close()
