"""The host's side of a workspace's Python kernel: send a cell, read its result, restart after a crash.

:class:`Kernel` drives one kernel program (``_kernel.py``) through a :class:`KernelChannel` that a
backend opens (a bwrap sandbox's pipes, a Docker exec's socket). Variables persist across cells.
Limits: ``timeout_s`` per cell (the kernel interrupts the cell itself; one that does not stop within
``GRACE_S`` more is killed with the kernel) and the backend's memory cap per kernel. A kernel that
dies (a crash, the memory cap, a kill at the hard deadline) is replaced by a fresh one at the next
cell, and the cell that saw it die says so in :attr:`CellResult.restarted`: the model is told its
variables are gone.

The channel is read defensively although no cell can write on it (the kernel's supervisor holds it;
see ``_kernel.py``): each cell carries a fresh nonce that its answer must echo, a frame longer than
what ``max_output_bytes`` allows is refused from its length alone (never read), and an answer whose
fields are not what the protocol says is refused. Each of these ends the kernel (it is restarted)
and gives a :class:`CellResult` saying so: never an exception, never more than the cap in memory.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import secrets
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agentrl.tools.sandbox.base import decode_output
from agentrl.tools.workspace.base import CellResult

__all__ = ["GRACE_S", "Kernel", "KernelBroken", "KernelChannel", "KernelDied", "frame_cap"]

GRACE_S = 2.0
READY_TIMEOUT_S = 30.0
READY_CAP = 4096


class KernelDied(Exception):
    """The kernel's channel closed or broke: it is gone."""


class KernelBroken(KernelDied):
    """The kernel answered with something that is not an answer to this cell (too long, not the
    protocol's fields, another cell's nonce): it is ended and restarted."""


