"""Group filters over rewards: the verdict a dynamic-sampling filter returns, and the built-in filter.

A filter looks at one prompt group (its G rollouts, each counted once) and keeps it for training or
drops it with a reason. The rollout scheduler applies filters (:mod:`agentrl.rollout.groups`) and the
name registry offers the built-in one to run configs (:mod:`agentrl.environments.registry`); the filter
needs nothing but the group's rewards, so it lives here, below both.

Example::

    drop_uniform_rewards(group)        # FilterResult(keep=False, reason='uniform_rewards') when all rewards tie
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["FilterResult", "RewardGroup", "drop_uniform_rewards"]


class RewardGroup(Protocol):
    """What a reward filter reads of a prompt group (:class:`agentrl.rollout.RolloutGroup` fits)."""

    @property
    def rewards(self) -> Sequence[float]:
        """One reward per rollout, never one per sequence."""
        ...


@dataclass(frozen=True)
class FilterResult:
    """A filter's verdict: keep the group, or drop it with a reason (counted per reason)."""

    keep: bool
    reason: str | None = None

    def __post_init__(self) -> None:
        if not self.keep and not self.reason:
            raise ValueError("FilterResult: a rejection needs a reason (it is counted per reason)")

    @classmethod
    def accept(cls) -> FilterResult:
        return cls(True)

    @classmethod
    def reject(cls, reason: str) -> FilterResult:
        return cls(False, reason)


def drop_uniform_rewards(group: RewardGroup, *, tolerance: float = 1e-6) -> FilterResult:
    """Rejects a group whose rewards are all equal (std ≤ ``tolerance``): GRPO learns nothing from it."""
    rewards = group.rewards
    if len(rewards) < 2 or statistics.pstdev(rewards) <= tolerance:
        return FilterResult.reject("uniform_rewards")
    return FilterResult.accept()
