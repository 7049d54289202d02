"""Browsing many episodes: an index of a run folder (or a JSONL file) to filter, sort and open.

:class:`RunIndex` reads every episode record once and keeps one small :class:`EpisodeRow` per
episode (step, ids, reward, status, stop reason, failure kinds, episode errors by kind, tool calls, turns,
tokens) and where
to find the record again; :meth:`RunIndex.episode` loads the full episode on demand. Filters return
a new index; in Jupyter an index shows itself as a table and :meth:`RunIndex.group` shows the G
answers to one prompt side by side with their advantages.

Example::

    index = RunIndex.of_run("runs/exp1")
    bad = index.filter(failure="malformed_json", min_tool_calls=1)
    bad.episode(0)                       # an Episode; displays its viewer in Jupyter
    index.group(bad[0].group_id)         # the whole group, side by side
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from agentrl.episode import Episode
from agentrl.inspect.files import InspectError, RunFolder, episode_from_record, iter_records_file
from agentrl.trajectory import Status, TrajectoryError, _legacy_errors

__all__ = ["EpisodeRow", "RunIndex", "summarize_record"]


@dataclass(frozen=True)
class EpisodeRow:
    """One episode's summary and where its record lies (``path``, ``line``; ``step`` None for a plain file)."""

    path: str
    line: int
    step: int | None
    group_id: str | None
    rollout_id: str | None
    sample_id: str | None
    reward: float | None
    status: str
    stop_reason: str | None
    tool_calls: int
    failures: tuple[tuple[str, int], ...]
    turns: int
    response_tokens: int
    sequences: int
    kind_tokens: tuple[tuple[str, int], ...] = ()  # tokens per provenance kind over every sequence
    trained_tokens: int = 0
    errors: tuple[tuple[str, int], ...] = ()  # episode errors per kind (agentrl.trajectory.ErrorKind)

    @property
    def failure_kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind, _ in self.failures)

    @property
    def error_kinds(self) -> tuple[str, ...]:
        return tuple(kind for kind, _ in self.errors)


def _failures(metrics: Mapping[str, Any], env_info: Sequence[Any]) -> tuple[tuple[str, int], ...]:
    counts: Counter[str] = Counter()
    for key, value in metrics.items():
        if key.startswith("failures/") and isinstance(value, int | float) and value > 0:
            counts[key.split("/", 1)[1]] += int(value)
    if not counts:  # an environment that logs calls but whose metrics were not kept
        for info in env_info:
            for call in (info.get("calls") or []) if isinstance(info, Mapping) else []:
                if isinstance(call, Mapping) and call.get("failure"):
                    counts[str(call["failure"])] += 1
    return tuple(sorted(counts.items()))


def _errors(sequences: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, int], ...]:
    counts: Counter[str] = Counter()
    for seq in sequences:
        for error in seq.get("errors") or []:
            if isinstance(error, Mapping) and error.get("kind"):
                counts[str(error["kind"])] += 1
        info = seq.get("info")
        if isinstance(info, Mapping):  # a record written before errors were typed
            try:
                status = Status(seq.get("status", "pending"))
            except ValueError:
                status = Status.PENDING
            for error in _legacy_errors(dict(info), status):
                counts[error.kind.value] += 1
    return tuple(sorted(counts.items()))


