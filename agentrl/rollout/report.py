"""The typed step report of the rollout scheduler: where every prompt of a step went, and how fast.

Accounting: every prompt a step takes in (drawn fresh from the data source, or served from the
buffer of an earlier step) ends in exactly one outcome:

===============  ==========================================================================
``trained``      its group is in the batch handed to the trainer
``filtered``     the dynamic filter rejected its group (counted per reason)
``buffered``     its group was cut short by the end of the step and waits, with its work, in the
                 buffer (partial rollout), or finished as surplus and waits there whole
``recycled``     its group was cut short without partial rollout: the work is discarded and the
                 prompt is served again, from scratch, by the next step
``stale``        its group would exceed ``max_staleness``; dropped (environments closed)
``failed``       too few of its members finished, even after regeneration (counted per reason)
===============  ==========================================================================

:meth:`StepReport.check` raises when the outcomes do not add up to the intake.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["AccountingError", "StepReport"]


class AccountingError(RuntimeError):
    """The outcomes of a step do not add up to the prompts it took in (a scheduler bug)."""


@dataclass
class StepReport:
    """What one :meth:`~agentrl.rollout.scheduler.Scheduler.collect` did. Plain data: logged as JSON."""

    step: int
    policy_version: int
    drawn: int = 0
    from_buffer: int = 0
    trained: int = 0
    filtered: dict[str, int] = field(default_factory=dict)
    buffered: int = 0
    recycled: int = 0
    stale: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    failure_examples: dict[str, str] = field(default_factory=dict)  # failed reason -> its first message
    bad_rows: int = 0
    data_exhausted: bool = False
    episodes_finished: int = 0
    episodes_suspended: int = 0
    members_regenerated: int = 0
    members_lost: int = 0
    masked_offpolicy_tokens: int = 0
    members_restored: int = 0  # suspended episodes of a loaded state, rebuilt by replaying their environments
    restored_mismatch: int = 0  # ... whose replay did not match the record: restarted from scratch
    restore_problems: list[str] = field(default_factory=list)  # why (the first few)
    staleness: dict[int, int] = field(default_factory=dict)
    weight_versions: dict[str, int] = field(default_factory=dict)
    failure_kinds: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # episode errors by kind (agentrl.trajectory.ErrorKind)
    error_examples: dict[str, str] = field(default_factory=dict)  # error kind -> its first message and origin
    stop_reasons: dict[str, int] = field(default_factory=dict)
    engine_events: dict[str, int] = field(default_factory=dict)  # health monitor: dead, removed, restarted, given_up
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def intake(self) -> int:
        return self.drawn + self.from_buffer

    @property
    def outcomes(self) -> int:
        return (self.trained + sum(self.filtered.values()) + self.buffered + self.recycled + self.stale
                + sum(self.failed.values()))

    def check(self) -> None:
        """Raises :class:`AccountingError` unless every prompt taken in has exactly one outcome."""
        if self.outcomes != self.intake:
            raise AccountingError(
                f"step {self.step}: {self.intake} prompts taken in ({self.drawn} drawn, {self.from_buffer} from the "
                f"buffer) but {self.outcomes} outcomes (trained {self.trained}, filtered {self.filtered}, buffered "
                f"{self.buffered}, recycled {self.recycled}, stale {self.stale}, failed {self.failed})")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["staleness"] = {str(k): v for k, v in self.staleness.items()}
        return out

    def count(self, outcome: str, reason: str | None = None) -> None:
        """Adds one prompt to ``outcome`` (``filtered`` / ``failed`` need a reason)."""
        if outcome in ("filtered", "failed"):
            bucket: dict[str, int] = getattr(self, outcome)
            key = reason or "unknown"
            bucket[key] = bucket.get(key, 0) + 1
        elif outcome in ("trained", "buffered", "recycled", "stale"):
            setattr(self, outcome, getattr(self, outcome) + 1)
        else:
            raise ValueError(f"StepReport.count: outcome={outcome!r}; expected trained, filtered, buffered, "
                             "recycled, stale or failed")

    def add_counts(self, name: str, counts: Counter[Any]) -> None:
        bucket: dict[Any, int] = getattr(self, name)
        for key, value in counts.items():
            bucket[key] = bucket.get(key, 0) + int(value)
