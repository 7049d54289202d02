"""The worker pool's protocol errors, against tiny stand-in worker programs (not the sandbox)."""

from __future__ import annotations

import sys

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
