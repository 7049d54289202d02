"""The authoritative token buffer of one episode, with a provenance record for every span.

A :class:`Trajectory` holds the prompt ids followed by the response: sampled model turns, kept
exactly as the engine returned them with their logprobs, and environment turns (tool results,
user turns, template scaffolding) appended as separately rendered segments. Only two methods
change the token buffer:

- :meth:`Trajectory.append_model` — sampled ids and their logprobs; trainable (loss mask 1);
- :meth:`Trajectory.append_env` — environment ids; never trained on (loss mask 0, logprob 0.0).

Invariants, checked on every append and on load:

- ``len(tokens) == prompt_length + len(loss_mask) == prompt_length + len(logprobs)``;
- ``segments`` tile ``tokens`` exactly: a ``prompt`` segment ``[0, prompt_length)`` then the
  response segments, contiguous and non-empty; a segment's ``trainable`` flag equals the loss
  mask over its span; only ``model`` segments may be trainable;
- logprobs are finite and ``<= 0`` (up to float rounding); ids lie within ``vocab_size`` when
  it is known;
- nothing is appended after a terminal status (completed / truncated / aborted / failed);
- every per-token channel (:attr:`Trajectory.channels`, :mod:`agentrl.token_data`: MoE routing,
  teacher logprobs) has exactly one row per token; rows come with the tokens they belong to
  (``channels=`` of either mutator) or later (:meth:`Trajectory.write_channel`).

A sequence after an episode's first one records why it started in :attr:`Trajectory.fork_reason`
(:class:`ForkReason`: the template rewrote history, an agent harness's history did not continue it,
the harness resent a request, a context policy compacted the history).

Errors are values: whatever went wrong in the episode (the engine, the environment, a tool under
failure policy ``end``, the bridge, the reward) is an :class:`EpisodeError` in
:attr:`Trajectory.errors`: a kind (:class:`ErrorKind`), the message, and where it happened (model
turn, component, tool call id). Files written before errors were typed keep them as strings under
``info["engine_error"]`` (``env_error``, ``bridge_error``, ``reward_error``, ``endpoint_error``);
:meth:`Trajectory.from_dict` reads those into :attr:`Trajectory.errors`.

Each stop reason implies one status (:func:`status_for`): ``no_tool_calls``, ``env_done``,
``max_turns`` and ``max_tool_calls`` → completed; ``context_budget``, ``engine_length`` and
``max_sampled_tokens`` → truncated; ``aborted`` → aborted; ``failed`` → failed.

A trajectory is a plain dataclass: picklable, and losslessly round-tripped through JSON
(:meth:`to_dict` / :meth:`from_dict`, :func:`save_jsonl` / :func:`load_jsonl`; records carry
``schema`` 2, and records without it, written before channels and fork reasons, still load); the one exception
is a lone surrogate in a string (not Unicode: an environment's text decoded with
``surrogateescape``), which files hold as U+FFFD.

Example::

    traj = Trajectory.from_prompt(prompt_ids, messages=opening, vocab_size=len(tokenizer))
    traj.append_model(sampled_ids, sampled_logprobs, weight_version="3", finish_reason="stop")
    traj.append_env(tool_segment_ids, kind=SegmentKind.TOOL, message_index=2)
    traj.finish(Status.COMPLETED, StopReason.NO_TOOL_CALLS)
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from agentrl._enum import NamedEnum
from agentrl._ids import CheckedIds
from agentrl._unicode import without_lone_surrogates
from agentrl.chat.types import Message
from agentrl.episode_errors import EpisodeError, ErrorKind, TrajectoryError
from agentrl.token_data import ChannelError, TokenChannel, default_alignment

__all__ = [
    "CheckedIds",
    "EpisodeError",
    "ErrorKind",
    "ForkReason",
    "Segment",
    "SegmentKind",
    "Status",
    "StopReason",
    "Trajectory",
    "TrajectoryError",
    "iter_jsonl",
    "load_jsonl",
    "save_jsonl",
    "status_for",
]

T = TypeVar("T")

# Engines return logprobs that can exceed 0 by float rounding (log-softmax in bf16/fp32).
_LOGPROB_TOLERANCE = 1e-3
# The record layout :meth:`Trajectory.to_dict` writes. 1: no ``schema`` key (files before per-token channels);
# 2: ``schema``, ``fork_reason`` and ``channels``. Every earlier layout stays readable.
SCHEMA_VERSION = 2
# ``info`` key of a message-level trajectory (see Trajectory.from_messages)
_MESSAGE_LEVEL = "message_level"


def _check_logprobs(logprobs: list[float], what: str) -> None:
    # fast path in C: a sum of finite values is finite (a NaN or an infinity makes it not), and the max bounds them
    if not logprobs or (math.isfinite(sum(logprobs)) and max(logprobs) <= _LOGPROB_TOLERANCE):
        return
    for i, lp in enumerate(logprobs):
        if not math.isfinite(lp) or lp > _LOGPROB_TOLERANCE:
            raise TrajectoryError(f"{what}[{i}] = {lp!r}; expected a finite value <= 0")


class SegmentKind(NamedEnum):
    """Where a span of tokens came from."""

    PROMPT = "prompt"
    MODEL = "model"
    TOOL = "tool"
    USER = "user"
    SCAFFOLD = "scaffold"


class Status(NamedEnum):
    """Lifecycle of an episode. The last four are terminal."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self not in (Status.PENDING, Status.RUNNING)


