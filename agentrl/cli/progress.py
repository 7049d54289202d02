"""What a run shows while it trains, as :class:`~agentrl.runner.RunCallback` objects.

- :class:`LiveProgress`: a ``rich`` live display (on a terminal): the step bar with its ETA, the
  phase running now (``collect_rollouts``, ``train_step``, ...) with how long it has run (for the
  rollouts: groups accepted of the step's target, groups and requests running), and the
  last step's reward, accuracy, rollout throughput and step time;
- :class:`PlainProgress`: one line per step (not a terminal, or ``--quiet``), e.g.
  ``step 3/10 reward=0.500 accuracy=0.250 tokens/s=1234 step_s=2.10 eta=0:00:14`` (and
  ``errors=engine:2,reward:1`` when episodes of the step had errors), and during a
  long rollout phase a line every 10 s: ``step 3 collect_rollouts: 5/8 groups, 3 running, ...``;
  during the warm-up, a line every 10 s from what it logs: ``warm-up step 150/600: loss 0.0412,
  token accuracy 0.953`` (the live display shows the same as a bar);
- :class:`RunEndSummary`: one screen at the end: the run folder's path and what is in it, why the
  run stopped, the last figures and the final evaluations.

:func:`progress_callbacks` picks them for a config; ``agentrl.run(config, callbacks=...)`` users
can pass them too.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from agentrl.rollout.scheduler import RolloutProgress
from agentrl.runner.loop import RunCallback, RunSummary

__all__ = ["LiveProgress", "PlainProgress", "RunEndSummary", "StepFigures", "progress_callbacks", "rollout_line", "warmup_line"]

# (label, metrics key, format) of the figures shown per step
_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("reward", "rollout/reward_mean", "{:.3f}"),
    ("accuracy", "rollout/accuracy", "{:.3f}"),
    ("tokens/s", "report/metrics/tokens_per_s", "{:.0f}"),
    ("samples/s", "report/metrics/samples_per_s", "{:.1f}"),
    ("step_s", "time/step_s", "{:.2f}"),
)


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class StepFigures:
    """The per-step numbers both displays show: figures of the last step, mean step time, ETA."""

    def __init__(self, total_steps: int | None) -> None:
        self.total = total_steps
        self.step = 0
        self.first_step: int | None = None
        self.started = time.monotonic()
        self.last: dict[str, str] = {}

    def begin(self, step: int) -> None:
        """The first phase of this process's first step (a resumed run counts from there).

        Step 0's phases (the warm-up, the first sync, the evaluations at start) are not RL steps:
        counting them would spread the warm-up's minutes over the steps' ETA.
        """
        if self.first_step is None and step >= 1:
            self.first_step, self.started = step - 1, time.monotonic()

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.begin(step)
        self.step = step
        self.last = {label: fmt.format(metrics[key]) for label, key, fmt in _FIGURES
                     if isinstance(metrics.get(key), int | float)}
        errors = [f"{key.removeprefix('report/errors/')}:{value}" for key, value in sorted(metrics.items())
                  if key.startswith("report/errors/") and isinstance(value, int) and value > 0]
        if errors:  # episode errors by kind, only when the step had some
            self.last["errors"] = ",".join(errors)
        if metrics.get("train/skipped") == 1.0:  # the weights did not change: say so on the step's line
            self.last["update"] = "skipped(no-advantage)"

    def eta_s(self) -> float | None:
        if self.total is None or self.first_step is None or self.step <= self.first_step:
            return None
        per_step = (time.monotonic() - self.started) / (self.step - self.first_step)
        return max(self.total - self.step, 0) * per_step

    def line(self) -> str:
        total = f"/{self.total}" if self.total is not None else ""
        figures = " ".join(f"{k}={v}" for k, v in self.last.items())
        return f"step {self.step}{total} {figures} eta={_clock(self.eta_s())}".replace("  ", " ")


def rollout_line(progress: RolloutProgress) -> str:
    """``5/8 groups, 3 running, 12 requests, 31 s``: a step's rollouts so far."""
    text = f"{progress.accepted_groups}/{progress.target_groups} groups, {progress.running_groups} running, " \
           f"{progress.inflight_requests} requests"
    if progress.rejected_groups:
        text += f", {progress.rejected_groups} filtered"
    return f"{text}, {progress.elapsed_s:.0f} s"


