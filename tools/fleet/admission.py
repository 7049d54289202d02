"""Admission and back-pressure of a sandbox fleet: which executor serves a call, and when.

Each executor (:class:`Slot`) runs at most ``capacity`` calls at once. A call pinned to an executor
(a workspace's: it lives there) waits in that executor's queue; a stateless call takes the executor
with the most room, or waits in the fleet's queue for whichever frees a place first. Queues are
bounded (``queue_limit`` per executor; the fleet's queue ``queue_limit`` per live executor): a call
that finds its queue full fails at once (``queue_full``), one that waits past its deadline fails
``admission_timeout``, one whose executor is lost while it waits fails ``executor_lost`` — never a
hang. A freed place goes to the call that has waited longest among the executor's own queue and
the fleet's queue.

:class:`Admission` is plain asyncio state, no I/O: the router (:mod:`agentrl.tools.fleet.router`)
owns one and tells it when executors come and go.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools.fleet.errors import ExecutorLostError, ExecutorUnavailableError

__all__ = ["Admission", "Slot"]

_order = itertools.count()


@dataclass(eq=False)
class Slot:
    """One executor's place in the fleet: where it runs, how many calls it runs now, its queue, the
    workspaces it holds (and by prepared state, so a group's members join their prepared base)."""

    index: int
    node: str
    link: Any
    capacity: int
    inflight: int = 0
    alive: bool = True
    workspaces: int = 0
    prepared: collections.Counter[str] = field(default_factory=collections.Counter)
    queue: collections.deque[tuple[int, asyncio.Future[Slot]]] = field(default_factory=collections.deque)

    @property
    def name(self) -> str:
        return f"{self.node[:8]}/{self.index}"

    @property
    def has_room(self) -> bool:
        return self.alive and self.inflight < self.capacity


class Admission:
    """See the module doc. ``queue_limit``: calls that may wait per executor."""

    def __init__(self, queue_limit: int) -> None:
        self.queue_limit = queue_limit
        self.slots: list[Slot] = []
        self._waiting: collections.deque[tuple[int, asyncio.Future[Slot]]] = collections.deque()

    # -- executors come and go ---------------------------------------------------------------------
    def add(self, slot: Slot) -> None:
        self.slots.append(slot)
        self._dispatch(slot)

    def lose(self, slot: Slot, message: str) -> None:
        """``slot``'s executor is gone: its queued calls fail ``executor_lost``; it gets no more calls."""
        if not slot.alive:
            return
        slot.alive = False
        while slot.queue:
            _, future = slot.queue.popleft()
            if not future.done():
                future.set_exception(ExecutorLostError(message, node=slot.node))
                future.exception()

    def live(self) -> list[Slot]:
        return [s for s in self.slots if s.alive]

    def forget(self) -> None:
        """Drops the slots of lost executors (their calls have ended)."""
        self.slots = [s for s in self.slots if s.alive or s.inflight]

    # -- a call --------------------------------------------------------------------------------------
    async def acquire(self, pinned: Slot | None, deadline_s: float) -> Slot:
        """A place on ``pinned`` (a workspace's executor) or on any executor; raises
        :class:`ExecutorUnavailableError` (module doc) instead of waiting past ``deadline_s``."""
        if pinned is not None:
            if not pinned.alive:
                raise ExecutorLostError(f"executor {pinned.name} is gone (its node or its process was lost)",
                                        node=pinned.node)
            if pinned.has_room and not pinned.queue:
                pinned.inflight += 1
                return pinned
            if len(pinned.queue) >= self.queue_limit:
                raise ExecutorUnavailableError(
                    f"executor {pinned.name}: {pinned.inflight} calls running and {len(pinned.queue)} waiting "
                    f"(queue_limit={self.queue_limit}); the call was refused", reason="queue_full", node=pinned.node)
            return await self._wait(pinned.queue, deadline_s, pinned)
        free = [s for s in self.slots if s.has_room and not s.queue]
        if free and not self._waiting:
            slot = min(free, key=lambda s: (s.inflight / s.capacity, s.inflight))
            slot.inflight += 1
            return slot
        live = self.live()
        if len(self._waiting) >= self.queue_limit * max(1, len(live)):
            raise ExecutorUnavailableError(
                f"every executor is busy: {sum(s.inflight for s in live)} calls running on {len(live)} executor(s) "
                f"and {len(self._waiting)} waiting (queue_limit={self.queue_limit} per executor); the call was "
                "refused", reason="queue_full")
        return await self._wait(self._waiting, deadline_s, None)

    async def _wait(self, queue: collections.deque[tuple[int, asyncio.Future[Slot]]], deadline_s: float,
                    pinned: Slot | None) -> Slot:
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        entry = (next(_order), future)
        queue.append(entry)
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline_s)
        except asyncio.TimeoutError:
            if future.done() and not future.cancelled() and future.exception() is None:
                return future.result()  # served at the deadline: keep the place
            live = self.live()
            where = (f"executor {pinned.name}" if pinned is not None else
                     f"{len(live)} executor(s)" if live else "no executor (none of the fleet's nodes is up)")
            raise ExecutorUnavailableError(
                f"no room on {where} within the admission deadline of {deadline_s:g} s",
                reason="admission_timeout" if live else "no_executor",
                node=pinned.node if pinned is not None else None) from None
        except BaseException:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result())  # a place handed over while this call was cancelled
            raise
        finally:
            if entry in queue:
                queue.remove(entry)
            if not future.done():
                future.cancel()

    def release(self, slot: Slot) -> None:
        """A call on ``slot`` ended: its place goes to the longest-waiting call that can use it."""
        slot.inflight -= 1
        self._dispatch(slot)

    def _dispatch(self, slot: Slot) -> None:
        while slot.has_room:
            own = self._head(slot.queue)
            shared = self._head(self._waiting)
            if own is None and shared is None:
                return
            queue = slot.queue if shared is None or (own is not None and own[0] < shared[0]) else self._waiting
            _, future = queue.popleft()
            slot.inflight += 1
            future.set_result(slot)

    @staticmethod
    def _head(queue: collections.deque[tuple[int, asyncio.Future[Slot]]]) -> tuple[int, asyncio.Future[Slot]] | None:
        while queue and queue[0][1].done():
            queue.popleft()
        return queue[0] if queue else None

    def waiting(self) -> int:
        return len(self._waiting) + sum(len(s.queue) for s in self.slots)
