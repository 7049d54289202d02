"""Step accounting for the fault tests: every prompt drawn is trained once, failed (counted), or still
waits in the scheduler's buffer; none is lost, none trained twice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.data import DataRow, DataSource
from agentrl.rollout.report import StepReport


class RecordingSource(DataSource):
    """A :class:`DataSource` that remembers the prompt ids it handed out."""

    drawn_ids: list[str]

    def draw(self, n: int) -> list[DataRow]:
        rows = super().draw(n)
        if not hasattr(self, "drawn_ids"):
            self.drawn_ids = []
        self.drawn_ids.extend(r.prompt_id for r in rows)
        return rows


def recording_rows(rows: Sequence[dict[str, Any]], seed: int = 0, shuffle: bool = True) -> RecordingSource:
    source = RecordingSource.from_rows(rows, seed=seed, shuffle=shuffle)
    assert isinstance(source, RecordingSource)
    source.drawn_ids = []
    return source


def check_steps(source: RecordingSource, reports: Sequence[StepReport], trained: Sequence[Sequence[str]],
                buffered: Sequence[str]) -> None:
    """Each step's outcomes add up; over the steps, no prompt is trained twice and every drawn prompt is
    trained, counted as failed, filtered or stale, or still buffered."""
    for report in reports:
        report.check()
    flat = [p for step in trained for p in step]
    assert len(flat) == len(set(flat)), f"a prompt was trained twice: {trained}"
    drawn = source.drawn_ids
    assert len(drawn) == len(set(drawn)), f"a prompt was drawn twice in one epoch: {drawn}"
    assert set(flat) | set(buffered) <= set(drawn)
    dropped = sum(sum(r.failed.values()) + sum(r.filtered.values()) + r.stale for r in reports)
    unaccounted = set(drawn) - set(flat) - set(buffered)
    assert len(unaccounted) == dropped, (
        f"{len(drawn)} prompts drawn, {len(flat)} trained, {len(buffered)} buffered, {dropped} counted as dropped, "
        f"but {len(unaccounted)} not trained or buffered: {sorted(unaccounted)}")
