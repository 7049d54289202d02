"""Worker processes for CPU-bound reward work, with a hard deadline per call.

A reward that parses and compares math (sympy under ``math_verify``), runs a checker or a regex
on a hostile answer can take seconds or never end. On the rollout's event loop that would stall
every episode; in a thread it cannot be stopped. :class:`RewardPool` runs such calls in a small
pool of pre-warmed worker processes (``forkserver``: safe from a threaded, async process such as a
Ray actor): a call past its deadline has its worker killed and replaced, and raises
:class:`RewardTimeout`, a typed reward failure the rollout scores by its reward-failure policy.

:func:`shared_pool` is the process's pool (started on first use, or by :meth:`RewardPool.warm` when
a rollout starts, so the first reward does not pay for the workers' start; stopped at exit).
What runs in it must pickle: module-level functions and the values they take. Each call travels
with this process's import path of the moment (absolute), and is unpickled in the worker only after
the worker has taken it: a function from a module this process can import (a folder added to
``sys.path`` after the pool started, the working directory of the moment) is found there too. A
pool whose workers broke (one died outside a call) is restarted on the next call, once per call,
rather than failing every later reward.

Example::

    pool = shared_pool()
    value = await pool.run(expensive_check, answer, label, timeout_s=5.0)   # RewardTimeout after 5 s
    same = pool.call(expensive_check, answer, label, timeout_s=5.0)          # from a worker thread
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import os
import pickle
import sys
import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

__all__ = ["RewardPool", "RewardTimeout", "shared_pool"]

T = TypeVar("T")


class RewardTimeout(TimeoutError):
    """A reward call ran past its deadline; its worker process was killed and replaced."""


def _noop() -> int:
    return os.getpid()


def _import_path() -> tuple[str, ...]:
    """This process's ``sys.path`` with every entry absolute (``""``: the working directory now)."""
    return tuple(os.path.abspath(p or os.getcwd()) for p in sys.path)


def _call(path: tuple[str, ...], payload: bytes) -> Any:
    """Worker side: take the caller's import path, then unpickle and run the call."""
    missing = [p for p in path if p not in sys.path]
    if missing:
        sys.path[:0] = missing
    fn, args = pickle.loads(payload)
    return fn(*args)


def _preload(modules: tuple[str, ...]) -> None:
    """Worker start-up: imports what reward calls will need (sympy under math_verify takes ~1 s)."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


class RewardPool:
    """``workers`` processes (default: half the cores) running reward calls (see the module doc);
    each imports ``preload`` when it starts. Thread-safe."""

    def __init__(self, workers: int | None = None, *, preload: tuple[str, ...] = ("math_verify",)) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"RewardPool(workers={workers!r}): expected None (half the cores) or an int >= 1")
        self.workers = workers or max(1, (os.cpu_count() or 2) // 2)
        self.preload = preload
        self._pool: Any = None
        self._lock = threading.Lock()
        self.timeouts = 0

    def _started(self) -> Any:
        with self._lock:
            if self._pool is None:
                from pebble import ProcessPool

                self._pool = ProcessPool(max_workers=self.workers, initializer=_preload, initargs=(self.preload,),
                                         context=multiprocessing.get_context("forkserver"))
            return self._pool

    def warm(self) -> None:
        """Starts every worker now (each answers a no-op), so the first real call does not wait."""
        for future in [self._submit(_noop, (), None) for _ in range(self.workers)]:
            future.result(timeout=120)

    def _schedule(self, fn: Callable[..., T], args: tuple[Any, ...], timeout_s: float | None) -> Any:
        payload = pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)  # unpicklable: raised here
        return self._submit(_call, (_import_path(), payload), timeout_s)

    def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float | None) -> Any:
        try:
            return self._started().schedule(fn, args=args, timeout=timeout_s)
        except RuntimeError:  # pebble: "Unexpected error within the Pool" (a worker broke outside a call)
            self.close()
            return self._started().schedule(fn, args=args, timeout=timeout_s)

    def _timed_out(self, fn: Callable[..., Any], timeout_s: float | None) -> RewardTimeout:
        self.timeouts += 1
        name = getattr(fn, "__qualname__", type(fn).__name__)
        return RewardTimeout(f"{name} ran past its deadline of {timeout_s:g} s; its worker process was killed")

    async def run(self, fn: Callable[..., T], *args: Any, timeout_s: float | None) -> T:
        """``fn(*args)`` in a worker; raises :class:`RewardTimeout` past ``timeout_s``, or what ``fn`` raised."""
        future = self._schedule(fn, args, timeout_s)
        try:
            return await asyncio.wrap_future(future)  # type: ignore[no-any-return]
        except FutureTimeout:
            raise self._timed_out(fn, timeout_s) from None
        except asyncio.CancelledError:
            future.cancel()  # a running call's worker is stopped too
            raise

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float | None) -> T:
        """:meth:`run` for a caller that blocks (a worker thread)."""
        future = self._schedule(fn, args, timeout_s)
        try:
            return future.result()  # type: ignore[no-any-return]
        except FutureTimeout:
            raise self._timed_out(fn, timeout_s) from None

    def close(self) -> None:
        """Stops the workers (a call in progress is ended). Idempotent; the pool restarts on next use."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
            pool.join(timeout=10)


_SHARED: RewardPool | None = None
_SHARED_LOCK = threading.Lock()


def shared_pool() -> RewardPool:
    """This process's reward pool (created on first use, closed at exit)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = RewardPool()
            atexit.register(_SHARED.close)
        return _SHARED
