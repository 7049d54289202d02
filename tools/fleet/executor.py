"""One executor of a sandbox fleet: the existing sandbox pools and workspace host, on one node.

:class:`SandboxExecutor` is a plain asyncio object; a fleet runs it inside a Ray actor
(:class:`ExecutorActor`) on a node that carries the fleet's resource, and the router
(:class:`~agentrl.tools.fleet.router.Fleet`) calls it. Nothing here isolates code itself: stateless
calls go to a warm pool built by :func:`~agentrl.tools.sandbox.create_sandbox` (one per backend,
limits and backend options, ``concurrency`` workers, started with a time-out and retried), and
workspaces to a :class:`~agentrl.tools.workspace.Workspaces` of the executor's own, so tool results,
limits and the hostile-input guarantees are those of the local classes. A workspace is named by an
id the executor hands out; every later call on it names that id.

The actor returns each result as a value, an exception included (:class:`Outcome`), so the typed
exceptions of the sandbox and the workspaces reach the caller as they were raised. If the actor's
process dies (its node lost, a crash), what it started goes with it: bubblewrap sandboxes die with
their parent and the reaper (:mod:`agentrl._reaper`) removes holders, kernels and folders.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrl.tools.fleet.errors import ExecutorUnavailableError
from agentrl.tools.sandbox import (
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailableError,
    create_sandbox,
)
from agentrl.tools.workspace.base import Workspace, WorkspaceError, WorkspaceSpec
from agentrl.tools.workspace.manager import Workspaces

__all__ = ["WORKSPACE_METHODS", "ExecutorActor", "ExecutorSettings", "Outcome", "SandboxExecutor"]

WORKSPACE_METHODS: tuple[str, ...] = ("run", "python", "file_op", "digest", "snapshot", "grade", "processes")
"""The :class:`~agentrl.tools.workspace.Workspace` methods a remote workspace forwards."""


@dataclass(frozen=True)
class ExecutorSettings:
    """What an executor needs of the fleet's config: its pools' size, its start-up time-out and retries,
    the backend whose sandbox must run a program before the executor counts as started (``None``: no
    such probe), and the workspaces' backend options (``{"docker": {"docker_host": ...}}``)."""

    concurrency: int = 8
    start_timeout_s: float = 120.0
    start_retries: int = 2
    probe_backend: str | None = "bwrap"
    backend_options: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def workspace_options(self) -> dict[str, dict[str, Any]]:
        return {name: dict(options) for name, options in self.backend_options}


PoolKey = tuple[str, SandboxLimits, tuple[tuple[str, Any], ...]]


