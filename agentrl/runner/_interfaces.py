"""What the training loop talks to: the callbacks' hooks (:class:`RunCallback`), the two sides
it drives (:class:`RolloutSide`, :class:`TrainSide`) and what a run did (:class:`RunSummary`).

Re-exported by :mod:`agentrl.runner.loop`, where :class:`~agentrl.runner.loop.Runner` calls them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrl.rollout.scheduler import RolloutProgress, StepBatch
from agentrl.train.batching import TrainingBatch

__all__ = ["RolloutSide", "RunCallback", "RunSummary", "TrainSide", "overriding"]


class RunCallback:
    """Hooks called by the runner on the driver; override what you need."""

    def on_phase(self, phase: str, step: int) -> None:
        """When a named step starts (``collect_rollouts``, ``train_step``, ``sync_weights``,
        ``evaluate``, ``checkpoint``); ``step`` is the training step it belongs to (1-based)."""

    def on_rollout_progress(self, step: int, progress: RolloutProgress) -> None:
        """While ``collect_rollouts`` runs, every ``LoopSettings.progress_interval_s``: the groups
        accepted so far of the step's target, those running, the requests on the engines. Called only
        for callbacks that override it (the runner polls the rollout side for them)."""

    def on_warmup_progress(self, step: int, total_steps: int, metrics: dict[str, float]) -> None:
        """While the warm-up runs: each line it logs to ``warmup_metrics.jsonl`` (every
        ``warmup.log_every`` steps and at each check; ``metrics`` has ``loss``, ``lr`` and, at a
        check, ``token_accuracy``). ``total_steps`` is ``warmup.steps``, which a passed check may cut
        short. Called only for callbacks that override it, and only where the driver sees the
        trainer's run folder (one machine)."""

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> Awaitable[None] | None:
        """After step ``step`` (1-based) was trained, synced and recorded; may be ``async``."""

    def on_notice(self, text: str) -> None:
        """As it happens, something the run's user should know that did not stop it: data rows
        skipped (file, line, field), prompt groups that failed (by reason, with the first message), a
        step that changed no weight (why)."""

    def on_run_end(self, summary: RunSummary) -> None:
        """Once, when the run ends normally."""


class RolloutSide(Protocol):
    """What the runner needs of the rollout side (:class:`~agentrl.runner.RolloutService`, or a
    proxy to it in a Ray actor, whose methods hand these on to the service's)."""

    async def collect(self) -> StepBatch: ...
    async def progress(self) -> RolloutProgress | None: ...
    async def weights_folder(self, version: int) -> str: ...
    async def sync_weights(self, version: int) -> dict[str, float]: ...
    async def score(self, sequences: list[list[int]]) -> list[list[float]]: ...
    async def score_adapter(self, folder: str, sequences: list[list[int]]) -> dict[str, list[list[float]]]: ...
    async def evaluate(self, name: str) -> dict[str, Any]: ...
    async def evals_due(self, step: int, *, final: bool = False) -> list[str]: ...
    async def state_dict(self) -> dict[str, Any]: ...
    async def load_state_dict(self, state: dict[str, Any]) -> None: ...
    async def release_memory(self) -> None: ...
    async def resume_memory(self, tags: list[str] | None = None) -> None: ...
    async def data_problems(self) -> list[str]: ...


class TrainSide(Protocol):
    """What the runner needs of the trainer (every rank; results are rank 0's). The transports hand each
    method on to :class:`~agentrl.runner.trainer.TrainService`'s method of the same name."""

    async def train(self, batch: TrainingBatch, step: int) -> dict[str, float]: ...
    async def export(self, folder: str) -> str: ...
    async def score(self, sequences: list[list[int]]) -> list[list[float]]: ...
    async def score_teacher(self, sequences: list[list[int]]) -> list[list[float]]: ...
    async def probe_adapter(self, folder: str, sequences: list[list[int]], seed: int) -> dict[str, Any]: ...
    async def export_merged(self, folder: str) -> str: ...
    async def save(self, folder: str) -> str: ...
    async def load(self, folder: str) -> None: ...
    async def warmup(self, run_dir: str | None = None) -> dict[str, Any]: ...
    async def offload(self) -> dict[str, float]: ...
    async def onload(self) -> dict[str, float]: ...
    async def digest(self) -> str: ...


@dataclass
class RunSummary:
    """What a run did (written to ``summary.json``)."""

    steps: int = 0
    policy_version: int = 0
    resumed_from: str | None = None
    warmup: dict[str, Any] = field(default_factory=dict)
    initial_evals: dict[str, Any] = field(default_factory=dict)  # the at_start sets, before step 1
    stopped_because: str = ""
    wall_s: float = 0.0
    prompts_trained: int = 0
    last_metrics: dict[str, Any] = field(default_factory=dict)
    evals: dict[str, Any] = field(default_factory=dict)
    failed_groups: dict[str, int] = field(default_factory=dict)  # reason -> prompt groups that failed
    failure_examples: dict[str, str] = field(default_factory=dict)  # reason -> its first message
    error_examples: dict[str, str] = field(default_factory=dict)  # episode error kind -> its first message
    bad_rows: int = 0  # data rows skipped
    skipped_steps: int = 0  # steps that changed no weight (all advantages zero)
    adapter_check: dict[str, float] = field(default_factory=dict)  # LoRA: the start-up check's figures

    @property
    def weights_changed(self) -> bool:
        return self.steps > self.skipped_steps

    def running_state(self, wall_s: float) -> dict[str, Any]:
        """The running counts a checkpoint keeps (``wall_s``: the run's wall time so far), so that a resumed
        run's summary covers the whole run."""
        return {"prompts_trained": self.prompts_trained, "wall_s": wall_s, "failed_groups": dict(self.failed_groups),
                "failure_examples": dict(self.failure_examples), "error_examples": dict(self.error_examples),
                "bad_rows": self.bad_rows,
                "skipped_steps": self.skipped_steps, "warmup": dict(self.warmup)}

    def restore_running(self, state: dict[str, Any]) -> float:
        """Takes back the counts of :meth:`running_state`; returns the wall time of the run before it."""
        self.prompts_trained = int(state.get("prompts_trained", self.prompts_trained))
        self.failed_groups = dict(state.get("failed_groups", {}))
        self.failure_examples = dict(state.get("failure_examples", {}))
        self.error_examples = dict(state.get("error_examples", {}))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.bad_rows = max(self.bad_rows, int(state.get("bad_rows", 0)))
        self.warmup = dict(state.get("warmup") or self.warmup)
        return float(state.get("wall_s", 0.0))

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "policy_version": self.policy_version, "resumed_from": self.resumed_from,
                "stopped_because": self.stopped_because, "wall_s": self.wall_s,
                "prompts_trained": self.prompts_trained, "last_metrics": self.last_metrics, "evals": self.evals,
                "failed_groups": self.failed_groups, "failure_examples": self.failure_examples,
                "error_examples": self.error_examples,
                "bad_rows": self.bad_rows, "skipped_steps": self.skipped_steps,
                "weights_changed": self.weights_changed,
                **({"adapter_check": self.adapter_check} if self.adapter_check else {})}


def overriding(callbacks: Sequence[Any], hook: str) -> list[Any]:
    """The callbacks whose class overrides :class:`RunCallback`'s ``hook`` (the polled hooks are
    called only for them; duck-typed callbacks need not have the hook at all)."""
    base = getattr(RunCallback, hook)
    return [cb for cb in callbacks if getattr(type(cb), hook, base) is not base]
