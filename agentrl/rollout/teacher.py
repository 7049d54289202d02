"""Teacher scoring: the teacher's logprob of every token the student sampled, written on the trajectory.

On-policy distillation (:mod:`agentrl.algorithms.distill`) reads a teacher's logprob of each sampled
token from the trajectory's :data:`~agentrl.token_data.TEACHER_LOGPROBS` channel (float32, aligned
with the token itself, present on the sampled tokens only: tokens the environment wrote are never
scored as the student's). This module fills it:

- :func:`teacher_requests` gives, per trajectory of a step, the sequence the teacher scores: the
  trajectory's own tokens, or, for **self-distillation**, the same tokens after a *privileged prefix*
  (the student given the answer or a hint: a message rendered by the chat template, placed before
  the conversation); the offset maps each token to its position in that sequence;
- :func:`write_teacher_logprobs` writes the teacher's position-aligned logprobs of a sequence onto
  the sampled positions of its trajectory (every model segment, each token once);
- :class:`EngineTeacher` scores sequences by prefill on SGLang engines: ``/generate`` with the token
  ids, ``max_new_tokens = 0`` and ``logprob_start_len`` at the first sampled token, whose
  ``input_token_logprobs`` are the teacher's logprobs of the ids as sent (a chat endpoint would
  re-tokenise and could not score exact ids). Teacher engines of a run, an SGLang-compatible
  endpoint, or the run's own engines (self-distillation) are all scored this way;
- :func:`score_episodes` runs the scoring of a step's episodes and returns ``teacher/*`` timings.

The teacher scores at temperature 1 (its own distribution). A sequence is scored whole (prompt
included) so the teacher sees exactly the context the student saw.

Example::

    teacher = EngineTeacher([client])
    metrics = await score_episodes(batch.episodes(), teacher.score)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from agentrl.chat.types import Message
from agentrl.episode import Episode
from agentrl.rollout.types import GenerateResult, SamplingParams
from agentrl.token_data import TEACHER_LOGPROBS
from agentrl.trajectory import SegmentKind, Trajectory

__all__ = ["EngineTeacher", "RolloutTeacher", "ScoringClient", "TeacherError", "TeacherRequest", "format_privileged", "privileged_prefix",
           "score_episodes", "teacher_requests", "write_teacher_logprobs"]

SequenceScores = Callable[[list[list[int]], list[int]], Awaitable[list[list[float]]]]
"""Sequences and, per sequence, the first position wanted → position-aligned logprobs (entry ``i``
scores token ``i`` given the ones before; entries before the first wanted position may be 0.0)."""


class ScoringClient(Protocol):
    """What scoring needs of an engine client (:class:`~agentrl.rollout.InferenceClient` fits)."""

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       logprob_start_len: int | None = None) -> GenerateResult: ...


class TeacherError(RuntimeError):
    """The teacher could not score a sequence (an engine error, or an answer that does not fit it)."""


@dataclass(frozen=True)
class TeacherRequest:
    """One trajectory's scoring: ``tokens`` the teacher reads (the prefix, then the trajectory's tokens);
    ``offset`` where the trajectory's token 0 sits in them; ``first`` the first sampled position (in
    ``tokens``)."""

    trajectory: Trajectory
    tokens: list[int]
    offset: int
    first: int


def privileged_prefix(template: Any, text: str, *, role: Literal["system", "user"] = "system") -> list[int]:
    """The ids of one message ``text`` of ``role`` rendered by ``template`` (no generation prompt): what a
    self-distillation teacher reads before the conversation."""
    if not text:
        raise ValueError("privileged_prefix(text=''): expected the privileged text (an answer, a hint)")
    return list(template.encode([Message(role, text)], add_generation_prompt=False))


def _sampled(traj: Trajectory) -> list[tuple[int, int]]:
    return [(s.start, s.end) for s in traj.segments_of(SegmentKind.MODEL)]


def teacher_requests(episodes: Sequence[Episode], prefixes: Sequence[Sequence[int]] | None = None) -> list[TeacherRequest]:
    """One request per sequence of ``episodes`` that sampled anything; ``prefixes[i]`` (self-distillation):
    the privileged prefix of episode ``i``'s sequences."""
    if prefixes is not None and len(prefixes) != len(episodes):
        raise ValueError(f"prefixes: {len(prefixes)} for {len(episodes)} episodes; expected one per episode")
    out = []
    for i, episode in enumerate(episodes):
        prefix = list(prefixes[i]) if prefixes is not None else []
        for traj in episode.sequences:
            spans = _sampled(traj)
            if traj.message_level or not spans:
                continue
            out.append(TeacherRequest(traj, [*prefix, *traj.tokens], len(prefix), len(prefix) + spans[0][0]))
    return out


def write_teacher_logprobs(traj: Trajectory, logprobs: Sequence[float], *, offset: int = 0) -> int:
    """Writes ``logprobs[pos + offset]`` as the teacher's row of every sampled position ``pos`` of
    ``traj``; returns the number of rows written. ``logprobs`` is position-aligned with the teacher's
    sequence (``offset`` tokens of prefix, then ``traj.tokens``)."""
    if len(logprobs) != len(traj.tokens) + offset:
        raise TeacherError(f"rollout {traj.rollout_id!r}: {len(logprobs)} teacher logprobs for a sequence of "
                           f"{offset} + {len(traj.tokens)} tokens; expected one per token")
    written = 0
    for start, end in _sampled(traj):
        rows = np.asarray(logprobs[start + offset: end + offset], dtype=np.float64)
        if not np.isfinite(rows).all() or (rows > 1e-3).any():
            raise TeacherError(f"rollout {traj.rollout_id!r}: teacher logprobs over [{start}, {end}) hold a value "
                               "that is not a finite logprob <= 0")
        traj.write_channel(TEACHER_LOGPROBS, start, np.minimum(rows, 0.0).astype(np.float32))
        written += end - start
    return written