def summarize_record(record: Mapping[str, Any], *, path: str, line: int, step: int | None) -> EpisodeRow:
    """The :class:`EpisodeRow` of one episode (or trajectory) record, read without validating it."""
    sequences = record.get("sequences") if "sequences" in record else [record]
    if not isinstance(sequences, list) or not sequences or not all(isinstance(s, Mapping) for s in sequences):
        raise InspectError(f"{path}:{line}: expected an episode record with a 'sequences' list or a trajectory record")
    last = sequences[-1]
    metrics = last.get("metrics") or {}
    env_info = record.get("env_info") or []
    tool_calls = metrics.get("tool_calls")
    if not isinstance(tool_calls, int | float):
        tool_calls = sum(len(m.get("tool_calls") or []) for m in last.get("messages") or [] if isinstance(m, Mapping))
    kinds: Counter[str] = Counter()
    trained = turns = 0
    for seq in sequences:
        for seg in seq.get("segments") or []:
            n = int(seg.get("end", 0)) - int(seg.get("start", 0))
            kinds[str(seg.get("kind"))] += n
            trained += n if seg.get("trainable") else 0
            turns += seg.get("kind") == "model"
    response = sum(len(s.get("tokens") or []) - int(s.get("prompt_length") or 0) for s in sequences)
    reward = last.get("reward")
    return EpisodeRow(path=path, line=line, step=step, group_id=last.get("group_id"), rollout_id=last.get("rollout_id"),
                      sample_id=last.get("sample_id"), reward=float(reward) if isinstance(reward, int | float) else None,
                      status=str(last.get("status", "pending")), stop_reason=last.get("stop_reason"),
                      tool_calls=int(tool_calls), failures=_failures(metrics, env_info), turns=turns,
                      response_tokens=response, sequences=len(sequences), kind_tokens=tuple(sorted(kinds.items())),
                      trained_tokens=trained, errors=_errors(sequences))


def _rows_of(path: Path, step: int | None) -> Iterator[EpisodeRow]:
    for lineno, record in iter_records_file(path):
        yield summarize_record(record, path=str(path), line=lineno, step=step)


