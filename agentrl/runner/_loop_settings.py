"""The settings the run loop reads (:class:`LoopSettings`) and the errors that stop it;
:mod:`agentrl.runner.loop` re-exports them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentrl.train.config import BatchingConfig

if TYPE_CHECKING:
    from agentrl.runner.config import RunConfig

__all__ = ["LoopSettings", "NoTrainableGroupsError", "RunnerError", "StalenessError"]


class RunnerError(RuntimeError):
    """The run cannot go on (a broken bound, a failed probe, no data at all...)."""


class StalenessError(RunnerError):
    """A batch about to be trained is older than ``max_staleness`` allows (a scheduler bug)."""


class NoTrainableGroupsError(RunnerError):
    """The run ended without a single trained step: every prompt group it tried failed (the message
    names the reasons by kind, each with its first message)."""


@dataclass(frozen=True)
class LoopSettings:
    """The parts of the run config the loop itself reads."""

    mode: str = "sync"
    steps: int | None = None
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    max_staleness: int | None = None
    checkpoint_every: int | None = None
    save_final: bool = True
    save_trajectories: bool = True
    probe_sequences: tuple[tuple[int, ...], ...] = ()
    probe_bound: float = 0.05
    rollout_only: bool = False
    sync_at_start: bool = False
    release_engine_memory: bool = False
    sync_method: str = "disk"
    progress_interval_s: float = 0.5
    lora: bool = False
    probe_seed: int = 0
    teacher_on_trainer: bool = False

    @classmethod
    def from_config(cls, config: RunConfig, *, probe_sequences: Sequence[Sequence[int]] = (),
                    probe_bound: float | None = None, rollout_only: bool = False) -> LoopSettings:
        """The loop's settings from a run config; ``probe_sequences``: the probe's token ids (the
        runner draws ``sync.probe_sequences`` of them from the tokenizer), ``probe_bound`` ``None``:
        ``sync.probe_bound``."""
        bound = config.sync.probe_bound if probe_bound is None else probe_bound
        return cls(mode=config.mode, steps=config.train.steps, batching=config.batching_config(),
                   max_staleness=config.rollout.scheduler.max_staleness,
                   checkpoint_every=config.checkpoint.every_steps, save_final=config.checkpoint.save_final,
                   save_trajectories=config.logging.save_trajectories, rollout_only=rollout_only,
                   probe_sequences=tuple(tuple(s) for s in probe_sequences), probe_bound=bound,
                   sync_at_start=config.rollout.engines.boot_path is not None or bool(config.rollout.engines.urls),
                   release_engine_memory=config.cluster.placement == "colocated" and config.cluster.accelerator != "cpu",
                   sync_method=config.sync_method(), lora=config.train.lora is not None,
                   probe_seed=config.sync.probe_seed,
                   teacher_on_trainer=config.teacher is not None and config.teacher.on_trainer)
