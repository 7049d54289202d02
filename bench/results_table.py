"""The benchmark table: ``RESULT`` dicts of the ``bench/`` scripts in, one markdown page out.

Pure functions (no I/O, no clock), used by ``bench/run_all.py`` and tested in
``tests/unit/test_bench_run_all.py``. A bench's ``RESULT`` line is a JSON object, usually
``{"figures", "baseline", "ratios", "targets", "met"}``; the sections may nest (``figures.direct.
samples_per_s``), ``met`` may be a dict per target or one bool, and a bench may print a flat dict
instead (``warm_p50_ms``, ``warm_target_p50_ms``, ``warm_target_met``, ...), which
:func:`sections` sorts into the same five parts.

The ``RESULT`` shape names each target but does not say which baseline or ratio belongs to which
figure, so :func:`target_rows` pairs them by name: a ratio ``A_vs_B`` (or ``A_over_B``) sharing
words with the figure, then the baseline entry sharing the most words with the figure and the
ratio's other side. The pairing is shown by name in the table (``name = value``) so a reader can
check it, and every bench's whole ``RESULT`` is reproduced below the table.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "SECTIONS",
    "BenchRun",
    "Outcome",
    "Row",
    "flatten",
    "missing_sections",
    "progress_summary",
    "render_markdown",
    "sections",
    "target_rows",
]

SECTIONS = ("figures", "baseline", "ratios", "targets")
_STOP = frozenset({"s", "ms", "vs", "over", "per", "of", "the", "a", "to", "and", "baseline", "target"})
_LOWER_TOKENS = frozenset({"lag", "latency", "cpu", "failures", "errors", "overhead", "padding", "kb", "mb", "gib",
                           "bytes", "memory", "p50", "p95", "p99", "fraction", "stall"})
_LOWER_SUFFIXES = ("_s", "_ms", "_us", "_bytes", "_fraction")


class Outcome(str, Enum):
    """How one bench ended. ``FAILED`` and ``TIMED_OUT`` make ``run_all.py`` exit non-zero."""

    OK = "ok"
    NO_RESULT = "no RESULT line"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    SKIPPED = "skipped"

    @property
    def crashed(self) -> bool:
        return self in (Outcome.FAILED, Outcome.TIMED_OUT)


@dataclass(frozen=True)
class BenchRun:
    """One bench's run: its outcome, why (for anything but ``OK``), its wall time and its ``RESULT``."""

    name: str
    outcome: Outcome
    detail: str = ""
    wall_s: float | None = None
    result: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Row:
    """One target of one bench: the figure (a path into the RESULT), its value, what it is compared to."""

    bench: str
    figure: str
    value: Any
    target: Any
    direction: str  # "<=", ">=" or "" (not a number, or unknown)
    met: bool | None  # None: no value to judge
    baseline: tuple[str, Any] | None = None
    ratio: tuple[str, Any] | None = None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of nested dicts by dotted path (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); lists are leaves."""
    if not isinstance(tree, Mapping):
        return {prefix: tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def missing_sections(result: Mapping[str, Any]) -> list[str]:
    """Which of figures / baseline / ratios / targets a RESULT lacks (all four for a flat dict)."""
    return [name for name in SECTIONS if not isinstance(result.get(name), Mapping)]


def sections(result: Mapping[str, Any]) -> dict[str, Any]:
    """The five parts of a RESULT. A flat dict is sorted by key names: ``X_target_Y`` is the target
    of ``X_Y`` and ``X_target_met`` the verdict of the targets starting with ``X_``; keys with
    ``baseline`` are baselines, keys with ``_vs_``, ``speedup`` or ``ratio`` are ratios."""
    if any(isinstance(result.get(name), Mapping) for name in SECTIONS):
        return {name: dict(part) if isinstance(part := result.get(name), Mapping) else {} for name in SECTIONS
                } | {"met": result.get("met")}
    parts: dict[str, Any] = {name: {} for name in SECTIONS}
    verdicts: dict[str, Any] = {}
    for key, value in result.items():
        if key.endswith("_target_met"):
            verdicts[key.removesuffix("_target_met")] = value
        elif "_target_" in key:
            head, tail = key.split("_target_", 1)
            parts["targets"][f"{head}_{tail}"] = value
        elif key == "met":
            continue
        elif "baseline" in key:
            parts["baseline"][key] = value
        elif "_vs_" in key or "speedup" in key or "ratio" in key:
            parts["ratios"][key] = value
        else:
            parts["figures"][key] = value
    met: Any = result.get("met")
    if verdicts:
        met = {t: v for t in parts["targets"] for head, v in verdicts.items() if t.startswith(head + "_")}
    parts["met"] = met
    return parts


def _tokens(name: str) -> set[str]:
    return {t for t in re.split(r"[^a-z0-9]+", name.lower()) if t and t not in _STOP}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _sides(ratio: str) -> set[str]:
    """The words naming a ratio's baseline: ``B`` of ``A_vs_B``; both sides of ``A_over_B``."""
    leaf = ratio.rsplit(".", 1)[-1]
    if "_vs_" in leaf:
        return _tokens(leaf.split("_vs_", 1)[1])
    return _tokens(leaf) if "_over_" in leaf else set()


