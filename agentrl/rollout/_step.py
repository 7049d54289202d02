"""Per-step state of the rollout scheduler: the step's client view, groups and members, and the
small helpers over them. Private to :mod:`agentrl.rollout.scheduler`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.data.source import DataRow
from agentrl.rollout._requests import new_id
from agentrl.rollout._scheduler_types import RepeatedFailureError
from agentrl.rollout.agent import Episode, EpisodeRunner, GenerateClient
from agentrl.rollout.groups import version_number
from agentrl.rollout.stats import StepStats
from agentrl.rollout.types import FinishKind, FinishReason, GenerateResult, SamplingParams
from agentrl.trajectory import EpisodeError, ErrorKind, SegmentKind, Status, Trajectory

__all__ = ["FailureStreak", "Member", "MemberRecord", "PendingGroup", "Step", "StepClient", "close_all", "code_failure", "lost_reason",
           "member_sequences", "not_sent", "oldest_version", "segment_version"]


@dataclass
class Step:
    index: int
    aborted: bool = False
    inflight: set[str] = field(default_factory=set)
    stats: StepStats = field(default_factory=StepStats)


class StepClient:
    """The scheduler's view of the inference client for one step: request slots, abort flag, rid tracking."""

    def __init__(self, client: GenerateClient, slots: asyncio.Semaphore, step: Step) -> None:
        self.client, self.slots, self.step = client, slots, step

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str | None = None,
                       routing_key: str | None = None, **routing: Any) -> GenerateResult:
        rid = rid or new_id()
        async with self.slots:
            if self.step.aborted:  # checked after the slot: a waiting request must not start after the abort
                return not_sent(rid)
            self.step.inflight.add(rid)
            try:
                return await self.client.generate(input_ids, sampling, rid=rid, routing_key=routing_key, **routing)
            finally:
                self.step.inflight.discard(rid)

    async def abort(self, rid: str) -> None:
        abort = getattr(self.client, "abort", None)
        if abort is not None:
            await abort(rid)


def not_sent(rid: str) -> GenerateResult:
    return GenerateResult(rid=rid, output_ids=(), output_logprobs=(), weight_version=None, prompt_tokens=0,
                          cached_tokens=0, completion_tokens=0,
                          finish_reason=FinishReason(FinishKind.ABORT, message="the step was full; not sent"))


@dataclass
class MemberRecord:
    """A suspended episode as saved (:func:`agentrl.rollout.restore.member_state`): its sequences so far
    and the agent loop's counters; rebuilt into a runner by :func:`agentrl.rollout.restore.replay`."""

    sequences: list[Trajectory]
    partial_turn_tokens: int = 0
    metrics: dict[str, int] = field(default_factory=dict)  # the agent loop's counters (token and turn counts)
    timings: dict[str, float] = field(default_factory=dict)
    reward_parts: dict[str, float] = field(default_factory=dict)
    env_info: list[dict[str, Any]] = field(default_factory=list)
    suspensions: int = 0
    abort_message: str | None = None

    @property
    def rollout_id(self) -> str | None:
        return self.sequences[0].rollout_id if self.sequences else None


@dataclass
class Member:
    runner: EpisodeRunner | None = None
    episode: Episode | None = None
    lost: str | None = None
    error: EpisodeError | None = None  # why it was lost before it had an episode (its environment raised)
    stale: bool = False
    retries: int = 0
    start_version: int = 0
    restore: MemberRecord | None = None  # a suspended episode loaded from a saved state, rebuilt at its next run

    @property
    def finished(self) -> bool:
        """Ended: with an episode, or lost before it had one (its environment could not be built or reset)."""
        return self.episode is not None or self.lost is not None


@dataclass
class PendingGroup:
    group_id: str
    row: DataRow
    members: list[Member]
    regenerated: int = 0

    @property
    def complete(self) -> bool:
        return all(m.finished for m in self.members)

    def runners(self) -> list[EpisodeRunner]:
        return [m.runner for m in self.members if m.runner is not None]


# errors that make a failed episode lost (regenerated, or its group failed): the infrastructure's, not the model's
# (an agent harness that raised or ran past its deadline is the environment failing: agentrl.proxy)
_LOST_KINDS = (ErrorKind.ENGINE, ErrorKind.ENGINE_OUTPUT, ErrorKind.ENV, ErrorKind.AGENT, ErrorKind.AGENT_TIMEOUT,
               ErrorKind.SANDBOX_UNAVAILABLE, ErrorKind.EXECUTOR_LOST)