class RunIndex(Sequence[EpisodeRow]):
    """An ordered, immutable list of :class:`EpisodeRow` with filters and loaders (see the module doc)."""

    def __init__(self, rows: Iterable[EpisodeRow], *, folder: RunFolder | None = None) -> None:
        self.rows: tuple[EpisodeRow, ...] = tuple(rows)
        self.folder = folder

    # -- building --------------------------------------------------------------------------------
    @classmethod
    def of_run(cls, root: str | os.PathLike[str] | RunFolder, *, steps: Iterable[int] | None = None) -> RunIndex:
        """Every saved episode of a run folder (``steps``: only those steps), in step and file order."""
        folder = root if isinstance(root, RunFolder) else RunFolder(root)
        wanted = folder.trajectory_steps() if steps is None else sorted(set(steps))
        rows: list[EpisodeRow] = []
        for step in wanted:
            try:
                rows.extend(_rows_of(folder.trajectory_path(step), step))
            except InspectError as exc:
                if Path(folder.trajectory_path(step)).exists():
                    raise
                folder.warnings.append(str(exc))  # rewound away while we read
        return cls(rows, folder=folder)

    @classmethod
    def of_file(cls, path: str | os.PathLike[str]) -> RunIndex:
        """Every episode of a JSONL file of episodes or trajectories (one row per line)."""
        return cls(_rows_of(Path(path), None))

    # -- sequence protocol -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> EpisodeRow: ...

    @overload
    def __getitem__(self, i: slice) -> RunIndex: ...

    def __getitem__(self, i: int | slice) -> EpisodeRow | RunIndex:
        if isinstance(i, slice):
            return RunIndex(self.rows[i], folder=self.folder)
        return self.rows[i]

    def __iter__(self) -> Iterator[EpisodeRow]:
        return iter(self.rows)

    # -- filters ---------------------------------------------------------------------------------
    def filter(self, *, step: int | Iterable[int] | None = None, min_reward: float | None = None,
               max_reward: float | None = None, stop_reason: str | Iterable[str] | None = None,
               status: str | Iterable[str] | None = None, failure: str | None = None,
               tool_calls: int | None = None, min_tool_calls: int | None = None,
               max_tool_calls: int | None = None, group_id: str | None = None,
               error: str | None = None) -> RunIndex:
        """The rows meeting every given condition. ``failure``: rows with that failure kind (``"any"``:
        with any failure); ``error``: rows with an episode error of that kind (``"any"``: with any).
        Strings may be enum members (``StopReason.MAX_TURNS``, ``ErrorKind.ENGINE``)."""
        steps = {step} if isinstance(step, int) else set(step) if step is not None else None
        stops = _names(stop_reason)
        statuses = _names(status)
        failure = str(getattr(failure, "value", failure)) if failure is not None else None
        error = str(getattr(error, "value", error)) if error is not None else None

        def keep(r: EpisodeRow) -> bool:
            return ((steps is None or r.step in steps)
                    and (min_reward is None or (r.reward is not None and r.reward >= min_reward))
                    and (max_reward is None or (r.reward is not None and r.reward <= max_reward))
                    and (stops is None or r.stop_reason in stops)
                    and (statuses is None or r.status in statuses)
                    and (failure is None or (bool(r.failures) if failure == "any" else failure in r.failure_kinds))
                    and (error is None or (bool(r.errors) if error == "any" else error in r.error_kinds))
                    and (tool_calls is None or r.tool_calls == tool_calls)
                    and (min_tool_calls is None or r.tool_calls >= min_tool_calls)
                    and (max_tool_calls is None or r.tool_calls <= max_tool_calls)
                    and (group_id is None or r.group_id == group_id))

        return RunIndex([r for r in self.rows if keep(r)], folder=self.folder)

    def sorted_by_reward(self, *, descending: bool = True) -> RunIndex:
        """Rows with a reward, best first (``descending``) or worst first."""
        rated = [r for r in self.rows if r.reward is not None]
        rated.sort(key=lambda r: (r.reward, -(r.step or 0), -r.line), reverse=descending)
        return RunIndex(rated, folder=self.folder)

    def failure_counts(self) -> Counter[str]:
        """Failure kind -> number of failures over every row."""
        counts: Counter[str] = Counter()
        for r in self.rows:
            for kind, n in r.failures:
                counts[kind] += n
        return counts

    def error_counts(self) -> Counter[str]:
        """Episode error kind -> number of errors over every row."""
        counts: Counter[str] = Counter()
        for r in self.rows:
            for kind, n in r.errors:
                counts[kind] += n
        return counts

    def kind_token_counts(self) -> Counter[str]:
        """Provenance kind -> tokens over every row (a forked episode's prompts count once per sequence)."""
        counts: Counter[str] = Counter()
        for r in self.rows:
            for kind, n in r.kind_tokens:
                counts[kind] += n
        return counts

    def stop_reason_counts(self) -> Counter[str]:
        return Counter(r.stop_reason or "-" for r in self.rows)

    # -- loading ---------------------------------------------------------------------------------
    def episode(self, which: int | EpisodeRow) -> Episode:
        """The full episode of a row (or of the row at position ``which``), validated."""
        row = self.rows[which] if isinstance(which, int) else which
        for lineno, record in iter_records_file(row.path):
            if lineno == row.line:
                try:
                    return episode_from_record(record)
                except TrajectoryError as exc:
                    raise InspectError(f"{row.path}:{lineno}: {exc}") from exc
        raise InspectError(f"{row.path}: no record on line {row.line} (was the file rewritten?)")

    def groups(self) -> dict[str | None, RunIndex]:
        """Group id -> that group's rows (file order)."""
        out: dict[str | None, list[EpisodeRow]] = {}
        for r in self.rows:
            out.setdefault(r.group_id, []).append(r)
        return {g: RunIndex(rows, folder=self.folder) for g, rows in out.items()}

    def group(self, group_id: str, *, step: int | None = None) -> Any:
        """The :class:`~agentrl.inspect.GroupView` of one group (its G episodes and advantages)."""
        from agentrl.inspect.group import GroupView

        rows = self.filter(group_id=group_id, step=step)
        if not rows:
            raise KeyError(f"group_id={group_id!r}: no such group in this index ({len(self.groups())} groups)")
        return GroupView.from_index(rows)

    # -- display ---------------------------------------------------------------------------------
    def to_html(self, *, limit: int = 200, links: Mapping[tuple[str, int], str] | None = None) -> str:
        """The rows as an HTML table (the first ``limit``); ``links`` maps ``(path, line)`` to a viewer URL."""
        from agentrl.inspect.tables import rows_table

        return rows_table(self.rows[:limit], links=links, total=len(self.rows))

    def _repr_html_(self) -> str:
        from agentrl.inspect._style import CSS

        return f'<div class="arl"><style>{CSS}</style>{self.to_html(limit=50)}</div>'

    def __repr__(self) -> str:
        where = f" of {self.folder.root}" if self.folder is not None else ""
        return f"RunIndex({len(self.rows)} episodes{where})"


def _names(value: str | Iterable[str] | None) -> set[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or hasattr(value, "value"):
        return {str(getattr(value, "value", value))}
    return {str(getattr(v, "value", v)) for v in value}
