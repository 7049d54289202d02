"""HTML tables of episode rows (the index, the report's best and worst), with a text filter."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.inspect.index import EpisodeRow

__all__ = ["FILTER_SCRIPT", "composition_bar", "filter_script", "kind_order", "rows_table"]

_HEAD = ("step", "sample", "group", "reward", "status", "stop reason", "tool calls", "failures", "errors",
         "turns", "response tokens", "sequences", "tokens by provenance")
_KIND_ORDER = ("prompt", "model", "tool", "user", "scaffold")

# Typing in the box hides the rows whose text does not contain it (every word, any order).
FILTER_SCRIPT = """
(function(){document.querySelectorAll('input.arl-filter').forEach(function(box){
var table=document.getElementById(box.getAttribute('data-table'));if(!table)return;
box.addEventListener('input',function(){var words=box.value.toLowerCase().split(/\\s+/).filter(Boolean);
table.querySelectorAll('tbody tr').forEach(function(tr){var text=tr.textContent.toLowerCase();
tr.style.display=words.every(function(w){return text.indexOf(w)>=0;})?'':'none';});});});})();
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def kind_order(kinds: Iterable[str]) -> list[str]:
    """Provenance kinds in the viewer's order (prompt, model, tool, user, scaffold, then others)."""
    present = set(kinds)
    return [k for k in _KIND_ORDER if k in present] + sorted(present - set(_KIND_ORDER))


def composition_bar(kind_tokens: Mapping[str, int] | Sequence[tuple[str, int]], *, width: int = 160) -> str:
    """A bar split by provenance kind (widths by token count), in the viewer's colours."""
    counts = dict(kind_tokens)
    total = sum(counts.values())
    if total <= 0:
        return ""
    parts = []
    for kind in kind_order(counts):
        n = counts.get(kind, 0)
        if n > 0:
            parts.append(f'<span class="b-{_esc(kind)}" title="{_esc(kind)} {n}" style="display:inline-block;'
                         f'height:12px;width:{100 * n / total:.2f}%"></span>')
    return (f'<span style="display:inline-flex;width:{width}px;vertical-align:middle;background:#fff">'
            + "".join(parts) + "</span>")


def _cells(row: EpisodeRow, link: str | None) -> list[str]:
    sample = _esc(row.sample_id or row.rollout_id or f"line {row.line}")
    if link is not None:
        sample = f'<a href="{_esc(link)}">{sample}</a>'
    failures = ", ".join(f'<span class="fk">{_esc(k)}</span> ×{n}' for k, n in row.failures) or ""
    errors = ", ".join(f'<span class="fk">{_esc(k)}</span> ×{n}' for k, n in row.errors) or ""
    reward = f"{row.reward:.4g}" if row.reward is not None else "-"
    return ["-" if row.step is None else str(row.step), sample, _esc((row.group_id or "-")[:12]),
            f'<span class="num">{reward}</span>', _esc(row.status), _esc(row.stop_reason or "-"),
            str(row.tool_calls), failures, errors, str(row.turns), str(row.response_tokens), str(row.sequences),
            composition_bar(row.kind_tokens)]


def rows_table(rows: Sequence[EpisodeRow], *, links: Mapping[tuple[str, int], str] | None = None,
               total: int | None = None, table_id: str = "episodes", filter_box: bool = False) -> str:
    """An HTML table of ``rows``; ``links`` maps ``(path, line)`` to a viewer URL for the sample cell."""
    links = links or {}
    head = "".join(f"<th>{h}</th>" for h in _HEAD)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in _cells(r, links.get((r.path, r.line)))) + "</tr>"
                   for r in rows)
    more = "" if total is None or total <= len(rows) else f"<p>showing {len(rows)} of {total} episodes</p>"
    box = ""
    if filter_box:
        box = (f'<p><input class="arl-filter" data-table="{_esc(table_id)}" placeholder="filter rows: words that '
               f'must all appear (e.g. max_turns malformed_json)" size="70"></p>')
    return (f'{box}<table class="grid" id="{_esc(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            f"</table>{more}")


def filter_script() -> str:
    """The row filter's script tag (once per page)."""
    return f"<script>{FILTER_SCRIPT}</script>"