def _best(words: set[str], candidates: Mapping[str, Any], *, ties: bool) -> tuple[str, Any] | None:
    """The candidate sharing the most words (at least one); on a tie the first, or None if not ``ties``."""
    scored = [(len(words & _tokens(path)), path) for path, v in candidates.items() if _number(v)]
    top = max((s for s, _ in scored), default=0)
    best = [path for s, path in scored if s == top]
    if top == 0 or (len(best) > 1 and not ties):
        return None
    return best[0], candidates[best[0]]


def _lookup(figure: str, ratios: Mapping[str, Any], figures: Mapping[str, Any]) -> tuple[str, Any, bool] | None:
    """(path, value, is_ratio) of a target's figure: in the ratios, then the figures, then nested in them."""
    if figure in ratios:
        return figure, ratios[figure], True
    if figure in figures:
        return figure, figures[figure], False
    for pool, is_ratio in ((figures, False), (ratios, True)):
        for path, value in pool.items():
            if path.endswith("." + figure):
                return path, value, is_ratio
    return None


def _pair(figure: str, path: str, is_ratio: bool, parts: Mapping[str, Mapping[str, Any]]
          ) -> tuple[tuple[str, Any] | None, tuple[str, Any] | None]:
    """(baseline, ratio) belonging to one target's figure, by name."""
    ratios, baseline, figures = parts["ratios"], parts["baseline"], parts["figures"]
    ratio = (path, ratios[path]) if is_ratio else _best(_tokens(figure), ratios, ties=False)
    structural = [(p, v) for p, v in baseline.items() if p.startswith(figure + ".") and _number(v)]
    if structural:  # baseline {"qwen3": {"agent_loop_ms": ...}} for the target "qwen3"
        return structural[0], ratio
    other = _sides(ratio[0]) if ratio else set()
    words = other if is_ratio else other | _tokens(figure)
    found = _best(words, baseline, ties=True)
    if found is None and words:
        marked = {p: v for p, v in figures.items()
                  if "baseline" in p.lower() or (other and other & _tokens(p.rsplit(".", 1)[-1]))}
        found = _best(words, marked, ties=True)
    return found, ratio


def _direction(figure: str, value: Any, target: Any, met: bool | None) -> str:
    """``<=`` or ``>=``: from the bench's verdict when the value differs from the target, else from the name."""
    if not (_number(target)):
        return ""
    if met is not None and _number(value) and value != target:
        return "<=" if met == (value < target) else ">="
    name = figure.rsplit(".", 1)[-1].lower()
    if name.endswith("per_s") or "speedup" in name:
        return ">="
    if _tokens(name) & _LOWER_TOKENS or name.endswith(_LOWER_SUFFIXES):
        return "<="
    return ">="


def _verdict(met: Any, figure: str, n_targets: int) -> bool | None:
    if isinstance(met, bool):
        return met if n_targets == 1 else None
    if isinstance(met, Mapping):
        flat = flatten(met)
        found = flat.get(figure, flat.get(figure.rsplit(".", 1)[-1]))
        return found if isinstance(found, bool) else None
    return None


def target_rows(bench: str, result: Mapping[str, Any]) -> list[Row]:
    """One row per target of a bench's RESULT (none when it states no targets)."""
    parts = sections(result)
    flat = {name: flatten(parts[name]) for name in SECTIONS}
    rows = []
    for figure, target in flat["targets"].items():
        found = _lookup(figure, flat["ratios"], flat["figures"])
        path, value, is_ratio = found if found else (figure, None, False)
        said = _verdict(parts["met"], figure, len(flat["targets"]))
        direction = _direction(figure, value, target, said)
        met = said
        if met is None and _number(value) and _number(target) and direction:
            met = value <= target if direction == "<=" else value >= target
        if met is None and isinstance(parts["met"], bool) and value is not None:
            met = parts["met"]  # the bench's one verdict over all its targets
        if value is None:
            met = None
        baseline, ratio = _pair(figure, path, is_ratio, flat) if found else (None, None)
        rows.append(Row(bench, path, value, target, direction, met, baseline, ratio))
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if abs(value) >= 10_000 else f"{value:.4g}"
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").strip() or "—"