class StopReason(NamedEnum):
    """Why an episode ended."""

    NO_TOOL_CALLS = "no_tool_calls"  # the model answered without calling a tool
    ENV_DONE = "env_done"  # the environment ended the episode
    MAX_TURNS = "max_turns"
    MAX_TOOL_CALLS = "max_tool_calls"
    CONTEXT_BUDGET = "context_budget"  # the context-token budget is spent
    MAX_SAMPLED_TOKENS = "max_sampled_tokens"  # the rollout's budget of sampled tokens (all its sequences) is spent
    ENGINE_LENGTH = "engine_length"  # the engine stopped on max_new_tokens / context length
    ABORTED = "aborted"
    FAILED = "failed"


_STATUS_OF: dict[StopReason, Status] = {
    StopReason.NO_TOOL_CALLS: Status.COMPLETED, StopReason.ENV_DONE: Status.COMPLETED,
    StopReason.MAX_TURNS: Status.COMPLETED, StopReason.MAX_TOOL_CALLS: Status.COMPLETED,
    StopReason.CONTEXT_BUDGET: Status.TRUNCATED, StopReason.ENGINE_LENGTH: Status.TRUNCATED,
    StopReason.MAX_SAMPLED_TOKENS: Status.TRUNCATED,
    StopReason.ABORTED: Status.ABORTED, StopReason.FAILED: Status.FAILED,
}


class ForkReason(NamedEnum):
    """Why a sequence after an episode's first one started (:attr:`Trajectory.fork_reason`)."""

    TEMPLATE = "template"  # the chat template rewrote history (not append-only): a fresh full render
    HARNESS = "harness"  # an agent harness sent a history that does not continue the sequence (proxy)
    RESAMPLED = "resampled"  # an agent harness sent the same request again (proxy)
    COMPACTION = "compaction"  # a context policy compacted the history (window, elision, summary)


def status_for(reason: StopReason) -> Status:
    """The trajectory status a stop reason implies (table in the module doc)."""
    return _STATUS_OF[reason]


# ``info`` keys under which files written before errors were typed hold them, and the kind each becomes
_LEGACY_ERROR_KEYS: dict[str, ErrorKind] = {"engine_error": ErrorKind.ENGINE, "endpoint_error": ErrorKind.ENGINE,
                                            "env_error": ErrorKind.ENV, "bridge_error": ErrorKind.BRIDGE,
                                            "reward_error": ErrorKind.REWARD}