async def score_episodes(episodes: Sequence[Episode], score: SequenceScores, *,
                         prefixes: Sequence[Sequence[int]] | None = None) -> dict[str, float]:
    """Scores every sampled token of ``episodes`` with ``score`` and writes the channel; returns
    ``teacher/score_s`` (wall time), ``teacher/sequences`` and ``teacher/tokens`` (tokens the teacher read)."""
    started = time.perf_counter()
    requests = teacher_requests(episodes, prefixes)
    rows = await score([r.tokens for r in requests], [r.first for r in requests]) if requests else []
    if len(rows) != len(requests):
        raise TeacherError(f"the teacher returned {len(rows)} rows for {len(requests)} sequences")
    for req, row in zip(requests, rows, strict=True):
        write_teacher_logprobs(req.trajectory, row, offset=req.offset)
    return {"teacher/score_s": time.perf_counter() - started, "teacher/sequences": float(len(requests)),
            "teacher/tokens": float(sum(len(r.tokens) for r in requests))}


class EngineTeacher:
    """Scores sequences by prefill on SGLang engines, one :class:`ScoringClient` per engine (an
    :class:`~agentrl.rollout.InferenceClient` fits). Sequences that share their first ``share_tokens``
    tokens go to the same engine, so its prefix cache serves a group's common prompt once; at most
    ``concurrency`` requests per engine are in flight."""

    def __init__(self, clients: Sequence[ScoringClient], *, concurrency: int = 32, share_tokens: int = 64) -> None:
        if not clients:
            raise ValueError("EngineTeacher(clients=[]): expected at least one engine client")
        self.clients = list(clients)
        self.share_tokens = share_tokens
        self._slots = [asyncio.Semaphore(concurrency) for _ in self.clients]

    def _engine(self, tokens: Sequence[int]) -> int:
        return hash(tuple(tokens[: self.share_tokens])) % len(self.clients)

    async def _one(self, tokens: list[int], first: int) -> list[float]:
        k = self._engine(tokens)
        start = max(first - 1, 0)  # one earlier: the first entry SGLang returns may be None
        async with self._slots[k]:
            res = await self.clients[k].generate(tokens, SamplingParams(max_new_tokens=0, temperature=1.0),
                                                 logprob_start_len=start)
        lps = list(res.input_logprobs)
        if len(lps) != len(tokens) - start:
            raise TeacherError(f"the teacher engine returned {len(lps)} input logprobs for positions {start}.."
                               f"{len(tokens) - 1} of a {len(tokens)}-token sequence; expected one per position "
                               "from logprob_start_len")
        wrong = res.first_misscored(tokens[start:])
        if wrong is not None:
            raise TeacherError(f"the teacher engine scored other ids than were sent: at position {start + wrong} of a "
                               f"{len(tokens)}-token sequence it names {res.input_ids_scored[wrong]}, the request "
                               f"held {tokens[start + wrong]}")
        out = [0.0] * len(tokens)
        for j, value in enumerate(lps):
            pos = start + j
            if pos >= first:
                if value is None:
                    raise TeacherError(f"the teacher engine returned no logprob for position {pos}")
                out[pos] = float(value)
        return out

    async def score(self, sequences: list[list[int]], firsts: list[int]) -> list[list[float]]:
        """:data:`SequenceScores`: each sequence's logprobs from position ``firsts[i]`` on."""
        return list(await asyncio.gather(*(self._one(s, f) for s, f in zip(sequences, firsts, strict=True))))


def format_privileged(text: str, row: Mapping[str, Any]) -> str:
    """``text`` with ``{field}`` filled from the task row (``str.format``); a field the row lacks is an
    error naming it and the row's fields."""
    try:
        return text.format(**row)
    except (KeyError, IndexError) as exc:
        raise ValueError(f"teacher.privileged={text!r}: the task row has no field {exc}; its fields are "
                         f"{sorted(row)}") from None


class RolloutTeacher:
    """The rollout side's teacher: every episode of a collected step scored by ``teacher`` (engines of
    the teacher, an endpoint, or the run's own engines), before the batch is handed over.

    Self-distillation: ``privileged`` (a ``str.format`` text over the task row) rendered by ``template``
    as one ``role`` message is the prefix every sequence of the row's episodes is scored after."""

    def __init__(self, teacher: EngineTeacher, *, template: Any = None, privileged: str | None = None,
                 role: Literal["system", "user"] = "system") -> None:
        if privileged is not None and template is None:
            raise ValueError("RolloutTeacher(privileged=...): expected the chat template that renders it")
        self.teacher, self.template, self.privileged, self.role = teacher, template, privileged, role

    async def score_groups(self, groups: Sequence[Any]) -> dict[str, float]:
        """Scores the episodes of ``groups`` (:class:`~agentrl.rollout.RolloutGroup`: ``row`` and
        ``episodes``) and writes their channel; returns ``teacher/*`` figures."""
        episodes: list[Episode] = []
        prefixes: list[list[int]] = []
        for group in groups:
            prefix: list[int] = []
            if self.privileged is not None:
                prefix = privileged_prefix(self.template, format_privileged(self.privileged, group.row), role=self.role)
            for episode in group.episodes:
                episodes.append(episode)
                prefixes.append(prefix)
        return await score_episodes(episodes, self.teacher.score,
                                    prefixes=prefixes if self.privileged is not None else None)