# the sandbox fleet's failures: the episode is lost whatever its status (a reward's command may hit one too)
_MACHINERY = (ErrorKind.SANDBOX_UNAVAILABLE, ErrorKind.EXECUTOR_LOST)


def lost_reason(episode: Episode) -> str | None:
    """Why an episode is not usable for training (None: usable): ``<kind>_error`` of its first sandbox
    fleet failure (``sandbox_unavailable``, ``executor_lost``: in a step or in the reward), else of its
    first engine or environment error, ``reward_error`` / ``reward_timeout`` (a reward failure under the
    ``drop_group`` policy), ``unscored`` or ``aborted``."""
    traj = episode.trajectory
    machinery = traj.error_of(*_MACHINERY)
    if machinery is not None and traj.status is not Status.ABORTED:
        return f"{machinery.kind.value}_error"
    if traj.status is Status.FAILED:
        error = traj.error_of(*_LOST_KINDS)
        if error is not None:
            return f"{error.kind.value}_error"
    if traj.reward is None and traj.status is not Status.ABORTED:
        if traj.error_of(ErrorKind.REWARD_TIMEOUT) is not None:
            return "reward_timeout"
        return "reward_error" if traj.error_of(ErrorKind.REWARD) is not None else "unscored"
    if traj.status is Status.ABORTED:
        return "aborted"
    return None



# errors of the code under training that end an episode unusable: what max_consecutive_failed_groups counts
_CODE_FAILURES = (ErrorKind.ENV, ErrorKind.AGENT, ErrorKind.AGENT_TIMEOUT, ErrorKind.REWARD, ErrorKind.REWARD_TIMEOUT)


def code_failure(member: Member) -> EpisodeError | bool | None:
    """How a finished member counts toward ``max_consecutive_failed_groups``: the error of the code under
    training (environment, agent harness, reward) it failed with; ``False`` when it did not fail (a
    usable, scored episode); ``True`` when it failed otherwise (the infrastructure, which never counts)."""
    if member.error is not None:
        return member.error
    if member.episode is None:
        return member.lost is not None
    errors = [e for seq in member.episode.sequences for e in seq.errors if not e.kind.infrastructure]
    reward = next((e for e in errors if e.kind in (ErrorKind.REWARD, ErrorKind.REWARD_TIMEOUT)), None)
    if member.lost is None and reward is None:
        return False
    return next((e for e in errors if e.kind in _CODE_FAILURES), True)


class FailureStreak:
    """The run of prompt groups failing with the same error of the code under training, judged in order;
    :meth:`add` raises :class:`RepeatedFailureError` when it reaches ``limit`` (None: never). A group with
    one usable, scored episode ends the run; a group that failed only for infrastructure reasons
    (:attr:`ErrorKind.infrastructure`) leaves it as it is. Errors are the same when they were raised at
    the same place (``origin``), else when kind, component and message are."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.signature: tuple[str | None, ...] | None = None
        self.groups = 0
        self.first: EpisodeError | None = None

    def add(self, group: PendingGroup) -> None:
        if self.limit is None:
            return
        outcomes = [code_failure(m) for m in group.members]
        if any(o is False for o in outcomes):
            self.signature, self.groups, self.first = None, 0, None
            return
        error = next((o for o in outcomes if isinstance(o, EpisodeError)), None)
        if error is None:
            return
        signature = (error.kind.value, error.origin) if error.origin else (error.kind.value, error.component,
                                                                          error.message)
        if signature != self.signature:
            self.signature, self.groups, self.first = signature, 0, error
        self.groups += 1
        if self.groups >= self.limit:
            assert self.first is not None
            raise RepeatedFailureError(self.first, self.groups, self.limit)


def segment_version(version: str | None, default: int) -> int:
    v = version_number(version)
    return default if v is None else v


def member_sequences(member: Member) -> list[Any]:
    if member.episode is not None:
        return list(member.episode.sequences)
    if member.runner is not None:
        return list(member.runner.sequences)
    return list(member.restore.sequences) if member.restore is not None else []


def oldest_version(sequences: Sequence[Any], default: int) -> int:
    oldest = default
    for traj in sequences:
        for seg in traj.segments:
            if seg.kind is SegmentKind.MODEL and seg.trainable:
                v = version_number(seg.weight_version)
                if v is not None and v < oldest:
                    oldest = v
    return oldest


async def close_all(runners: Sequence[EpisodeRunner]) -> None:
    await asyncio.gather(*(r.close() for r in runners), return_exceptions=True)