def _legacy_errors(info: dict[str, Any], status: Status) -> list[EpisodeError]:
    """Takes the string errors of an old record out of ``info`` (an engine error of a truncated
    episode was the engine refusing a prompt as too long)."""
    out = []
    for key, kind in _LEGACY_ERROR_KEYS.items():
        if key not in info:
            continue
        if kind is ErrorKind.ENGINE and status is Status.TRUNCATED:
            kind = ErrorKind.PROMPT_TOO_LONG
        out.append(EpisodeError(kind, str(info.pop(key)), component=key.removesuffix("_error")))
    return out


@dataclass(frozen=True)
class Segment:
    """Provenance of one contiguous span ``[start, end)`` of ``Trajectory.tokens``."""

    kind: SegmentKind
    start: int
    end: int
    trainable: bool
    turn: int
    message_index: int | None = None
    weight_version: str | None = None
    finish_reason: str | None = None

    @property
    def length(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "start": self.start, "end": self.end, "trainable": self.trainable,
                "turn": self.turn, "message_index": self.message_index, "weight_version": self.weight_version,
                "finish_reason": self.finish_reason}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Segment:
        try:
            return cls(kind=SegmentKind(data["kind"]), start=int(data["start"]), end=int(data["end"]),
                       trainable=bool(data["trainable"]), turn=int(data["turn"]),
                       message_index=data.get("message_index"), weight_version=data.get("weight_version"),
                       finish_reason=data.get("finish_reason"))
        except (KeyError, ValueError, TypeError) as exc:
            raise TrajectoryError(f"segment: expected kind/start/end/trainable/turn, got {data!r:.200} ({exc})") from exc


