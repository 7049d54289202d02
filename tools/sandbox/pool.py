"""A warm pool of long-lived worker processes speaking the framed JSON protocol of ``_worker.py``.

Used by the bwrap and local backends. Each worker serves one execution at a time; the pool hands
idle workers to callers, bounded by a semaphore (the CPU budget), least recently used first (so a
worker has the time to prepare its next execution while the others serve), and replaces a worker
that died, hung, was cancelled mid-call, served ``recycle_after`` executions or whose state after a
call could not be verified clean (``base.retire_reason`` by default, or the caller's ``observe``
check). Everything is asyncio: reads and writes go through the subprocess pipes, waiting never
blocks the event loop.

Worker processes are started in their own session so that killing one (by its process group)
reaches only what the pool started.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.tools.sandbox.base import SandboxUnavailableError, retire_reason
from agentrl.tools.sandbox.cgroups import WorkerCgroup

__all__ = ["Observer", "WorkerLaunch", "WorkerPool", "process_tree_memory"]

READY_TIMEOUT_S = 30.0
GRACE_S = 5.0
EXIT_WAIT_S = 1.0  # how long a worker whose pipe closed gets to finish exiting (its status is reported)


@dataclass
class WorkerLaunch:
    """How to start worker ``index``: its argv, its cgroup (or None) and a hint shown on failure."""

    argv: list[str]
    cgroup: WorkerCgroup | None = None
    hint: str = ""


Observer = Callable[[WorkerLaunch], Callable[[dict[str, Any]], "str | None"]]
"""Called with a worker's launch before a call; returns the check to run on the call's result,
which may amend the result and returns why the worker must be retired (or ``None``)."""


class WorkerError(RuntimeError):
    """The worker died, hung or broke the protocol; it has been killed."""


class _WorkerExited(WorkerError):
    """The worker's end of the pipe closed: it exited (or is exiting) on its own."""


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process, launch: WorkerLaunch) -> None:
        self.proc = proc
        self.launch = launch
        self.calls = 0
        self.info: dict[str, Any] = {}
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self.stopped_by_pool = False  # kill() ended it (a timeout, a cancelled call, a retirement)
        self._stderr_task = asyncio.ensure_future(self._read_stderr())

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                return
            self.stderr_tail.append(line.decode("utf-8", "replace").rstrip())

    async def read_frame(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            head = await self.proc.stdout.readexactly(4)
            body = await self.proc.stdout.readexactly(struct.unpack(">I", head)[0])
        except asyncio.IncompleteReadError as exc:
            raise _WorkerExited("the sandbox worker exited") from exc
        try:
            data = json.loads(body)
        except ValueError as exc:  # a broken frame is the worker's failure, like a crash
            raise WorkerError(f"the sandbox worker sent a frame that is not JSON: {body[:200]!r}") from exc
        if not isinstance(data, dict):
            raise WorkerError(f"the sandbox worker sent {type(data).__name__}, expected an object")
        return data

    async def call(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        body = json.dumps(payload).encode()
        self.calls += 1
        try:
            self.proc.stdin.write(struct.pack(">I", len(body)) + body)
            await self.proc.stdin.drain()
            return await asyncio.wait_for(self.read_frame(), timeout_s)
        except (ConnectionError, BrokenPipeError) as exc:
            raise _WorkerExited("the sandbox worker exited") from exc
        except asyncio.TimeoutError as exc:
            raise WorkerError(f"the sandbox worker did not answer within {timeout_s:.1f} s") from exc

    def describe_failure(self, *, started: bool = False) -> str:
        """The worker's last stderr lines. The launch hint (how to make the sandbox start) is added for a
        worker that never started; one that started and then died says how it ended instead."""
        tail = "\n".join(self.stderr_tail)
        if not started:
            return f"{tail}\n{self.launch.hint}".strip()
        code = self.proc.returncode
        if code is None or self.stopped_by_pool:
            ended = "the pool stopped it"
        elif code < 0:
            try:
                ended = f"it was killed by {signal.Signals(-code).name}"
            except ValueError:
                ended = f"it was killed by signal {-code}"
        else:
            ended = f"it exited with code {code}"
        return f"{ended} after it had started{': ' + tail if tail else ''}"

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.stopped_by_pool = True
            try:  # the worker leads its own session: this reaches it and nothing else
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                # Not proc.kill() in general: Popen.send_signal polls first and would reap the child
                # behind asyncio's child watcher.
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
        await self.proc.wait()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(self._stderr_task, 1.0)


class WorkerPool:
    """``size`` warm workers, at most ``max_concurrency`` executing at once."""

    def __init__(
        self,
        launcher: Callable[[int], WorkerLaunch],
        *,
        size: int,
        max_concurrency: int,
        recycle_after: int = 1000,
        on_release: Callable[[WorkerLaunch], None] | None = None,
    ) -> None:
        if size < 1 or max_concurrency < 1:
            raise ValueError(f"WorkerPool: size and max_concurrency must be >= 1, got {size}, {max_concurrency}")
        self._launcher = launcher
        self.size = size
        self._sem = asyncio.Semaphore(min(size, max_concurrency))
        self._recycle_after = recycle_after
        self._on_release = on_release
        self._idle: collections.deque[_Worker] = collections.deque()
        self._all: set[_Worker] = set()
        self._next_index = 0
        self._started = False
        self._start_lock = asyncio.Lock()
        self._closed = False
        self.replaced = 0
        self.retired: collections.Counter[str] = collections.Counter()
        self.first_info: dict[str, Any] = {}

    async def _spawn(self) -> _Worker:
        index = self._next_index
        self._next_index += 1
        launch = self._launcher(index)
        try:
            proc = await asyncio.create_subprocess_exec(
                *launch.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env={}, start_new_session=True,
            )
        except OSError as exc:
            self._release(launch)
            raise SandboxUnavailableError(f"cannot start {launch.argv[0]!r}: {exc}. {launch.hint}") from exc
        worker = _Worker(proc, launch)
        self._all.add(worker)
        try:
            worker.info = await asyncio.wait_for(worker.read_frame(), READY_TIMEOUT_S)
        except (WorkerError, asyncio.TimeoutError) as exc:
            await self._discard(worker)
            raise SandboxUnavailableError(
                f"the sandbox worker failed to start ({exc}): {worker.describe_failure()}") from exc
        if not self.first_info:
            self.first_info = dict(worker.info)
        return worker

    def _release(self, launch: WorkerLaunch) -> None:
        if self._on_release is not None:
            self._on_release(launch)

    async def _discard(self, worker: _Worker) -> None:
        self._all.discard(worker)
        await worker.kill()
        self._release(worker.launch)

    async def start(self) -> None:
        """Starts the workers (once); raises :class:`SandboxUnavailableError` if they cannot start."""
        async with self._start_lock:
            if self._started:
                return
            results = await asyncio.gather(*(self._spawn() for _ in range(self.size)), return_exceptions=True)
            workers = [r for r in results if isinstance(r, _Worker)]
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                for w in workers:
                    await self._discard(w)
                raise errors[0]
            self._idle.extend(workers)
            self._started = True

    async def execute(self, payload: dict[str, Any], timeout_s: float, observe: Observer | None = None) -> dict[str, Any]:
        """Runs one request on the least recently used idle worker; returns the worker's result.

        Raises :class:`WorkerError` if the worker failed (it is replaced for the next call). A worker
        whose result gives a retire reason (``observe``'s check, else :func:`retire_reason`) is
        replaced too, after its result is returned."""
        await self.start()
        async with self._sem:
            if self._closed:
                raise WorkerError("the sandbox is closed")
            worker = self._idle.popleft() if self._idle else await self._spawn()
            check = observe(worker.launch) if observe is not None else retire_reason
            try:
                result = await worker.call(payload, timeout_s + GRACE_S)
            except BaseException as exc:  # worker failure or cancellation: never reuse a half-used worker
                self.replaced += 1
                if isinstance(exc, _WorkerExited):  # let it finish exiting: its status says how it ended
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(worker.proc.wait()), EXIT_WAIT_S)
                await asyncio.shield(self._discard(worker))
                if isinstance(exc, WorkerError):
                    raise WorkerError(f"{exc}: {worker.describe_failure(started=True)}") from exc
                raise
            reason = check(result)
            if reason is not None:
                self.replaced += 1
                self.retired[reason] += 1
                await asyncio.shield(self._discard(worker))
            elif worker.calls >= self._recycle_after or self._closed:
                await self._discard(worker)
            else:
                self._idle.append(worker)
            return result

    def pids(self) -> list[int]:
        """Host PIDs of the workers' top processes."""
        return [w.proc.pid for w in self._all if w.proc.returncode is None]

    async def close(self) -> None:
        self._closed = True
        workers = list(self._all)
        self._idle.clear()
        for worker in workers:
            await self._discard(worker)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
    except OSError:
        pass
    return out


def process_tree_memory(root_pids: list[int]) -> dict[str, int]:
    """RSS and PSS (bytes) summed over the given processes and all their descendants."""
    totals = {"rss_bytes": 0, "pss_bytes": 0, "processes": 0}
    stack = list(root_pids)
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key in ("Rss", "Pss"):
                        totals[f"{key.lower()}_bytes"] += int(rest.split()[0]) * 1024
        except OSError:
            continue
        totals["processes"] += 1
        stack.extend(_children(pid))
    return totals
