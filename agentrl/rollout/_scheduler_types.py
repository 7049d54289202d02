"""The scheduler's value types: its settings, its error, a step's batch and its progress.

Re-exported by :mod:`agentrl.rollout.scheduler`, where they are documented with the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.episode import Episode
from agentrl.rollout.groups import RolloutGroup
from agentrl.rollout.report import StepReport

__all__ = ["RolloutProgress", "SchedulerConfig", "SchedulerError", "StepBatch"]


class SchedulerError(RuntimeError):
    """The scheduler cannot fill a step (a filter that rejects everything, no data left...)."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings of the rollout scheduler (see the module doc for what each does)."""

    groups_per_step: int = 8
    group_size: int = 8
    over_sampling: float = 0.0
    max_inflight_groups: int | None = None
    max_requests_per_engine: int = 256
    max_tool_concurrency: int = 64
    member_retries: int = 2
    min_group_size: int = 2
    max_rejected_groups: int | None = None
    partial_rollout: bool = False
    mask_offpolicy: bool = False
    max_staleness: int | None = None
    abort_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("groups_per_step", "group_size", "max_requests_per_engine", "max_tool_concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SchedulerConfig.{name}={value!r}: expected an int >= 1")
        if not 0.0 <= self.over_sampling <= 16.0:
            raise ValueError(f"SchedulerConfig.over_sampling={self.over_sampling!r}: expected a fraction in [0, 16]")
        if self.max_inflight_groups is not None and self.max_inflight_groups < 1:
            raise ValueError(f"SchedulerConfig.max_inflight_groups={self.max_inflight_groups!r}: expected None or >= 1")
        if self.member_retries < 0:
            raise ValueError(f"SchedulerConfig.member_retries={self.member_retries!r}: expected an int >= 0")
        if not 1 <= self.min_group_size <= self.group_size:
            raise ValueError(f"SchedulerConfig.min_group_size={self.min_group_size!r}: expected an int in "
                             f"[1, group_size={self.group_size}]")
        if self.max_rejected_groups is not None and self.max_rejected_groups < 1:
            raise ValueError(f"SchedulerConfig.max_rejected_groups={self.max_rejected_groups!r}: expected None or >= 1")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"SchedulerConfig.max_staleness={self.max_staleness!r}: expected None or an int >= 0")
        if self.abort_timeout_s <= 0:
            raise ValueError(f"SchedulerConfig.abort_timeout_s={self.abort_timeout_s!r}: expected > 0")

    @property
    def rejection_budget(self) -> int:
        return self.max_rejected_groups if self.max_rejected_groups is not None else 20 * self.groups_per_step


@dataclass(frozen=True)
class RolloutProgress:
    """Where the step being collected stands (:meth:`Scheduler.progress`), for progress displays."""

    step: int
    accepted_groups: int
    target_groups: int
    running_groups: int
    rejected_groups: int
    inflight_requests: int
    elapsed_s: float


@dataclass
class StepBatch:
    """One step's accepted groups and its report."""

    groups: list[RolloutGroup]
    report: StepReport

    def trajectories(self) -> list[Any]:
        return [t for g in self.groups for t in g.trajectories()]

    def episodes(self) -> list[Episode]:
        return [ep for g in self.groups for ep in g.episodes]