@dataclass
class Trajectory:
    """One episode's tokens, masks, logprobs, provenance, messages, outcome and ids. See the module doc."""

    tokens: list[int]
    prompt_length: int
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    status: Status = Status.PENDING
    stop_reason: StopReason | None = None
    reward: float | None = None
    reward_parts: dict[str, float] = field(default_factory=dict)
    group_id: str | None = None
    rollout_id: str | None = None
    sample_id: str | None = None
    session_id: str | None = None
    sequence_index: int = 0  # >0 for a sequence forked from the same rollout (fan-out)
    fork_reason: ForkReason | None = None  # why this sequence started (None: the episode's first)
    vocab_size: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    errors: list[EpisodeError] = field(default_factory=list)
    channels: dict[str, TokenChannel] = field(default_factory=dict)  # per-token side data (agentrl.token_data)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_prompt(cls, prompt_ids: Iterable[int], *, messages: Iterable[Message] | None = None,
                    vocab_size: int | None = None, **ids: Any) -> Trajectory:
        """A new pending trajectory whose prompt is ``prompt_ids`` (one ``prompt`` segment)."""
        tokens = list(prompt_ids)
        checked = type(prompt_ids) is CheckedIds and (vocab_size is None or prompt_ids.max_id < vocab_size)
        if not checked and set(map(type, tokens)) - {int}:  # numpy ints and the like become plain ints
            tokens = [int(t) for t in tokens]
        if not tokens:
            raise TrajectoryError("prompt_ids: expected at least one token, got an empty prompt")
        traj = cls(tokens=tokens, prompt_length=len(tokens), messages=list(messages or []),
                   vocab_size=vocab_size, **ids)
        if not checked:
            traj._check_ids(tokens, "prompt_ids")
        traj.segments.append(Segment(SegmentKind.PROMPT, 0, len(tokens), trainable=False, turn=0))
        return traj

    @classmethod
    def from_messages(cls, messages: Iterable[Message], **ids: Any) -> Trajectory:
        """A *message-level* trajectory: the conversation only, no token ids, loss mask or logprobs
        (an episode run against a chat-completions endpoint). Rewards read its messages like any
        other; :meth:`validate` and every trainer refuse it (there is nothing to train on)."""
        return cls(tokens=[], prompt_length=0, messages=list(messages), info={_MESSAGE_LEVEL: True}, **ids)

    @property
    def message_level(self) -> bool:
        """True for a trajectory of messages without tokens (:meth:`from_messages`)."""
        return bool(self.info.get(_MESSAGE_LEVEL))

    # -- the two mutators --------------------------------------------------------------------
    def append_model(self, token_ids: Iterable[int], logprobs: Iterable[float], *,
                     weight_version: str | None = None, finish_reason: str | None = None,
                     message_index: int | None = None, channels: Mapping[str, Any] | None = None) -> Segment | None:
        """Appends sampled ids verbatim with their logprobs (trainable). Returns the new segment.

        ``channels``: rows of per-token side data for the new ids (``{name: [n, *row_shape]}``); every
        other channel gets absent rows. An empty turn (the engine returned no tokens, e.g. an immediate
        abort) appends nothing and returns None.
        """
        ids = list(map(int, token_ids))  # map() in C: half the cost of a comprehension
        lps = list(map(float, logprobs))
        self._check_appendable("append_model")
        if len(ids) != len(lps):
            raise TrajectoryError(f"append_model: {len(ids)} token ids but {len(lps)} logprobs; expected equal lengths")
        _check_logprobs(lps, "append_model: logprobs")
        self._check_ids(ids, "append_model token_ids")
        if not ids:
            return None
        self._extend_channels(len(ids), channels, "append_model")
        seg = Segment(SegmentKind.MODEL, len(self.tokens), len(self.tokens) + len(ids), trainable=True,
                      turn=self.num_model_turns + 1, message_index=message_index,
                      weight_version=weight_version, finish_reason=finish_reason)
        self.tokens.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(lps)
        self.segments.append(seg)
        self.status = Status.RUNNING
        return seg

    def append_env(self, token_ids: Iterable[int], *, kind: SegmentKind | str, message_index: int | None = None,
                   channels: Mapping[str, Any] | None = None) -> Segment | None:
        """Appends environment ids (tool / user / scaffold): loss mask 0, logprob placeholder 0.0.
        ``channels`` as for :meth:`append_model`."""
        ids = list(map(int, token_ids))
        try:
            seg_kind = SegmentKind(kind)
        except ValueError:
            raise TrajectoryError(f"append_env: kind={kind!r}; expected one of tool, user, scaffold") from None
        if seg_kind in (SegmentKind.PROMPT, SegmentKind.MODEL):
            raise TrajectoryError(f"append_env: kind={seg_kind.value!r}; expected one of tool, user, scaffold")
        self._check_appendable("append_env")
        self._check_ids(ids, "append_env token_ids")
        if not ids:
            return None
        self._extend_channels(len(ids), channels, "append_env")
        seg = Segment(seg_kind, len(self.tokens), len(self.tokens) + len(ids), trainable=False,
                      turn=self.num_model_turns, message_index=message_index)
        self.tokens.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.segments.append(seg)
        self.status = Status.RUNNING
        return seg

    def _extend_channels(self, n: int, rows: Mapping[str, Any] | None, what: str) -> None:
        """Grows every channel by ``n`` positions (rows from ``rows`` where given), all or nothing."""
        rows = rows or {}
        fresh = {name: self._new_channel(name, value, what) for name, value in rows.items()
                 if name not in self.channels}
        channels = {**self.channels, **fresh}
        checked = {}
        for name, value in rows.items():  # every row checked before any channel grows: all or nothing
            try:
                checked[name] = channels[name].check_rows(value, n)
            except ChannelError as exc:
                raise TrajectoryError(f"{what}: channels[{name!r}]: {exc}") from exc
        for name, channel in channels.items():
            channel.extend(n, checked.get(name))
        self.channels.update(fresh)

    def _new_channel(self, name: str, rows: Any, what: str) -> TokenChannel:
        arr = np.asarray(rows)
        if arr.ndim < 1:
            raise TrajectoryError(f"{what}: channels[{name!r}]: expected rows [tokens, ...], got a scalar")
        try:
            return TokenChannel(arr.dtype, arr.shape[1:], length=len(self.tokens), alignment=default_alignment(name))
        except ChannelError as exc:
            raise TrajectoryError(f"{what}: channels[{name!r}]: {exc}") from exc

    def write_channel(self, name: str, start: int, rows: Any) -> int:
        """Sets rows of channel ``name`` at positions ``[start, start + len(rows))``, all already in
        ``tokens`` (side data that arrives after its tokens, e.g. routing of a prefilled prompt). Creates
        the channel (absent everywhere else) when missing. Returns how many rows changed an earlier,
        different value."""
        channel = self.channels.get(name)
        if channel is None:
            channel = self._new_channel(name, rows, "write_channel")
        try:
            changed = channel.write(start, rows)
        except ChannelError as exc:
            raise TrajectoryError(f"write_channel({name!r}): {exc}") from exc
        self.channels.setdefault(name, channel)
        return changed

    def mask_model_segments(self, where: Callable[[Segment], bool]) -> int:
        """Stops training on the model segments ``where`` selects (loss mask 0, ``trainable=False``).

        The tokens and their logprobs stay: only the mask changes (e.g. tokens sampled by an older
        weight version, under ``mask_offpolicy``). Returns the number of tokens masked.
        """
        masked = 0
        for i, seg in enumerate(self.segments):
            if seg.kind is not SegmentKind.MODEL or not seg.trainable or not where(seg):
                continue
            lo, hi = seg.start - self.prompt_length, seg.end - self.prompt_length
            self.loss_mask[lo:hi] = [0] * (hi - lo)
            self.segments[i] = dataclasses.replace(seg, trainable=False)
            masked += hi - lo
        return masked

    # -- outcome -----------------------------------------------------------------------------
    def finish(self, status: Status, stop_reason: StopReason | None = None) -> bool:
        """Sets a terminal status. An earlier terminal status is never overwritten: returns False then."""
        if not status.terminal:
            raise TrajectoryError(f"finish: status={status.value!r}; expected a terminal status")
        if self.status.terminal:
            return False
        self.status = status
        self.stop_reason = stop_reason
        return True

    def add_error(self, kind: ErrorKind, message: str, *, component: str | None = None,
                  tool_call_id: str | None = None, origin: str | None = None) -> EpisodeError:
        """Records what went wrong (allowed after the end too: a reward fails after it); returns it.
        ``turn`` is the number of model turns so far."""
        error = EpisodeError(ErrorKind(kind), message, turn=self.num_model_turns, component=component,
                             tool_call_id=tool_call_id, origin=origin)
        self.errors.append(error)
        return error

    def error_of(self, *kinds: ErrorKind) -> EpisodeError | None:
        """The first recorded error of one of ``kinds`` (any kind when none is given), or None."""
        return next((e for e in self.errors if not kinds or e.kind in kinds), None)

    # -- views -------------------------------------------------------------------------------
    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length:]

    @property
    def num_model_turns(self) -> int:
        return sum(1 for s in self.segments if s.kind is SegmentKind.MODEL)

    @property
    def num_trainable_tokens(self) -> int:
        return sum(self.loss_mask)

    def segments_of(self, kind: SegmentKind) -> list[Segment]:
        return [s for s in self.segments if s.kind is kind]

    # -- checks ------------------------------------------------------------------------------
    def _check_appendable(self, what: str) -> None:
        if self.status.terminal:
            raise TrajectoryError(f"{what}: the trajectory is already {self.status.value}; nothing may be appended")

    def _check_ids(self, ids: list[int], what: str) -> None:
        limit = self.vocab_size
        if not ids or (min(ids) >= 0 and (limit is None or max(ids) < limit)):
            return
        for i, t in enumerate(ids):
            if t < 0 or (limit is not None and t >= limit):
                raise TrajectoryError(f"{what}[{i}] = {t}; expected an id in [0, {limit if limit is not None else 'inf'})")

    def validate(self) -> None:
        """Checks every invariant of the module doc; raises :class:`TrajectoryError` naming the first broken one."""
        if self.message_level:
            raise TrajectoryError(f"rollout {self.rollout_id!r} is message-level (messages from a chat-completions "
                                  "endpoint, no token ids or logprobs); expected a token-level trajectory")
        n_resp = len(self.tokens) - self.prompt_length
        if self.prompt_length <= 0 or n_resp < 0:
            raise TrajectoryError(f"prompt_length={self.prompt_length} with {len(self.tokens)} tokens; expected 0 < "
                                  "prompt_length <= len(tokens)")
        if len(self.loss_mask) != n_resp or len(self.logprobs) != n_resp:
            raise TrajectoryError(f"len(tokens)={len(self.tokens)}, prompt_length={self.prompt_length}, "
                                  f"len(loss_mask)={len(self.loss_mask)}, len(logprobs)={len(self.logprobs)}; "
                                  "expected len(tokens) == prompt_length + len(loss_mask) == prompt_length + len(logprobs)")
        self._check_ids(self.tokens, "tokens")
        self._check_segments()
        for i, m in enumerate(self.loss_mask):
            if m not in (0, 1):
                raise TrajectoryError(f"loss_mask[{i}] = {m!r}; expected 0 or 1")
        _check_logprobs(self.logprobs, "logprobs")
        for name, channel in self.channels.items():
            if len(channel) != len(self.tokens):
                raise TrajectoryError(f"channels[{name!r}] has {len(channel)} rows for {len(self.tokens)} tokens; "
                                      "expected one row per token")

    def _check_segments(self) -> None:
        if not self.segments or self.segments[0].kind is not SegmentKind.PROMPT or \
                (self.segments[0].start, self.segments[0].end) != (0, self.prompt_length):
            raise TrajectoryError(f"segments[0]: expected a prompt segment [0, {self.prompt_length}), "
                                  f"got {self.segments[0] if self.segments else None}")
        pos = self.prompt_length
        for i, seg in enumerate(self.segments[1:], start=1):
            if seg.kind is SegmentKind.PROMPT or seg.start != pos or seg.end <= seg.start:
                raise TrajectoryError(f"segments[{i}] = {seg}; expected a non-empty response segment starting at {pos}")
            if seg.trainable and seg.kind is not SegmentKind.MODEL:
                raise TrajectoryError(f"segments[{i}]: a {seg.kind.value} segment is trainable; only model segments may be")
            span = self.loss_mask[seg.start - self.prompt_length: seg.end - self.prompt_length]
            if any(m != int(seg.trainable) for m in span):
                raise TrajectoryError(f"segments[{i}] trainable={seg.trainable} disagrees with loss_mask over "
                                      f"[{seg.start}, {seg.end})")
            pos = seg.end
        if pos != len(self.tokens):
            raise TrajectoryError(f"segments end at {pos} but there are {len(self.tokens)} tokens; expected an exact tiling")

    # -- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens), "prompt_length": self.prompt_length, "loss_mask": list(self.loss_mask),
            "logprobs": list(self.logprobs), "segments": [s.to_dict() for s in self.segments],
            "messages": [m.to_dict() for m in self.messages], "status": self.status.value,
            "stop_reason": self.stop_reason.value if self.stop_reason is not None else None,
            "reward": self.reward, "reward_parts": dict(self.reward_parts), "group_id": self.group_id,
            "rollout_id": self.rollout_id, "sample_id": self.sample_id, "session_id": self.session_id,
            "sequence_index": self.sequence_index, "vocab_size": self.vocab_size, "metrics": dict(self.metrics),
            "info": dict(self.info), "errors": [e.to_dict() for e in self.errors],
            "schema": SCHEMA_VERSION, "fork_reason": self.fork_reason.value if self.fork_reason is not None else None,
            **({"channels": {k: c.to_dict() for k, c in self.channels.items()}} if self.channels else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """Rebuilds a trajectory and validates it; a broken record raises :class:`TrajectoryError`."""
        schema = data.get("schema", 1)
        if not isinstance(schema, int) or schema > SCHEMA_VERSION:
            raise TrajectoryError(f"trajectory record: schema {schema!r}; this agentrl reads schema 1 to "
                                  f"{SCHEMA_VERSION} (a file written by a newer agentrl?)")
        try:
            status = Status(data.get("status", "pending"))
            info = dict(data.get("info") or {})
            errors = [EpisodeError.from_dict(e) for e in data.get("errors") or []] + _legacy_errors(info, status)
            traj = cls(
                tokens=[int(t) for t in data["tokens"]], prompt_length=int(data["prompt_length"]),
                loss_mask=[int(m) for m in data["loss_mask"]], logprobs=[float(x) for x in data["logprobs"]],
                segments=[Segment.from_dict(s) for s in data["segments"]],
                messages=[Message.from_dict(m) for m in data.get("messages", [])],
                status=status,
                stop_reason=StopReason(data["stop_reason"]) if data.get("stop_reason") else None,
                reward=data.get("reward"), reward_parts=dict(data.get("reward_parts") or {}),
                group_id=data.get("group_id"), rollout_id=data.get("rollout_id"), sample_id=data.get("sample_id"),
                session_id=data.get("session_id"), sequence_index=int(data.get("sequence_index", 0)),
                vocab_size=data.get("vocab_size"), metrics=dict(data.get("metrics") or {}),
                info=info, errors=errors,
                fork_reason=ForkReason(data["fork_reason"]) if data.get("fork_reason") else None,
                channels={str(k): TokenChannel.from_dict(v) for k, v in (data.get("channels") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, TrajectoryError):
                raise
            raise TrajectoryError(f"trajectory record: {type(exc).__name__}: {exc}") from exc
        traj.validate()
        return traj


def write_records(path: str | os.PathLike[str], records: Iterable[dict[str, Any]], *, append: bool = False) -> int:
    """Writes one JSON object per line (the format of trajectory and episode files); returns the count."""
    n = 0
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for record in records:
            line = json.dumps(record, ensure_ascii=False, allow_nan=False)
            try:
                f.write(line)
            except UnicodeEncodeError:  # a lone surrogate (from an environment's text): written as U+FFFD
                f.write(json.dumps(without_lone_surrogates(record), ensure_ascii=False, allow_nan=False))
            f.write("\n")
            n += 1
    return n


def iter_records(path: str | os.PathLike[str], build: Callable[[dict[str, Any]], T], *,
                 skip: Callable[[Any], bool] | None = None) -> Iterator[T]:
    """Yields ``build(record)`` per non-blank line of a JSONL file (gzipped when its name ends in
    ``.gz``), leaving out the records ``skip`` accepts; a bad line raises naming the file and line
    number, a file that cannot be decoded raises naming the file."""
    name = os.fspath(path)
    lineno = 0
    try:
        with gzip.open(path, "rt", encoding="utf-8") if name.endswith(".gz") else open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    if skip is None or not skip(record):
                        yield build(record)
                except (json.JSONDecodeError, TrajectoryError) as exc:
                    raise TrajectoryError(f"{name}:{lineno}: {exc}") from exc
    except UnicodeDecodeError as exc:
        hint = "" if name.endswith(".gz") else " (a gzipped file needs a name ending in .gz)"
        raise TrajectoryError(f"{name}:{lineno + 1}: not UTF-8 text{hint}: {exc}") from exc
    except (gzip.BadGzipFile, EOFError) as exc:
        raise TrajectoryError(f"{name}: not a complete gzip file ({type(exc).__name__}: {exc})") from exc


def save_jsonl(path: str | os.PathLike[str], trajectories: Iterable[Trajectory], *, append: bool = False) -> int:
    """Writes one JSON object per line; returns the number written."""
    return write_records(path, (t.to_dict() for t in trajectories), append=append)


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Yields trajectories from a JSONL file; a bad line raises naming the file and line number."""
    return iter_records(path, Trajectory.from_dict)


def load_jsonl(path: str | os.PathLike[str]) -> list[Trajectory]:
    return list(iter_jsonl(path))
