"""Keeping the event loop responsive while thousands of episodes do CPU work on it.

An asyncio loop runs, in one pass, every callback that was ready when the pass began. When 1,024
episodes become ready together (a step starts them all; an engine answers a batch at once), one
pass does 1,024 slices of rendering, parsing and bookkeeping back to back, and every timer and
socket waits for all of them: hundreds of milliseconds of lag, deadlines that fire late, aborts that
arrive late. :class:`Pacer` bounds a pass: episodes ``await pacer.turn()`` before each CPU-heavy
slice; once the current pass has spent ``budget_s``, later arrivals queue, and each following pass
releases about as many of them as fit in the budget (judged by the cost of the slices so far). A
queued episode costs nothing until it is released, and the order is first come, first served.

One pacer per event loop (the scheduler owns one); not thread-safe.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

__all__ = ["Pacer"]


class Pacer:
    """Bounds the CPU work of one event-loop pass to about ``budget_s``; see the module doc."""

    def __init__(self, budget_s: float = 0.005) -> None:
        if budget_s <= 0:
            raise ValueError(f"Pacer.budget_s={budget_s!r}: expected > 0")
        self.budget_s = budget_s
        self._window: float | None = None  # when the current pass's first slice began
        self._slices = 0
        self._cost = budget_s / 8  # running estimate of one slice's cost
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.queued = 0  # slices that had to wait for a later pass (a figure for reports)

    async def turn(self) -> None:
        """Returns at once while this pass has budget left; otherwise waits for a later pass."""
        now = time.perf_counter()
        if self._window is None:
            self._open(now)
        elif self._waiters or now - self._window >= self.budget_s:
            self.queued += 1
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter  # resolved by _next_pass (a cancelled waiter is skipped there)
            return
        self._slices += 1

    def _open(self, now: float) -> None:
        self._window = now
        self._slices = 1
        asyncio.get_running_loop().call_soon(self._next_pass)

    def _next_pass(self) -> None:
        """Runs at the start of the next pass: estimates a slice's cost and releases what fits."""
        assert self._window is not None
        elapsed = time.perf_counter() - self._window
        if self._slices:
            self._cost = 0.7 * self._cost + 0.3 * (elapsed / self._slices)
        self._window = None
        if not self._waiters:
            return
        release = max(1, int(self.budget_s / max(self._cost, 1e-6)))
        self._open(time.perf_counter())
        self._slices = 0
        while self._waiters and release > 0:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._slices += 1
                release -= 1