def warmup_line(figures: Mapping[str, float]) -> str:
    """``loss 0.412, token accuracy 0.912``: the warm-up's last loss and last check (when it had one),
    and ``cool-down`` once the check passed and the learning rate decays (``warmup.cooldown_steps``)."""
    parts = [f"loss {figures['loss']:.4f}"] if "loss" in figures else []
    if "token_accuracy" in figures:
        parts.append(f"token accuracy {figures['token_accuracy']:.3f}")
    if "cooldown_to" in figures:
        parts.append("cool-down")
    return ", ".join(parts) or "started"


class PlainProgress(RunCallback):
    """One line per step on ``stream`` (default stdout), flushed; ``phases``: a line per phase too.
    While a step collects its rollouts, and while the warm-up runs, a line at most every
    ``rollout_every_s`` seconds says how far it got (``None``: no such lines)."""

    def __init__(self, total_steps: int | None, *, stream: IO[str] | None = None, phases: bool = False,
                 rollout_every_s: float | None = 10.0) -> None:
        self.figures = StepFigures(total_steps)
        self.stream = stream if stream is not None else sys.stdout
        self.phases = phases
        self.rollout_every_s = rollout_every_s
        self._last_rollout_line = time.monotonic()
        self._last_warmup_line = -math.inf  # the warm-up's first line is printed at once
        self._warmup: dict[str, float] = {}  # its figures so far (a check's accuracy stays until the next)

    def on_rollout_progress(self, step: int, progress: RolloutProgress) -> None:
        now = time.monotonic()
        if self.rollout_every_s is None or now - self._last_rollout_line < self.rollout_every_s:
            return
        self._last_rollout_line = now
        print(f"step {step} collect_rollouts: {rollout_line(progress)}", file=self.stream, flush=True)

    def on_warmup_progress(self, step: int, total_steps: int, metrics: dict[str, float]) -> None:
        self._warmup.update(metrics)
        now = time.monotonic()
        if self.rollout_every_s is None or now - self._last_warmup_line < self.rollout_every_s:
            return
        self._last_warmup_line = now
        print(f"warm-up step {step}/{total_steps}: {warmup_line(self._warmup)}", file=self.stream, flush=True)

    def on_phase(self, phase: str, step: int) -> None:
        self.figures.begin(step)
        if self.phases:
            print(f"step {step} {phase}", file=self.stream, flush=True)

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.figures.update(step, metrics)
        print(self.figures.line(), file=self.stream, flush=True)

    def on_notice(self, text: str) -> None:
        print(f"warning: {text}", file=self.stream, flush=True)


