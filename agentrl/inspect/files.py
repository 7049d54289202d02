"""Reading what a run left on disk, read-only and without importing the runner (torch, Ray).

:class:`RunFolder` reads a run folder (see :mod:`agentrl.runner.rundir` for the layout) while the
run may still be writing it: a torn last ``metrics.jsonl`` line is skipped, a missing
``summary.json`` means the run is still going (or died), trajectory files are read whole (the
writer renames them into place). :func:`read_episodes_file` reads trajectories saved anywhere: a
JSONL (optionally gzipped) of :class:`~agentrl.Episode` records (``save_episodes``), of
:class:`~agentrl.Trajectory` records (``save_jsonl``; consecutive sequences of one rollout become
one episode) or a run folder's step file (its header line is skipped).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from agentrl._runfiles import TRAJECTORY_FILE_RE, parse_metrics_lines
from agentrl.episode import Episode
from agentrl.inspect.decode import TokenDecoder, token_decoder
from agentrl.trajectory import Trajectory, TrajectoryError

__all__ = ["InspectError", "RunFolder", "episode_from_record", "iter_records_file", "read_episodes_file"]


class InspectError(ValueError):
    """A file or folder to inspect is missing or unreadable; the message names it."""


def _open(path: Path) -> Any:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _is_header(record: Any) -> bool:
    return isinstance(record, dict) and "config_hash" in record and "sequences" not in record and "tokens" not in record


def iter_records_file(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for every JSON object line of a (gzipped) JSONL file, headers skipped."""
    file = Path(path)
    try:
        with _open(file) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                record = orjson.loads(line)
                if not isinstance(record, dict):
                    raise InspectError(f"{file}:{lineno}: expected a JSON object, got {type(record).__name__}")
                if not _is_header(record):
                    yield lineno, record
    except FileNotFoundError:
        raise InspectError(f"{file}: no such file") from None
    except (OSError, EOFError, orjson.JSONDecodeError) as exc:
        raise InspectError(f"{file}: unreadable ({type(exc).__name__}: {exc})") from exc


def episode_from_record(record: dict[str, Any]) -> Episode:
    """An episode record as an :class:`Episode`; a trajectory record as a one-sequence episode."""
    if "sequences" in record:
        return Episode.from_dict(record)
    return Episode(sequences=[Trajectory.from_dict(record)])


def read_episodes_file(path: str | os.PathLike[str]) -> list[tuple[int, Episode]]:
    """``(first line number, episode)`` for each episode of a JSONL file (see the module doc)."""
    out: list[tuple[int, Episode]] = []
    for lineno, record in iter_records_file(path):
        try:
            episode = episode_from_record(record)
        except TrajectoryError as exc:
            raise InspectError(f"{os.fspath(path)}:{lineno}: {exc}") from exc
        prev = out[-1][1] if out else None
        seq = episode.sequences[0]
        if ("sequences" not in record and prev is not None and seq.sequence_index > 0
                and prev.trajectory.rollout_id == seq.rollout_id
                and prev.trajectory.sequence_index == seq.sequence_index - 1):
            prev.sequences.append(seq)  # a fork of the previous line's rollout
            continue
        out.append((lineno, episode))
    return out


class RunFolder:
    """A run folder opened for reading (see the module doc). Nothing here writes to it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise InspectError(f"{self.root}: no such folder; expected a run folder (config.json, metrics.jsonl, "
                               "trajectories/)")
        if not any((self.root / name).exists() for name in ("config.json", "metrics.jsonl", "trajectories")):
            raise InspectError(f"{self.root}: not a run folder (no config.json, metrics.jsonl or trajectories/)")
        self.warnings: list[str] = []

    @property
    def trajectories_dir(self) -> Path:
        return self.root / "trajectories"

    def _json(self, name: str) -> dict[str, Any] | None:
        try:
            data = orjson.loads((self.root / name).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            self.warnings.append(f"{self.root / name}: unreadable ({exc})")
            return None
        return data if isinstance(data, dict) else None

    def config_record(self) -> dict[str, Any] | None:
        """``config.json``: ``{"config_hash", "agentrl_version", "config"}`` (None when absent)."""
        return self._json("config.json")

    def config(self) -> dict[str, Any]:
        record = self.config_record() or {}
        config = record.get("config")
        return config if isinstance(config, dict) else {}

    def summary(self) -> dict[str, Any] | None:
        """``summary.json``, written when the run ends (None while it runs, or if it died)."""
        return self._json("summary.json")

    def metrics(self) -> list[dict[str, Any]]:
        """Every metrics line so far. A torn last line is skipped; another bad line is skipped
        with a note in :attr:`warnings` (a report shows what it can)."""
        path = self.root / "metrics.jsonl"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            return parse_metrics_lines(data, str(path), InspectError)
        except InspectError as exc:
            self.warnings.append(str(exc))
        good = []
        for piece in data.split(b"\n"):
            try:
                record = orjson.loads(piece)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                good.append(record)
        return good

    def trajectory_steps(self) -> list[int]:
        """Steps with a trajectory file, ascending."""
        try:
            names = os.listdir(self.trajectories_dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(TRAJECTORY_FILE_RE.fullmatch, names) if m)

    def trajectory_path(self, step: int) -> Path:
        return self.trajectories_dir / f"step_{step:06d}.jsonl.gz"

    def episode(self, step: int, line: int) -> Episode:
        """The episode on line ``line`` (1-based, the header is line 1) of step ``step``'s file."""
        path = self.trajectory_path(step)
        for lineno, record in iter_records_file(path):
            if lineno == line:
                try:
                    return episode_from_record(record)
                except TrajectoryError as exc:
                    raise InspectError(f"{path}:{lineno}: {exc}") from exc
        raise InspectError(f"{path}: no episode on line {line}")

    def decoder(self) -> TokenDecoder | None:
        """A decoder from the run's tokenizer (``model.tokenizer_path`` or ``model.path``) when
        it is a local folder with a ``tokenizer.json``; None otherwise."""
        model = self.config().get("model")
        if not isinstance(model, dict):
            return None
        for key in ("tokenizer_path", "path"):
            value = model.get(key)
            if isinstance(value, str) and (Path(value) / "tokenizer.json").is_file():
                try:
                    return token_decoder(value)
                except ValueError as exc:
                    self.warnings.append(str(exc))
        return None
