"""One episode as a whole: every sequence it produced, and the environment's per-step info.

An episode is usually one :class:`~agentrl.trajectory.Trajectory`. When the chat template rewrites
history (a new user query strips earlier reasoning), the agent loop forks: a new sequence starts
from a fresh full render and shares the rollout id. Every sequence carries trainable tokens, so
the :class:`Episode` — not its last sequence — is the unit to save, load and batch:

- :meth:`Episode.to_dict` / :meth:`Episode.from_dict` and :func:`save_episodes` /
  :func:`load_episodes` (one episode per JSONL line) round-trip it losslessly, validating every
  sequence and that they belong together; :func:`load_episodes` also reads gzipped files and a
  run folder's ``trajectories/step_*.jsonl.gz`` (``load_episodes("runs/exp1")``);
- :func:`agentrl.train.build_training_batch` accepts episodes (each sequence becomes a training
  sequence; group statistics count the rollout once).

Example::

    episode = await run_episode(env, template, client, config)
    save_episodes("rollouts.jsonl", [episode], append=True)
    batch = build_training_batch(load_episodes("rollouts.jsonl"))
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl._runfiles import TRAJECTORY_FILE_RE
from agentrl.trajectory import Status, StopReason, Trajectory, TrajectoryError, iter_records, write_records

__all__ = ["Episode", "iter_episodes", "load_episodes", "save_episodes"]


@dataclass
class Episode:
    """The outcome of one episode: its sequences (one unless it forked) and the environment's info.

    All sequences share the rollout id and get the episode's final status and reward. Picklable.
    """

    sequences: list[Trajectory]
    env_info: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trajectory(self) -> Trajectory:
        """The last sequence: it holds the whole conversation and the episode's metrics. Save and
        batch the :class:`Episode` itself: earlier sequences hold trainable tokens too."""
        return self.sequences[-1]

    @property
    def status(self) -> Status:
        return self.trajectory.status

    @property
    def stop_reason(self) -> StopReason | None:
        return self.trajectory.stop_reason

    @property
    def reward(self) -> float | None:
        return self.trajectory.reward

    @property
    def num_trainable_tokens(self) -> int:
        """Trainable (sampled) tokens over every sequence."""
        return sum(s.num_trainable_tokens for s in self.sequences)

    def validate(self) -> None:
        """Checks each sequence's invariants and that they form one episode (same rollout, in order)."""
        if not self.sequences:
            raise TrajectoryError("episode: expected at least one sequence, got none")
        first = self.sequences[0]
        for i, seq in enumerate(self.sequences):
            try:
                seq.validate()
            except TrajectoryError as exc:
                raise TrajectoryError(f"sequences[{i}]: {exc}") from exc
            if seq.sequence_index != i:
                raise TrajectoryError(f"sequences[{i}].sequence_index = {seq.sequence_index}; expected {i}")
            if (seq.rollout_id, seq.group_id) != (first.rollout_id, first.group_id):
                raise TrajectoryError(f"sequences[{i}]: rollout/group id {(seq.rollout_id, seq.group_id)} differ from "
                                      f"the first sequence's {(first.rollout_id, first.group_id)}; expected one episode")

    def to_dict(self) -> dict[str, Any]:
        return {"sequences": [s.to_dict() for s in self.sequences], "env_info": [dict(i) for i in self.env_info]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        """Rebuilds an episode and validates it; a broken record raises :class:`TrajectoryError`."""
        if not isinstance(data, dict) or not isinstance(data.get("sequences"), list):
            raise TrajectoryError(f"episode record: expected an object with a 'sequences' list, got {data!r:.200}")
        sequences = []
        for i, raw in enumerate(data["sequences"]):
            try:
                sequences.append(Trajectory.from_dict(raw))
            except TrajectoryError as exc:
                raise TrajectoryError(f"sequences[{i}]: {exc}") from exc
        info = data.get("env_info") or []
        if not isinstance(info, list) or not all(isinstance(x, dict) for x in info):
            raise TrajectoryError(f"episode record: env_info: expected a list of objects, got {info!r:.200}")
        episode = cls(sequences=sequences, env_info=[dict(x) for x in info])
        episode.validate()
        return episode


def save_episodes(path: str | os.PathLike[str], episodes: Iterable[Episode], *, append: bool = False) -> int:
    """Writes one episode per JSON line; returns the number written."""
    return write_records(path, (e.to_dict() for e in episodes), append=append)


def _is_step_header(record: Any) -> bool:
    """The first line of a run folder's step file: ``{"config_hash", "step", "count", ...}``."""
    return isinstance(record, dict) and "config_hash" in record and "sequences" not in record


def _episode_files(path: Path) -> list[Path]:
    """``path`` itself, or the step files of a run folder (or of its ``trajectories/``) in step order."""
    if not path.is_dir():
        return [path]
    folder = path / "trajectories" if (path / "trajectories").is_dir() else path
    steps = sorted((int(m.group(1)), f) for f in folder.iterdir() if (m := TRAJECTORY_FILE_RE.fullmatch(f.name)))
    if not steps:
        raise TrajectoryError(f"{path}: no trajectories/step_*.jsonl.gz files in it; expected a run folder that "
                              "saved trajectories (logging.save_trajectories), or a JSONL file of episodes")
    return [f for _, f in steps]


def iter_episodes(path: str | os.PathLike[str]) -> Iterator[Episode]:
    """Yields the episodes of ``path``: a JSONL file of episode records (gzipped when its name ends in
    ``.gz``), or a run folder (or its ``trajectories/`` folder), whose ``step_*.jsonl.gz`` files are
    read in step order with their header lines skipped. A bad line raises :class:`TrajectoryError`
    naming the file and line number."""
    for file in _episode_files(Path(path)):
        yield from iter_records(file, Episode.from_dict, skip=_is_step_header)


def load_episodes(path: str | os.PathLike[str]) -> list[Episode]:
    """Every episode of ``path`` (see :func:`iter_episodes`), e.g. ``load_episodes("runs/exp1")``."""
    return list(iter_episodes(path))
