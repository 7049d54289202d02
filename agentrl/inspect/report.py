"""The run report: curves, the best and worst episodes, failure counts and the config, as HTML.

:func:`write_run_report` reads a run folder (while the run may still be writing it: see
:class:`~agentrl.inspect.RunFolder`) and writes, under ``out`` (default ``RUN/inspect``)::

    index.html                    the report (the curves embedded, so the page stands alone)
    plots/<curve>.png             one PNG per curve with data (see agentrl.inspect.plots.CURVES)
    episodes/step_<N>_<line>.html the viewer of each episode in the best / worst tables

:func:`write_file_report` does the same for a JSONL file of episodes or trajectories: a table of
every episode (with a text filter) and a viewer per episode, up to ``limit``.
"""

from __future__ import annotations

import base64
import html
import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.inspect._style import CSS
from agentrl.inspect.decode import TokenDecoder
from agentrl.inspect.files import RunFolder
from agentrl.inspect.html import page, write_viewer
from agentrl.inspect.index import EpisodeRow, RunIndex
from agentrl.inspect.plots import CURVES, curve_series, draw_curve
from agentrl.inspect.tables import composition_bar, filter_script, kind_order, rows_table

__all__ = ["write_file_report", "write_run_report"]


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _viewer_name(row: EpisodeRow) -> str:
    return f"step_{row.step:06d}_{row.line:05d}.html" if row.step is not None else f"line_{row.line:06d}.html"


def _write_viewers(index: RunIndex, rows: Sequence[EpisodeRow], out: Path,
                   decoder: TokenDecoder | None) -> dict[tuple[str, int], str]:
    links: dict[tuple[str, int], str] = {}
    for row in rows:
        key = (row.path, row.line)
        if key in links:
            continue
        name = _viewer_name(row)
        write_viewer(index.episode(row), out / "episodes" / name, decoder=decoder)
        links[key] = f"episodes/{name}"
    return links


def _plots_html(lines: Sequence[Mapping[str, Any]], out: Path) -> str:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "<p class=\"note\">no curves: matplotlib is not installed (pip install 'agentrl[inspect]')</p>"
    figures, missing = [], []
    for curve in CURVES:
        series = curve_series(curve, lines)
        if not series:
            missing.append(curve.title)
            continue
        png = draw_curve(curve, series, out / "plots" / f"{curve.name}.png")
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        figures.append(f'<figure style="margin:0"><img alt="{_esc(curve.title)}" src="data:image/png;base64,{data}" '
                       f'width="560" height="300"><figcaption><a href="plots/{curve.name}.png">{curve.name}.png'
                       f"</a></figcaption></figure>")
    grid = f'<div style="display:flex;flex-wrap:wrap;gap:10px">{"".join(figures)}</div>' if figures else \
        "<p>No metrics logged yet.</p>"
    note = f"<p class=\"note\">not logged (yet): {_esc(', '.join(missing))}</p>" if missing else ""
    return grid + note


