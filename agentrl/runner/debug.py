"""Debug modes of a run.

- **Rollout only**: ``agentrl.run(config, rollout_only=True)`` collects and records steps
  (``metrics.jsonl``, trajectories) without a trainer.
- **Train only** (:func:`train_from_trajectories`): re-runs the training steps of a run folder on its
  saved trajectories, from the model of ``config`` (or a checkpoint), with no engine and no
  environment: the losses and updates are recomputed, so a bad step can be bisected (change the
  algorithm section, train again on the same data, compare the metrics).

Example::

    metrics = train_from_trajectories(config, "runs/3f2a9c1b7d10", steps=range(1, 8))
    [m["train/loss"] for m in metrics]
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentrl.runner.checkpoint import RunCheckpointer
from agentrl.runner.config import RunConfig
from agentrl.runner.rundir import RunDirectory
from agentrl.runner.trainer import TrainService
from agentrl.train.batching import build_training_batch

__all__ = ["train_from_trajectories"]


def train_from_trajectories(config: RunConfig, run_dir: str | Path, *, steps: Iterable[int] | None = None,
                            checkpoint: str | Path | None = None, service: TrainService | None = None,
                            ) -> list[dict[str, Any]]:
    """Trains on the trajectories ``run_dir`` saved for ``steps`` (default: all, in order) and returns
    one metrics dict per step. ``checkpoint``: start from that run checkpoint's trainer state instead
    of ``config.model.path``; ``service``: a trainer to use (tests pass one to compare weights)."""
    source = RunDirectory(run_dir, config_hash=config.hash())
    available = source.trajectory_steps()
    wanted = list(steps) if steps is not None else available
    missing = [s for s in wanted if s not in available]
    if missing:
        raise FileNotFoundError(f"train_from_trajectories: {str(source.root)!r} has no trajectories for steps "
                                f"{missing} (it has {available[:10]}{'...' if len(available) > 10 else ''})")
    trainer = service or TrainService.from_config(config)
    if checkpoint is not None:
        loaded = RunCheckpointer(Path(checkpoint).parent, keep_last=1, config_hash=config.hash()).load(
            RunCheckpointer.resolve(checkpoint), allow_config_change=True)
        trainer.load(str(loaded.trainer_dir))
    batching = config.batching_config()
    out: list[dict[str, Any]] = []
    for step in wanted:
        batch = build_training_batch(source.read_trajectories(step), batching)
        metrics = trainer.train(batch, step - 1)
        out.append({"step": step, **metrics})
    return out