class LiveProgress(RunCallback):
    """The ``rich`` live display (see the module doc); ``console``: where it draws (default stdout)."""

    def __init__(self, total_steps: int | None, *, console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console if console is not None else Console()
        self.figures = StepFigures(total_steps)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"),
                                 console=self.console)
        self.steps = self.progress.add_task("steps", total=total_steps, eta="?")
        self.phase = self.progress.add_task("starting", total=None, eta="")
        self._warmup: dict[str, float] = {}
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False,
                         get_renderable=self._render)
        self.live.start()

    def _render(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        table = Table.grid(padding=(0, 2))
        table.add_row(*(f"{k} [bold]{v}[/]" for k, v in self.figures.last.items()) or ("waiting for the first step",))
        return Group(self.progress, table)

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def on_phase(self, phase: str, step: int) -> None:
        self.figures.begin(step)
        self.progress.reset(self.phase, description=f"step {step}: {phase}", total=None)

    def on_warmup_progress(self, step: int, total_steps: int, metrics: dict[str, float]) -> None:
        self._warmup.update(metrics)
        self.progress.update(self.phase, description=f"warm-up ({warmup_line(self._warmup)})",
                             total=total_steps, completed=step)

    def on_rollout_progress(self, step: int, progress: RolloutProgress) -> None:
        self.progress.update(self.phase, description=f"step {step}: collect_rollouts ({rollout_line(progress)})",
                             total=progress.target_groups, completed=progress.accepted_groups)

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.figures.update(step, metrics)
        self.progress.update(self.steps, completed=step, eta=_clock(self.figures.eta_s()))
        self.live.refresh()

    def on_run_end(self, summary: RunSummary) -> None:
        self.close()

    def on_notice(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/] {text}", markup=True, highlight=False)

    def close(self) -> None:
        """Stops the display (idempotent); call it when a run ends by an error too."""
        if self.live.is_started:
            self.progress.update(self.phase, visible=False)
            self.live.stop()


class RunEndSummary(RunCallback):
    """Prints the one-screen summary when the run ends (see the module doc)."""

    def __init__(self, run_dir: str | Path, *, console: Any = None) -> None:
        self.run_dir = Path(run_dir)
        self.console = console
        self.last: dict[str, Any] = {}
        self.started = time.monotonic()  # the command's start: its wall time includes warm-up and start-up

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.last = dict(metrics)

    def on_run_end(self, summary: RunSummary) -> None:
        from rich.console import Console
        from rich.table import Table

        console = self.console if self.console is not None else Console()
        table = Table(title="run summary", show_header=False)
        table.add_row("run folder", str(self.run_dir.resolve()))
        table.add_row("steps", f"{summary.steps} ({summary.stopped_because or 'ended'})")
        table.add_row("wall", f"{_clock(time.monotonic() - self.started)} in all, "
                              f"{_clock(summary.wall_s)} of them in the RL steps")
        warm = summary.warmup
        if warm:
            checks = warm.get("checks") or []
            check = f", check {checks[-1][1]:.3f} at step {checks[-1][0]}" if checks else ""
            table.add_row("warm-up", f"{warm.get('steps', 0)} steps in {_clock(warm.get('seconds'))}{check}")
        if summary.resumed_from:
            table.add_row("resumed from", summary.resumed_from)
        if summary.failed_groups:
            from agentrl.runner.loop import failures_text

            table.add_row("failed groups", failures_text(summary.failed_groups, summary.failure_examples))
        if summary.bad_rows:
            table.add_row("bad data rows", f"{summary.bad_rows} skipped (listed when the run started)")
        if summary.steps and not summary.weights_changed:
            table.add_row("weights", f"never changed: all {summary.steps} steps were skipped (every group's "
                                     "advantages were zero)")
        elif summary.skipped_steps:
            table.add_row("skipped steps", f"{summary.skipped_steps} of {summary.steps} (advantages all zero)")
        for label, key, fmt in _FIGURES:
            if isinstance(self.last.get(key), int | float):
                table.add_row(f"last {label}", fmt.format(self.last[key]))
        for name, report in summary.evals.items():
            if isinstance(report, Mapping):
                passes = ", ".join(f"pass@{k} {v:.3f}" for k, v in (report.get("pass_at_k") or {}).items())
                before = summary.initial_evals.get(name)
                change = ""
                if isinstance(before, Mapping) and before is not report:
                    change = f" (before step 1: {before.get('mean_reward', 0.0):.3f}, tool calls " \
                             f"{before.get('tool_call_rate', 0.0):.2f} -> {report.get('tool_call_rate', 0.0):.2f})"
                table.add_row(f"eval {name}",
                              f"mean reward {report.get('mean_reward', 0.0):.3f} {passes}{change}".strip())
        present = [p for p in ("metrics.jsonl", "summary.json", "checkpoints", "trajectories", "tensorboard", "logs")
                   if (self.run_dir / p).exists()]
        table.add_row("contents", ", ".join(present) or "-")
        report = self.run_dir / "inspect" / "index.html"
        table.add_row("report", str(report) if report.is_file() else f"agentrl inspect {self.run_dir} (writes the HTML report)")
        console.print(table)


def progress_callbacks(total_steps: int | None, run_dir: str | Path, *, quiet: bool = False,
                       console: Any = None) -> list[RunCallback]:
    """The live display on a terminal (plain lines when ``quiet`` or not a terminal), then the summary."""
    from rich.console import Console

    console = console if console is not None else Console()
    shown: RunCallback = PlainProgress(total_steps, stream=console.file) if quiet or not console.is_terminal \
        else LiveProgress(total_steps, console=console)
    return [shown, RunEndSummary(run_dir, console=console)]
