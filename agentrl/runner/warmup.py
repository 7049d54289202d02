"""The supervised warm-up before RL (config section ``warmup``), on the trainer the run trains.

:func:`run_warmup` lays the conversations out with :class:`~agentrl.sft.TranscriptBuilder` (the
agent loop's exact tokens; only assistant tokens trained), runs ``warmup.steps`` supervised steps
of the run's train backend (torch or megatron: ``sft_step``), and with ``warmup.check`` measures,
every ``check.every_steps`` steps, the
share of trained tokens of held-out conversations that the model predicts with probability ≥ 0.5
(so they are its greedy choice). The warm-up ends early once that share reaches
``check.min_token_accuracy`` (after ``min_steps``); if it never does, :class:`WarmupError` says so
with the figures, before any RL step is spent on a model that cannot earn a reward.

With ``cooldown_steps`` the early end is not abrupt: from the step the check passed, the learning
rate falls linearly to zero over that many more steps (the decay phase of a warm-up-stable-decay
schedule, started by the check), and the check is measured again at the end; it must still pass.
At a high learning rate a behaviour the data only mixes in (the demo calls the tool in 40% of its
conversations) follows the last batches drawn, so an abrupt stop leaves it wherever it stood; the
cool-down lets the model settle on the data's mix (measured: docs/training.md). Afterwards the
optimiser state and step counter are reset, so RL starts with fresh moments at its own schedule.

The report (:class:`WarmupReport`) goes to ``warmup.json`` in the run folder, each logged step to
``warmup_metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.runner._warmup_section import WarmupSection
from agentrl.train.batching import TrainingBatch, TrainSequence

if TYPE_CHECKING:
    from agentrl.sft.transcript import TranscriptBuilder
    from agentrl.train.base import LogprobScorer, TrainBackend

__all__ = ["WarmupError", "WarmupReport", "run_warmup", "token_accuracy"]

_CONFIDENT = math.log(0.5)


class WarmupError(RuntimeError):
    """The warm-up could not run (bad data) or did not form the behaviour its check asks for."""


@dataclass
class WarmupReport:
    """What the warm-up did: steps, first/last loss, the checks ``(step, token_accuracy)``, time."""

    steps: int = 0
    conversations: int = 0
    first_loss: float | None = None
    last_loss: float | None = None
    checks: list[tuple[int, float]] = field(default_factory=list)
    passed: bool | None = None
    cooldown_from: int | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """Flat numbers for the run's metrics line (``warmup/...``)."""
        out = {"warmup/steps": float(self.steps), "warmup/seconds": self.seconds}
        if self.last_loss is not None:
            out["warmup/last_loss"] = self.last_loss
        if self.checks:
            out["warmup/token_accuracy"] = self.checks[-1][1]
        return out


def token_accuracy(backend: LogprobScorer, conversations: list[list[TrainSequence]]) -> float:
    """Share of the trained tokens of ``conversations`` whose logprob under the model is ≥ log 0.5."""
    sequences = [s for conv in conversations for s in conv]
    scored = backend.compute_logprobs(TrainingBatch.from_sequences(sequences))
    hit = total = 0
    for seq, logprobs in zip(sequences, scored, strict=True):
        for i in range(1, len(seq.tokens)):
            if seq.loss_mask[i]:
                total += 1
                hit += logprobs[i] >= _CONFIDENT
    return hit / total if total else 0.0


def _load(path: str, builder: TranscriptBuilder, what: str) -> list[list[TrainSequence]]:
    from agentrl.sft.trainer import SftDataError, load_sft_sequences

    try:
        return load_sft_sequences(path, builder)
    except SftDataError as exc:
        raise WarmupError(f"{what}: {exc}") from None