def _counts_html(title: str, counts: Mapping[str, int]) -> str:
    if not counts:
        return f"<h3>{_esc(title)}</h3><p>none</p>"
    rows = "".join(f"<tr><td>{_esc(k)}</td><td class=\"num\">{v}</td></tr>"
                   for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f'<h3>{_esc(title)}</h3><table class="grid"><tr><th>kind</th><th>count</th></tr>{rows}</table>'


def _composition_html(index: RunIndex) -> str:
    by_step: dict[int | None, Counter[str]] = {}
    for row in index:
        counts = by_step.setdefault(row.step, Counter())
        for kind, n in row.kind_tokens:
            counts[kind] += n
    if not by_step:
        return "<p>no episodes saved yet</p>"
    total = index.kind_token_counts()
    legend = " ".join(f'<span><span class="sw sw-{_esc(k)}"></span>{_esc(k)} {total[k]}</span>' for k in kind_order(total))
    rows = "".join(f"<tr><td>{'-' if step is None else step}</td><td>{composition_bar(c, width=480)}</td></tr>"
                   for step, c in by_step.items())
    return f'<p>{legend}</p><table class="grid"><tr><th>step</th><th>tokens by provenance</th></tr>{rows}</table>'


def _state_html(folder: RunFolder, lines: Sequence[Mapping[str, Any]], index: RunIndex) -> str:
    summary = folder.summary()
    last = lines[-1] if lines else None
    if summary is not None:
        state = f"finished: {_esc(summary.get('stopped_because', 'summary.json written'))}"
        notes = _summary_notes(summary)
        if notes:
            state += "".join(f'</p><p class="note">{_esc(n)}' for n in notes)
    elif last is not None and isinstance(last.get("time"), int | float):
        state = f"running (or stopped without a summary): last step {last['step']} logged {time.time() - last['time']:.0f} s ago"
    else:
        state = "no step logged yet"
    return (f"<p>{state} · {len(lines)} metrics lines · {len(folder.trajectory_steps())} trajectory files · "
            f"{len(index)} episodes</p>")


def _summary_notes(summary: Mapping[str, Any]) -> list[str]:
    """What the run's summary says went wrong without stopping it: failed groups by reason (with
    the first message), skipped data rows, steps that changed no weight."""
    notes = []
    failed = summary.get("failed_groups") or {}
    if failed:
        examples = summary.get("failure_examples") or {}
        text = "; ".join(f"{reason} x{count}" + (f" (first: {examples[reason]})" if reason in examples else "")
                         for reason, count in sorted(failed.items(), key=lambda kv: -kv[1]))
        notes.append(f"Prompt groups that failed: {text}")
    if summary.get("bad_rows"):
        notes.append(f"{summary['bad_rows']} bad data row(s) skipped")
    steps, skipped = int(summary.get("steps") or 0), int(summary.get("skipped_steps") or 0)
    if steps and skipped == steps:
        notes.append(f"The weights never changed: all {steps} steps were skipped (every group's advantages were zero)")
    elif skipped:
        notes.append(f"{skipped} of {steps} steps changed no weight (advantages all zero)")
    return notes


def _config_html(folder: RunFolder) -> str:
    record = folder.config_record()
    if record is None:
        return "<p>no config.json</p>"
    text = json.dumps(record, indent=2, ensure_ascii=False, default=str)
    return f"<details><summary>config.json</summary><pre class=\"msg\">{_esc(text)}</pre></details>"


def write_run_report(run: str | os.PathLike[str] | RunFolder, out: str | os.PathLike[str] | None = None, *,
                     decoder: TokenDecoder | None = None, top: int = 5) -> Path:
    """Writes the report of a run folder (see the module doc); returns the path of ``index.html``.
    ``decoder``: token texts for the viewers (default: the run's tokenizer when it is on disk)."""
    folder = run if isinstance(run, RunFolder) else RunFolder(run)
    dest = Path(out) if out is not None else folder.root / "inspect"
    dest.mkdir(parents=True, exist_ok=True)
    decoder = decoder if decoder is not None else folder.decoder()
    lines = [line for line in folder.metrics() if not line.get("final")]
    index = RunIndex.of_run(folder)
    ranked = index.sorted_by_reward()
    best, worst = list(ranked[:top]), list(index.sorted_by_reward(descending=False)[:top])
    links = _write_viewers(index, [*best, *worst], dest, decoder)
    warnings = "".join(f'<p class="note">{_esc(w)}</p>' for w in folder.warnings)
    body = (f'<div class="arl"><style>{CSS}</style><h2>Run report · {_esc(folder.root.name)}</h2>'
            f"{_state_html(folder, lines, index)}{warnings}<h3>Curves</h3>{_plots_html(lines, dest)}"
            f"<h3>Where the tokens go</h3>{_composition_html(index)}"
            f"<h3>Best episodes</h3>{rows_table(best, links=links, table_id='best')}"
            f"<h3>Worst episodes</h3>{rows_table(worst, links=links, table_id='worst')}"
            f"{_counts_html('Failure kinds', index.failure_counts())}"
            f"{_counts_html('Episode errors', index.error_counts())}"
            f"{_counts_html('Stop reasons', index.stop_reason_counts())}<h3>Config</h3>{_config_html(folder)}</div>")
    path = dest / "index.html"
    path.write_text(page(f"agentrl run report · {folder.root.name}", body), encoding="utf-8")
    return path


def write_file_report(path: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                      decoder: TokenDecoder | None = None, limit: int = 500) -> Path:
    """Writes an index of a JSONL file's episodes and their viewers (the first ``limit``); returns ``index.html``."""
    source = Path(path)
    dest = Path(out) if out is not None else source.with_name(source.name.split(".")[0] + ".inspect")
    dest.mkdir(parents=True, exist_ok=True)
    index = RunIndex.of_file(source)
    links = _write_viewers(index, list(index[:limit]), dest, decoder)
    more = f"<p>viewers written for the first {limit} episodes</p>" if len(index) > limit else ""
    body = (f'<div class="arl"><style>{CSS}</style><h2>{_esc(source.name)} · {len(index)} episodes</h2>{more}'
            f"{rows_table(list(index), links=links, table_id='episodes', filter_box=True)}"
            f"{_counts_html('Failure kinds', index.failure_counts())}"
            f"{_counts_html('Episode errors', index.error_counts())}"
            f"{_counts_html('Stop reasons', index.stop_reason_counts())}</div>{filter_script()}")
    out_path = dest / "index.html"
    out_path.write_text(page(f"agentrl · {source.name}", body), encoding="utf-8")
    return out_path
