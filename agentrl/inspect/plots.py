"""Curves over training steps from ``metrics.jsonl``, drawn with matplotlib's Agg renderer
(a bare ``Figure``: no display, no pyplot state).

:data:`CURVES` names each plot and the metric keys it draws (the keys the runner writes: see
:func:`agentrl.runner.loop.step_metrics` and the trainer's ``mismatch/*``); a key pattern ending in
``*`` matches one key segment (eval sets: ``eval/<name>/pass@1``, their accuracy). A plot whose keys
no line has yet is skipped and listed as not logged.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CURVES", "Curve", "curve_series", "draw_curve"]


@dataclass(frozen=True)
class Curve:
    """One plot: file ``name``.png, a title, the y label and the metric keys (or ``prefix*/suffix``)."""

    name: str
    title: str
    ylabel: str
    keys: tuple[str, ...]


CURVES: tuple[Curve, ...] = (
    Curve("reward", "Reward", "mean reward", ("rollout/reward_mean", "eval/*/mean_reward")),
    Curve("accuracy", "Accuracy", "accuracy", ("rollout/accuracy", "eval/*/pass@1")),
    Curve("tool_calls", "Tool calls per episode", "calls", ("rollout/tool_calls_per_episode",
                                                            "eval/*/tool_calls_per_episode")),
    Curve("truncation", "Truncation and failures", "rate", ("rollout/truncation_rate", "report/metrics/failure_rate",
                                                            "report/metrics/abort_rate")),
    Curve("mismatch", "Engine / trainer logprob mismatch", "|logprob difference|",
          ("mismatch/mean", "mismatch/p90", "mismatch/max")),
    Curve("moe_routing", "MoE routing: trainer vs engine", "share of positions",
          ("train/moe/routing_differs", "train/moe/router_disagrees")),
    Curve("throughput", "Rollout throughput", "tokens / s", ("report/metrics/tokens_per_s",)),
    Curve("staleness", "Staleness", "policy versions behind", ("rollout/staleness_max",)),
    Curve("context", "Sequences and compactions per episode", "per episode",
          ("report/metrics/sequences_per_episode", "report/metrics/context/compactions_per_episode",
           "report/metrics/context/summaries_per_episode")),
    Curve("distill", "Distillation: the samples under teacher and student", "per sampled token",
          ("distill/reverse_kl", "distill/teacher_logprob", "distill/student_logprob", "distill/teacher_share")),
)


def _matches(pattern: str, keys: Sequence[str]) -> list[str]:
    if "*" not in pattern:
        return [pattern] if pattern in keys else []
    regex = re.compile("^" + re.escape(pattern).replace(r"\*", "[^/]+") + "$")
    return sorted(k for k in keys if regex.match(k))


def curve_series(curve: Curve, lines: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Metric key -> ``[(step, value)]`` for the keys of ``curve`` that some line has (finite numbers only)."""
    keys = sorted({k for line in lines for k in line})
    out: dict[str, list[tuple[int, float]]] = {}
    for pattern in curve.keys:
        for key in _matches(pattern, keys):
            points = [(int(line["step"]), float(line[key])) for line in lines
                      if isinstance(line.get(key), int | float) and not isinstance(line.get(key), bool)
                      and math.isfinite(float(line[key]))]
            if points:
                out[key] = points
    return out


def draw_curve(curve: Curve, series: Mapping[str, Sequence[tuple[int, float]]], path: str | os.PathLike[str]) -> Path:
    """Writes the PNG of one curve; returns its path."""
    from matplotlib.figure import Figure  # no pyplot: no backend switch, none of a notebook's state touched
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(5.6, 3.0), dpi=100)
    ax = fig.add_subplot()
    for key, points in series.items():
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o" if len(points) < 30 else None, markersize=3, linewidth=1.4, label=key)
    ax.set_title(curve.title, fontsize=11)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(curve.ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
