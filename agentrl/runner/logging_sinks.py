"""Metrics sinks as :class:`~agentrl.runner.RunCallback` objects: TensorBoard and Weights & Biases.

``metrics.jsonl`` in the run folder is always written by the runner; these add the usual viewers.
Each step's numeric metrics (nested mappings flattened with ``/``, booleans as 0/1, non-finite and
non-numeric values left out) are logged at the step number:

- :class:`TensorBoardSink`: event files under ``<run>/tensorboard`` (the ``tensorboard`` package's
  writer through ``torch.utils.tensorboard``), flushed every step;
- :class:`WandbSink`: a W&B run (``project``, the run config as its config, files under the run
  folder); the mode follows ``WANDB_MODE`` (``offline`` writes locally and syncs later; W&B's
  service writes the ``.wandb`` file out when it closes the run's stream, a moment after
  ``run.finish()``, at the latest at process exit or when ``wandb.teardown()`` returns).

:func:`sinks_from_config` builds what ``logging.tensorboard`` / ``logging.wandb`` ask for, so
``agentrl.run(config, callbacks=sinks_from_config(config))`` logs as the CLI does.

Example::

    train(config, callbacks=[TensorBoardSink("runs/exp1/tensorboard")])
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.runner.loop import RunCallback, RunSummary

if TYPE_CHECKING:
    from agentrl.runner.config import RunConfig

__all__ = ["SinkUnavailableError", "TensorBoardSink", "WandbSink", "scalar_metrics", "sinks_from_config"]


class SinkUnavailableError(RuntimeError):
    """A sink was asked for but its package is not installed."""


def scalar_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of ``metrics``, nested mappings flattened as ``outer/inner``."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(scalar_metrics(value, prefix=f"{name}/"))
        elif isinstance(value, bool):
            out[name] = float(value)
        elif isinstance(value, int | float) and math.isfinite(value):
            out[name] = float(value)
    return out


class TensorBoardSink(RunCallback):
    """Writes each step's scalars to TensorBoard event files in ``log_dir`` (see the module doc)."""

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise SinkUnavailableError("logging.tensorboard=true needs the tensorboard package "
                                       "(pip install 'agentrl[logging]' or pip install tensorboard)") from exc
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer: Any = SummaryWriter(log_dir=str(self.log_dir))

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        for name, value in scalar_metrics(metrics).items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def on_run_end(self, summary: RunSummary) -> None:
        for name, value in scalar_metrics(summary.evals, prefix="final_eval/").items():
            self._writer.add_scalar(name, value, global_step=summary.steps)
        self.close()

    def close(self) -> None:
        self._writer.close()


class WandbSink(RunCallback):
    """Logs each step's scalars to a Weights & Biases run (see the module doc)."""

    def __init__(self, project: str | None, run_dir: str | Path, *, config: Mapping[str, Any] | None = None,
                 name: str | None = None) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise SinkUnavailableError("logging.wandb=true needs the wandb package "
                                       "(pip install 'agentrl[logging]' or pip install wandb)") from exc
        folder = Path(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        self.run: Any = wandb.init(project=project or "agentrl", dir=str(folder), name=name or folder.name,
                                   config=dict(config or {}), reinit="finish_previous")
        self._finished = False

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(scalar_metrics(metrics), step=step)

    def on_run_end(self, summary: RunSummary) -> None:
        self.run.summary.update({"steps": summary.steps, "stopped_because": summary.stopped_because,
                                 **scalar_metrics(summary.evals, prefix="final_eval/")})
        self.close()

    def close(self) -> None:
        if not self._finished:
            self._finished = True
            self.run.finish()


def sinks_from_config(config: RunConfig) -> list[RunCallback]:
    """The sinks ``config.logging`` asks for (TensorBoard under ``<run>/tensorboard``, W&B in the run folder)."""
    sinks: list[RunCallback] = []
    run_dir = config.run_dir()
    if config.logging.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if config.logging.wandb:
        sinks.append(WandbSink(config.logging.wandb_project, run_dir, config=config.to_dict()))
    return sinks
