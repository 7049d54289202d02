"""What a run is started with, as one value: :class:`RunPlan`.

:func:`agentrl.run` builds it once (:func:`plan_run`) and hands it to whichever way the sides run
(in this process, or on Ray); nothing in it changes while the run goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentrl.runner.checkpoint import RunCheckpointer
from agentrl.runner.cpu import CpuPlan, plan_cpu
from agentrl.runner.loop import LoopSettings, RunCallback

if TYPE_CHECKING:
    from agentrl.rollout.groups import GroupFilter
    from agentrl.runner.config import RunConfig
    from agentrl.runner.envs import RowFactory
    from agentrl.runner.rundir import RunDirectory

__all__ = ["RunPlan", "plan_run"]


@dataclass(frozen=True)
class RunPlan:
    """The run config and the caller's objects (``env_factory``: ``row -> environment``; the group
    filter; the callbacks), where the run writes (its folder, its checkpointer), and what was decided
    from them: the loop's settings, the checkpoint to resume from, the CPU plan of a CPU machine, and the
    folder the warm-up reports to (``None``: no warm-up runs)."""

    config: RunConfig
    env_factory: RowFactory
    run_dir: RunDirectory
    checkpointer: RunCheckpointer
    settings: LoopSettings
    group_filter: GroupFilter | None = None
    callbacks: tuple[RunCallback, ...] = ()
    resume: str | None = None
    cpu: CpuPlan | None = None
    warmup_dir: str | None = None

    @property
    def rollout_only(self) -> bool:
        return self.settings.rollout_only


def plan_run(config: RunConfig, env_factory: RowFactory, run_dir: RunDirectory, *,
             group_filter: GroupFilter | None = None, callbacks: Sequence[RunCallback] = (),
             resume: str | None = None, rollout_only: bool = False,
             probe_sequences: Sequence[Sequence[int]] = ()) -> RunPlan:
    """The plan of ``config``'s run: ``resume`` ``None`` resumes ``checkpoint.resume``; the warm-up runs
    (on the trainer, while the engines boot) unless the run resumes (its checkpoint holds it) or only
    rolls out; ``probe_sequences``: the post-sync probe's token ids."""
    checkpointer = RunCheckpointer(run_dir.checkpoints_dir, keep_last=config.checkpoint.keep_last,
                                   config_hash=config.hash())
    resume = resume if resume is not None else config.checkpoint.resume
    settings = LoopSettings.from_config(config, rollout_only=rollout_only, probe_sequences=probe_sequences)
    cpu = plan_cpu(engines=config.engines_launched) if config.cluster.accelerator == "cpu" else None
    warm = config.warmup is not None and resume is None and not rollout_only
    return RunPlan(config, env_factory, run_dir, checkpointer, settings, group_filter=group_filter,
                   callbacks=tuple(callbacks), resume=resume, cpu=cpu,
                   warmup_dir=str(run_dir.root) if warm else None)