def frame_cap(max_output_bytes: int) -> int:
    """The longest answer frame a kernel may send for ``max_output_bytes`` per stream: both streams
    base64-encoded, plus the other fields."""
    return 2 * 4 * ((max_output_bytes + 2) // 3) + 4096


class KernelChannel(Protocol):
    """A started kernel program's framed channel (see ``_kernel.py``)."""

    pid: int | None

    async def send(self, data: bytes) -> None: ...

    async def read_exact(self, n: int) -> bytes: ...

    async def kill(self) -> str:
        """Kills the kernel (if alive) and returns how it ended (e.g. ``killed by SIGKILL``)."""
        ...


async def read_frame(channel: KernelChannel, cap: int) -> dict[str, Any]:
    """One frame of at most ``cap`` bytes (a longer one is refused from its length, unread)."""
    head = await channel.read_exact(4)
    size = struct.unpack(">I", head)[0]
    if size > cap:
        raise KernelBroken(f"the kernel sent a frame of {size} bytes, more than the {cap} its output cap allows")
    body = await channel.read_exact(size)
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise KernelBroken(f"the kernel sent a frame that is not JSON: {body[:120]!r}") from exc
    if not isinstance(data, dict):
        raise KernelBroken(f"the kernel sent {type(data).__name__}, expected an object")
    return data


def _stream(data: dict[str, Any], name: str, cap: int) -> tuple[str, bool]:
    """Stream ``name`` of an answer, decoded and checked: base64 of at most ``cap`` bytes, and a total
    size no smaller than that."""
    raw, total = data.get(name), data.get(f"{name}_bytes")
    if not isinstance(raw, str) or isinstance(total, bool) or not isinstance(total, int):
        raise KernelBroken(f"the kernel's answer has no valid {name!r}")
    try:
        decoded = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KernelBroken(f"the kernel's {name!r} is not base64") from exc
    if len(decoded) > cap or total < len(decoded):
        raise KernelBroken(f"the kernel's {name!r} holds {len(decoded)} bytes of {total}, over the cap of {cap}")
    return decode_output(decoded, total)


class Kernel:
    """One workspace's kernel (see the module doc). ``start`` opens a new kernel's channel;
    ``oom`` says whether the backend saw the memory cap hit since the kernel started."""

    def __init__(self, start: Callable[[], Awaitable[KernelChannel]], *, timeout_s: float, max_output_bytes: int,
                 memory_mb: int, oom: Callable[[], bool] | None = None) -> None:
        self._start = start
        self.timeout_s = timeout_s
        self.max_output_bytes = max_output_bytes
        self.memory_mb = memory_mb
        self._oom = oom
        self.channel: KernelChannel | None = None
        self.restarts = 0
        self.info: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return self.channel.pid if self.channel is not None else None

    async def _ensure(self) -> KernelChannel:
        if self.channel is None:
            channel = await self._start()
            try:
                self.info = await asyncio.wait_for(read_frame(channel, READY_CAP), READY_TIMEOUT_S)
            except (KernelDied, asyncio.TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                ended = await channel.kill()
                raise KernelDied(f"the kernel did not start ({type(exc).__name__}: {exc}; {ended})") from exc
            if channel.pid is None:  # a channel that only knows the kernel's PID from its own report
                channel.pid = int(self.info.get("pid") or 0) or None
            self.channel = channel
        return self.channel

    async def run(self, code: str, timeout_s: float | None = None) -> CellResult:
        """Runs one cell; a dead kernel is restarted for the next one (see the module doc)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        async with self._lock:
            started = time.monotonic()
            channel = await self._ensure()
            nonce = secrets.token_hex(8)
            body = json.dumps({"code": code, "timeout_s": timeout, "max_output_bytes": self.max_output_bytes,
                               "nonce": nonce}).encode()
            try:
                await channel.send(struct.pack(">I", len(body)) + body)
                data = await asyncio.wait_for(read_frame(channel, frame_cap(self.max_output_bytes)), timeout + GRACE_S)
                if data.get("nonce") != nonce:
                    raise KernelBroken("the kernel answered for another cell")
                if "died" in data or "broken" in data:
                    raise (KernelDied if "died" in data else KernelBroken)(str(data.get("died") or data.get("broken")))
                stdout, cut_out = _stream(data, "stdout", self.max_output_bytes)
                stderr, cut_err = _stream(data, "stderr", self.max_output_bytes)
            except asyncio.TimeoutError:
                await self._discard()
                return CellResult("", "", timed_out=True, duration_s=time.monotonic() - started,
                                  restarted=f"the cell did not stop at its time limit of {timeout:g} s, so the "
                                            "kernel was killed")
            except (KernelDied, OSError, asyncio.IncompleteReadError, ConnectionError) as exc:
                oom = self._oom is not None and self._oom()  # read before the kill releases its cgroup
                ended = await self._discard()
                if isinstance(exc, KernelBroken):
                    return CellResult("", "", exception="KernelBroken", duration_s=time.monotonic() - started,
                                      restarted=f"the kernel's result channel broke ({exc})")
                why = f"out of memory (the kernel's cap is {self.memory_mb} MiB)" if oom else ended
                detail = f": {exc}" if isinstance(exc, KernelDied) else ""
                return CellResult("", "", exception="KernelDied", duration_s=time.monotonic() - started,
                                  restarted=f"the kernel died ({why}){detail}")
            except BaseException:
                await asyncio.shield(self._discard())
                raise
        exception = data.get("exception")
        return CellResult(stdout, stderr, exception=exception[:200] if isinstance(exception, str) else None,
                          timed_out=data.get("timed_out") is True, duration_s=time.monotonic() - started,
                          truncated=cut_out or cut_err)

    async def _discard(self) -> str:
        channel, self.channel = self.channel, None
        self.restarts += 1
        return await channel.kill() if channel is not None else "gone"

    async def close(self) -> None:
        """Stops the kernel (the next cell would start a new one)."""
        channel, self.channel = self.channel, None
        if channel is not None:
            await channel.kill()