def run_warmup(backend: TrainBackend, section: WarmupSection, builder: TranscriptBuilder, *,
               run_dir: str | Path | None = None,
               on_step: Callable[[int, dict[str, float]], None] | None = None) -> WarmupReport:
    """Runs the warm-up on ``backend`` (see the module doc); ``builder``: the run's transcript builder."""
    from agentrl.sft.trainer import plan_batches

    started = time.perf_counter()
    conversations = _load(section.data, builder, "warmup.data")
    held_out = _load(section.check.path, builder, "warmup.check.path")[:section.check.max_conversations] \
        if section.check is not None else []
    cooldown = section.cooldown_steps  # the section refuses one without a check
    batches = plan_batches(len(conversations), batch_size=section.batch_size, steps=section.steps + cooldown,
                           shuffle=section.shuffle, seed=section.seed)
    report = WarmupReport(conversations=len(conversations))
    log = Path(run_dir) / "warmup_metrics.jsonl" if run_dir is not None else None
    last = section.steps  # the last step to run; the check passing moves it
    decay_lr = 0.0
    for step, picked in enumerate(batches, start=1):
        if step > last:
            break
        if report.cooldown_from is None:
            lr = section.optimizer.lr_at(step - 1, section.steps)
        else:  # linear to zero: the cool-down's k-th step of n runs at (n + 1 - k) / (n + 1) of the start
            lr = decay_lr * (last + 1 - step) / (cooldown + 1)
        for group in backend.optimizer.param_groups:
            group["lr"] = lr
        metrics = backend.sft_step(TrainingBatch.from_sequences([s for i in picked for s in conversations[i]]))
        metrics["lr"] = lr
        if report.cooldown_from is not None:
            metrics["cooldown_to"] = last  # the warm-up's new last step, for the progress display
        report.steps = step
        report.first_loss = metrics["loss"] if report.first_loss is None else report.first_loss
        report.last_loss = metrics["loss"]
        checking = section.check is not None and (
            step == last or (report.cooldown_from is None and step % section.check.every_steps == 0))
        if checking:
            metrics["token_accuracy"] = token_accuracy(backend, held_out)
            report.checks.append((step, metrics["token_accuracy"]))
        if log is not None and (checking or step % section.log_every == 0 or step == last):
            with log.open("a", encoding="utf-8") as f:
                f.write(json.dumps({**metrics, "step": step}) + "\n")  # the warm-up's own step number
        if on_step is not None:
            on_step(step, metrics)
        if checking and section.check is not None and report.cooldown_from is None and \
                step >= section.min_steps and metrics["token_accuracy"] >= section.check.min_token_accuracy:
            if not cooldown:
                break
            report.cooldown_from, last, decay_lr = step, step + cooldown, lr
    report.seconds = time.perf_counter() - started
    _reset_optimizer(backend)
    if section.check is not None:
        report.passed = report.checks[-1][1] >= section.check.min_token_accuracy
        if run_dir is not None:
            (Path(run_dir) / "warmup.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        if not report.passed:
            history = ", ".join(f"{a:.3f} at step {s}" for s, a in report.checks[-4:])
            if report.cooldown_from is not None:
                raise WarmupError(
                    f"warm-up: the check passed at step {report.cooldown_from} but after the cool-down "
                    f"(warmup.cooldown_steps={cooldown}) the model predicts {report.checks[-1][1]:.1%} of the "
                    f"held-out assistant tokens ({section.check.path}) with p >= 0.5, below "
                    f"warmup.check.min_token_accuracy={section.check.min_token_accuracy} (checks: {history}). "
                    "Expected fewer warmup.cooldown_steps or a higher warmup.min_steps")
            raise WarmupError(
                f"warm-up: after {report.steps} steps the model predicts {report.checks[-1][1]:.1%} of the held-out "
                f"assistant tokens ({section.check.path}) with p >= 0.5, below warmup.check.min_token_accuracy="
                f"{section.check.min_token_accuracy} (checks: {history}); the behaviour RL depends on has not "
                "formed, so RL would see no reward. Expected more warmup.steps, another warmup.optimizer.lr, or "
                "more or easier warm-up data")
    elif run_dir is not None:
        (Path(run_dir) / "warmup.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report


def _reset_optimizer(backend: TrainBackend) -> None:
    """Fresh Adam moments and step counter for RL (the warm-up's are for another objective and lr).
    Megatron's ``ChainedOptimizer`` shows its optimizers' states through a proxy that cannot be
    cleared, so each chained optimizer's own state is (the torch backend has one plain optimizer)."""
    optimizer = backend.optimizer
    for inner in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner.state.clear()
    backend.step = 0