def _named(pair: tuple[str, Any] | None) -> str:
    return "—" if pair is None else f"`{pair[0]}` = {_fmt(pair[1])}"


def _mark(met: bool | None) -> str:
    return "❔ no value" if met is None else ("✅ pass" if met else "❌ miss")


def progress_summary(run: BenchRun) -> str:
    """One line for the console: the outcome, the wall time and how many targets were met."""
    took = f" in {run.wall_s:.1f} s" if run.wall_s is not None else ""
    head = f"{run.name}: {run.outcome.value}{took}"
    if run.detail:
        head += f" ({run.detail})"
    if run.result is None:
        return head
    rows = target_rows(run.name, run.result)
    if not rows:
        return head + "; no targets"
    missed = [r.figure for r in rows if r.met is False]
    unknown = [r.figure for r in rows if r.met is None]
    text = f"{head}; {sum(r.met is True for r in rows)}/{len(rows)} targets met"
    if missed:
        text += ", missed: " + ", ".join(missed)
    if unknown:
        text += ", no value: " + ", ".join(unknown)
    return text


def _benches(n: int) -> str:
    return f"{n} bench" if n == 1 else f"{n} benches"


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body]
    return lines


def _bench_note(run: BenchRun) -> str:
    notes = [run.detail] if run.detail else []
    if run.result is not None:
        lacks = missing_sections(run.result)
        if len(lacks) == len(SECTIONS):
            notes.append("flat RESULT (no figures/baseline/ratios/targets sections)")
        elif lacks:
            notes.append("RESULT lacks " + ", ".join(lacks))
    return "; ".join(notes)


def render_markdown(runs: Sequence[BenchRun], machine: Sequence[tuple[str, str]], *, command: str,
                    started: str) -> str:
    """The whole ``RESULTS.md`` page: machine, one row per target, every bench's outcome, raw RESULTs."""
    rows = [row for run in runs if run.result is not None for row in target_rows(run.name, run.result)]
    met = sum(r.met is True for r in rows)
    lines = ["# Benchmark results", "",
             f"Generated by `{command}` (started {started}). Each baseline is measured in the same run as its "
             "figure; targets come from each benchmark's issue. A missed target is a finding, not a failed run. "
             "Baselines and ratios are paired with a figure by name (shown as `name = value`); each bench's "
             "whole `RESULT` is at the end.", "",
             f"**{met} of {len(rows)} targets met** over {_benches(sum(r.result is not None for r in runs))} "
             f"with a RESULT; {sum(r.outcome.crashed for r in runs)} crashed or timed out, "
             f"{sum(r.outcome is Outcome.SKIPPED for r in runs)} skipped.", "", "## Machine", ""]
    lines += _table(("", ""), [(k, v) for k, v in machine])
    lines += ["", "## Targets", ""]
    body = [(r.bench, f"`{r.figure}`", _fmt(r.value), _named(r.baseline),
             "(this is the ratio)" if r.ratio and r.ratio[0] == r.figure else _named(r.ratio),
             f"{'≤' if r.direction == '<=' else '≥' if r.direction == '>=' else ''} {_fmt(r.target)}", _mark(r.met))
            for r in rows]
    lines += _table(("benchmark", "figure", "value", "baseline (same run)", "ratio", "target", "result"), body)
    lines += ["", "## Benchmarks", ""]
    bench_body = []
    for run in runs:
        own = target_rows(run.name, run.result) if run.result is not None else []
        score = f"{sum(r.met is True for r in own)}/{len(own)}" if own else "—"
        wall = "—" if run.wall_s is None else f"{run.wall_s:.1f}"
        bench_body.append((run.name, run.outcome.value, wall, score, _bench_note(run)))
    lines += _table(("benchmark", "outcome", "wall s", "targets met", "note"), bench_body)
    raw = [run for run in runs if run.result is not None]
    if raw:
        lines += ["", "## RESULT lines", ""]
        for run in raw:
            lines += [f"<details><summary>{run.name}</summary>", "", "```json",
                      json.dumps(run.result, indent=1, default=str), "```", "", "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"
