"""Token ids checked once (:class:`CheckedIds`); a leaf module, so that the chat layer and the
trajectory can both use it (``agentrl.trajectory`` re-exports it)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["CheckedIds"]


class CheckedIds(tuple):  # type: ignore[type-arg]
    """Token ids checked once: plain ints, none negative; ``max_id`` is the largest (-1 when empty).

    :meth:`agentrl.Trajectory.from_prompt` trusts them and checks only ``max_id`` against its
    vocabulary. Built where ids are shared, e.g. an opening cached for the G members of a group, so
    that its ~300 ids are checked once, not once per member.
    """

    max_id: int

    def __new__(cls, ids: Iterable[int]) -> CheckedIds:
        self = super().__new__(cls, ids)
        if self and (set(map(type, self)) - {int} or min(self) < 0):
            at, bad = next((i, t) for i, t in enumerate(self) if type(t) is not int or t < 0)
            raise ValueError(f"CheckedIds: ids[{at}] = {bad!r}; expected a plain int >= 0")
        self.max_id = max(self) if self else -1
        return self
