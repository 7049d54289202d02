"""The scheduler's value types: its settings, its error, a step's batch and its progress.

Re-exported by :mod:`agentrl.rollout.scheduler`, where they are documented with the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le

from agentrl._limits import check_limits
from agentrl._tracebacks import source_line
from agentrl.episode import Episode
from agentrl.rollout.groups import RolloutGroup
from agentrl.rollout.report import StepReport
from agentrl.trajectory import EpisodeError

__all__ = ["RepeatedFailureError", "RolloutProgress", "SchedulerConfig", "SchedulerError", "StepBatch"]


class SchedulerError(RuntimeError):
    """The scheduler cannot fill a step (a filter that rejects everything, no data left...)."""


class RepeatedFailureError(SchedulerError):
    """``groups`` prompt groups in a row failed with the same error of the code under training (the
    environment, the agent harness or the reward): ``error``, the first of them, with where it was
    raised (``error.origin``). Stopping beats spending the data set on a bug."""

    def __init__(self, error: EpisodeError, groups: int, limit: int) -> None:
        self.error, self.groups, self.limit = error, groups, limit
        where = f"\n  at {error.origin}" if error.origin else ""
        line = source_line(error.origin)
        if line is not None:
            where += f"\n    {line}"
        super().__init__(f"{groups} prompt groups in a row failed with the same {error.kind.value} error "
                         f"(max_consecutive_failed_groups={limit}); the first: {error.component or 'episode'}: "
                         f"{error.message}{where}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.error, self.groups, self.limit)


@dataclass(frozen=True)
class SchedulerConfig:
    """Settings of the rollout scheduler (see the module doc for what each does)."""

    groups_per_step: Annotated[int, Ge(1)] = 8
    group_size: Annotated[int, Ge(1)] = 8
    over_sampling: Annotated[float, Ge(0.0), Le(16.0)] = 0.0
    max_inflight_groups: Annotated[int, Ge(1)] | None = None
    max_requests_per_engine: Annotated[int, Ge(1)] = 256
    max_tool_concurrency: Annotated[int, Ge(1)] = 64
    member_retries: Annotated[int, Ge(0)] = 2
    min_group_size: Annotated[int, Ge(1)] = 2
    max_rejected_groups: Annotated[int, Ge(1)] | None = None
    max_consecutive_failed_groups: Annotated[int, Ge(1)] | None = 16
    partial_rollout: bool = False
    mask_offpolicy: bool = False
    max_staleness: Annotated[int, Ge(0)] | None = None
    abort_timeout_s: Annotated[float, Gt(0.0)] = 5.0

    def __post_init__(self) -> None:
        check_limits(self)
        if self.min_group_size > self.group_size:
            raise ValueError(f"SchedulerConfig.min_group_size={self.min_group_size!r}: expected at most "
                             f"group_size={self.group_size}")

    @property
    def samples_per_step(self) -> int:
        """``groups_per_step × group_size``: the episodes one training step trains on."""
        return self.groups_per_step * self.group_size

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