class SandboxExecutor:
    """See the module doc. Used from one event loop."""

    def __init__(self, index: int, settings: ExecutorSettings) -> None:
        self.index = index
        self.settings = settings
        self._pools: dict[PoolKey, Sandbox] = {}
        self._starting: dict[PoolKey, asyncio.Future[Sandbox]] = {}
        self._workspaces = Workspaces(backend_options=settings.workspace_options())
        self._live: dict[str, Workspace] = {}
        self._next = 0
        self.counts: Counter[str] = Counter()
        self._closed = False

    async def ready(self) -> dict[str, Any]:
        """Where this executor runs: its node id (when under Ray), host, pid. With a probe backend, a
        one-worker sandbox of it must first run a program (a node without bubblewrap fails here, at
        start-up, not in an episode)."""
        backend = self.settings.probe_backend
        if backend is not None:
            probe = create_sandbox(backend, pool_size=1, timeout_s=30.0)
            try:
                result = await probe.run("print(6 * 7)")
            finally:
                await probe.close()
            if result.stdout != "42\n":
                raise ExecutorUnavailableError(f"executor {self.index}: a {backend} sandbox could not run a program "
                                               f"here: {result.stderr[-500:] or result}", reason="start_failed")
        node = None
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:  # a plain executor (tests): no node
            pass
        return {"node": node, "host": os.uname().nodename, "pid": os.getpid(), "index": self.index}

    # -- stateless calls ---------------------------------------------------------------------------
    async def _pool(self, backend: str, limits: SandboxLimits, options: tuple[tuple[str, Any], ...]) -> Sandbox:
        key: PoolKey = (backend, limits, options)
        pool = self._pools.get(key)
        if pool is not None:
            return pool
        pending = self._starting.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Sandbox] = asyncio.get_running_loop().create_future()
        self._starting[key] = future
        try:
            pool = await self._start_pool(backend, limits, dict(options))
        except BaseException as exc:
            future.set_exception(exc if isinstance(exc, Exception) else SandboxUnavailableError("start cancelled"))
            future.exception()
            raise
        finally:
            self._starting.pop(key, None)
        self._pools[key] = pool
        future.set_result(pool)
        return pool

    async def _start_pool(self, backend: str, limits: SandboxLimits, options: dict[str, Any]) -> Sandbox:
        size = self.settings.concurrency
        last: BaseException | None = None
        for _ in range(self.settings.start_retries + 1):
            pool = create_sandbox(backend, limits=limits, pool_size=size, max_concurrency=size, **options)
            self.counts["starts"] += 1
            try:
                await asyncio.wait_for(pool.start(), self.settings.start_timeout_s)
                return pool
            except (SandboxUnavailableError, asyncio.TimeoutError, OSError) as exc:
                self.counts["start_failures"] += 1
                last = exc
                await pool.close()
        raise SandboxUnavailableError(f"executor {self.index}: the {backend} pool did not start in "
                                      f"{self.settings.start_retries + 1} tries ({self.settings.start_timeout_s:g} s "
                                      f"each): {last}")

    async def run(self, backend: str, limits: SandboxLimits, options: tuple[tuple[str, Any], ...], code: str,
                  language: str, timeout_s: float | None) -> ExecResult:
        """One stateless execution on the warm pool for (backend, limits, options)."""
        pool = await self._pool(backend, limits, options)
        self.counts["runs"] += 1
        return await pool.run(code, language=language, timeout_s=timeout_s)

    async def capabilities(self, backend: str, limits: SandboxLimits,
                           options: tuple[tuple[str, Any], ...]) -> Capabilities:
        """The capabilities of the warm pool for (backend, limits, options), started if needed."""
        return (await self._pool(backend, limits, options)).capabilities()

    async def pool_pids(self) -> list[int]:
        """Host PIDs of every pool's workers (bwrap and local pools)."""
        pids: list[int] = []
        for pool in self._pools.values():
            worker_pids = getattr(pool, "worker_pids", None)
            if callable(worker_pids):
                pids.extend(worker_pids())
        return pids

    # -- workspaces --------------------------------------------------------------------------------
    async def ws_create(self, spec: WorkspaceSpec, files: Mapping[str, str | bytes] | None,
                        snapshot: bytes | None = None) -> tuple[str, str]:
        """A new workspace (a fork of the prepared state for ``spec`` and ``files``; with ``snapshot``,
        restored from it); returns its id here and its name."""
        if snapshot is None:
            ws = await self._workspaces.create(spec, files)
        else:
            ws = await self._workspaces.restore(spec, files, snapshot)
        self._next += 1
        ws_id = f"{self.index}-{self._next}"
        self._live[ws_id] = ws
        self.counts["workspaces"] += 1
        return ws_id, ws.name

    def _workspace(self, ws_id: str) -> Workspace:
        ws = self._live.get(ws_id)
        if ws is None:
            raise WorkspaceError(f"workspace {ws_id}: not on executor {self.index} (removed, or never created here)")
        return ws

    async def ws_call(self, ws_id: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``method`` (one of :data:`WORKSPACE_METHODS`) of workspace ``ws_id``."""
        if method not in WORKSPACE_METHODS:
            raise ValueError(f"ws_call(method={method!r}): expected one of {WORKSPACE_METHODS}")
        ws = self._workspace(ws_id)
        self.counts[f"ws_{method}"] += 1
        result = getattr(ws, method)(*args, **kwargs)
        return await result if asyncio.iscoroutine(result) else result

    async def ws_remove(self, ws_id: str) -> None:
        """Removes workspace ``ws_id`` (nothing when it is already gone)."""
        ws = self._live.pop(ws_id, None)
        if ws is not None:
            await self._workspaces.remove(ws)

    # -- state -------------------------------------------------------------------------------------
    async def stats(self) -> dict[str, Any]:
        """Counts (starts, start failures, runs, workspaces and calls by method), live workspaces, pools,
        and what of the workspaces' backends still exists here."""
        return {"index": self.index, "counts": dict(self.counts), "live_workspaces": len(self._live),
                "pools": len(self._pools), "leftovers": self._workspaces.leftovers()}

    async def processes(self) -> list[tuple[int, float]]:
        """``(pid, start time)`` of this executor's process and every descendant (for leftover checks)."""
        import psutil

        me = psutil.Process()
        out = []
        for proc in (me, *me.children(recursive=True)):
            try:
                out.append((proc.pid, proc.create_time()))
            except psutil.Error:
                continue
        return out

    async def close(self) -> None:
        """Removes every workspace and closes every pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for ws_id in list(self._live):
            await self.ws_remove(ws_id)
        await self._workspaces.close()
        for pool in list(self._pools.values()):
            await pool.close()
        self._pools.clear()


@dataclass(frozen=True)
class Outcome:
    """A call's result as a value: ``value``, or the exception ``error`` it raised (re-raised by the caller)."""

    value: Any = None
    error: BaseException | None = None

    def unwrap(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else a RuntimeError with its type and message (the caller needs a value)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class ExecutorActor:
    """The Ray actor around a :class:`SandboxExecutor`: one generic ``call`` that returns an
    :class:`Outcome` (so exceptions come back typed), and the wall time it took inside the actor."""

    def __init__(self, index: int, settings: ExecutorSettings) -> None:
        self.executor = SandboxExecutor(index, settings)

    async def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Outcome, float]:
        started = time.perf_counter()
        if method.startswith("_") or not callable(getattr(self.executor, method, None)):
            error: BaseException = ValueError(f"ExecutorActor.call(method={method!r}): no such executor method")
            return Outcome(error=error), 0.0
        try:
            result = getattr(self.executor, method)(*args, **kwargs)
            value = await result if asyncio.iscoroutine(result) else result
            return Outcome(value=value), time.perf_counter() - started
        except Exception as exc:
            return Outcome(error=_portable(exc)), time.perf_counter() - started
