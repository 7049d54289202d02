"""Saving and rebuilding the scheduler's buffered groups: a resumed run continues their episodes.

:meth:`Scheduler.state_dict <agentrl.rollout.scheduler.Scheduler.state_dict>` saves each buffered
group as plain JSON types: its row, and per member either the finished :class:`Episode`, the reason
it was lost, or — for an episode the step cut short — its sequences so far (``Trajectory.to_dict``)
with the agent loop's counters (metrics, timings, step-level reward parts, the environment's info,
the last abort's message). :meth:`~agentrl.rollout.scheduler.Scheduler.load_state_dict` reads it back
into a new scheduler (new environment objects, maybe a new process):

- a finished member gets its episode back, a lost one its reason, a never-started one starts fresh;
- a suspended member is rebuilt when its group next runs: a fresh environment from the saved row
  (``env_factory(row)``), ``reset()``, then the environment's side is **replayed**
  (:func:`replay`): the agent loop runs again against a client that answers every request with the
  recorded model segment (ids, logprobs, weight version, finish reason; the per-token channels, such
  as MoE routing, are taken from the record), so every completed turn's
  parsed message reaches ``env.step`` again, forks happen where they happened, and the bridge
  session is rebuilt as it was. Each request's prompt must equal the recorded tokens before that
  segment, and the rebuilt sequences must equal the record (tokens, masks, logprobs, segments,
  messages); a recorded turn cut short by the abort leaves the runner holding that partial turn,
  so the next request continues the *same* turn with what is left of its budget. The environment
  is then in the state it had when the step was cut short (tool state, turn counters).
- when the replay does not match (an environment that answers differently the second time, a
  changed template or budget), the member restarts from scratch and the step counts it
  (``StepReport.restored_mismatch``, with the reason in ``StepReport.restore_problems``).

The saved state is refused (:class:`RestoreError`) when it was saved for other data (a buffered
row differs from this data source's row with the same prompt id) or for a different group size.

Example::

    state = orjson.loads(orjson.dumps(scheduler.state_dict()))     # written into a checkpoint
    resumed = Scheduler(ToyArithmeticEnv, template, client, DataSource.from_rows(rows, seed=0), config)
    resumed.load_state_dict(state)
    batch = await resumed.collect()        # the buffered episodes continue where they stopped
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from agentrl.data.source import DataRow, DataSource
from agentrl.episode import Episode
from agentrl.rollout._step import Member, MemberRecord, PendingGroup, member_sequences
from agentrl.rollout.agent import EpisodeRunner
from agentrl.rollout.types import FinishKind, FinishReason, GenerateResult, SamplingParams
from agentrl.trajectory import SegmentKind, Trajectory, TrajectoryError

__all__ = ["RestoreError", "member_state", "replay", "restore_groups"]


class RestoreError(ValueError):
    """A saved scheduler state cannot be loaded here (other data, another group size, a broken record)."""


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples become lists...), for comparisons."""
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))


# -- saving ----------------------------------------------------------------------------------------
def member_state(member: Member) -> dict[str, Any]:
    """One member as JSON types: finished (episode or lost reason), suspended (sequences and counters) or fresh."""
    if member.episode is None and member.restore is not None:  # loaded and not run since: saved as loaded
        return _record_state(member, member.restore)
    runner = member.runner
    state: dict[str, Any] = {
        "finished": member.finished, "lost": member.lost, "start_version": member.start_version,
        "retries": member.retries, "partial_turn_tokens": 0,
        "sequences": [t.to_dict() for t in member_sequences(member)],
        "env_info": [dict(i) for i in member.episode.env_info] if member.episode is not None else [], "runner": None}
    if member.episode is None and member.lost is None and runner is not None and runner.started:
        state["partial_turn_tokens"] = runner.partial_turn_tokens
        state["env_info"] = [dict(i) for i in runner.env_info]
        state["runner"] = {"metrics": dict(runner.metrics), "timings": dict(runner.timings),
                           "reward_parts": dict(runner.reward_parts), "suspensions": runner.suspensions,
                           "abort_message": runner.abort_message}
    return state


def _record_state(member: Member, record: MemberRecord) -> dict[str, Any]:
    return {"finished": False, "lost": None, "start_version": member.start_version, "retries": member.retries,
            "partial_turn_tokens": record.partial_turn_tokens, "sequences": [t.to_dict() for t in record.sequences],
            "env_info": [dict(i) for i in record.env_info],
            "runner": {"metrics": dict(record.metrics), "timings": dict(record.timings),
                       "reward_parts": dict(record.reward_parts), "suspensions": record.suspensions,
                       "abort_message": record.abort_message}}


# -- loading ---------------------------------------------------------------------------------------
def restore_groups(buffer: Sequence[Mapping[str, Any]], data: DataSource, group_size: int) -> list[PendingGroup]:
    """The buffered groups of a saved state, checked against ``data`` and ``group_size``; nothing is built yet."""
    if not isinstance(buffer, Sequence) or isinstance(buffer, str | bytes):
        raise RestoreError(f"scheduler state: 'buffer' is {type(buffer).__name__}; expected a list of groups")
    groups = []
    for i, saved in enumerate(buffer):
        where = f"scheduler state buffer[{i}]"
        try:
            prompt_id, members = str(saved["prompt_id"]), saved["members"]
            row = DataRow(prompt_id=prompt_id, row_number=int(saved.get("row_number", prompt_id)),
                          epoch=int(saved["epoch"]), data=dict(saved["row"]))
            group_id = str(saved["group_id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RestoreError(f"{where}: expected group_id, prompt_id, epoch, row and members ({exc!r})") from exc
        where = f"{where} (prompt {prompt_id!r})"
        _check_row(where, row, data)
        restored = [_member(f"{where}.members[{j}]", m) for j, m in enumerate(members)]
        unfinished = any(not m.finished for m in restored)
        if len(restored) > group_size or (unfinished and len(restored) != group_size) or not restored:
            raise RestoreError(f"{where}: {len(restored)} members saved but SchedulerConfig.group_size={group_size}; "
                               "expected the group size the state was saved with")
        groups.append(PendingGroup(group_id=group_id, row=row, members=restored,
                                   regenerated=int(saved.get("regenerated", 0))))
    return groups


def _check_row(where: str, row: DataRow, data: DataSource) -> None:
    try:
        current = data.row(row.prompt_id)
    except (KeyError, ValueError):
        raise RestoreError(f"{where}: the data source {data.name!r} has no row with this prompt id; the state was "
                           "saved for other data") from None
    if _plain(current) != _plain(row.data):
        raise RestoreError(f"{where}: the saved row {_short(row.data)} differs from row {row.prompt_id} of the data "
                           f"source {data.name!r} {_short(current)}; the state was saved for other data")


def _short(value: Any) -> str:
    text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= 120 else text[:117] + "..."


def _member(where: str, saved: Mapping[str, Any]) -> Member:
    try:
        sequences = [Trajectory.from_dict(t) for t in saved.get("sequences", [])]
        member = Member(lost=saved.get("lost"), retries=int(saved.get("retries", 0)),
                        start_version=int(saved.get("start_version", 0)))
        env_info = [dict(i) for i in saved.get("env_info", [])]
        if saved.get("finished"):
            if sequences:
                member.episode = Episode(sequences=sequences, env_info=env_info)
                member.episode.validate()
            elif member.lost is None:
                raise RestoreError(f"{where}: finished without an episode or a lost reason")
            return member
        if sequences:
            counters = saved.get("runner") or {}
            member.restore = MemberRecord(
                sequences=sequences, partial_turn_tokens=int(saved.get("partial_turn_tokens", 0)),
                metrics={str(k): int(v) for k, v in (counters.get("metrics") or {}).items()},
                timings={str(k): float(v) for k, v in (counters.get("timings") or {}).items()},
                reward_parts={str(k): float(v) for k, v in (counters.get("reward_parts") or {}).items()},
                env_info=env_info, suspensions=int(counters.get("suspensions", 0)),
                abort_message=counters.get("abort_message"))
        return member
    except RestoreError:
        raise
    except (TrajectoryError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RestoreError(f"{where}: a broken member record: {exc}") from exc


# -- replaying a suspended episode -----------------------------------------------------------------
class _Mismatch(Exception):
    pass


class _ReplayClient:
    """Answers each request of a replayed episode with the next recorded model segment, checking its prompt."""

    def __init__(self, sequences: Sequence[Trajectory]) -> None:
        self.turns = [(i, seq, seg) for i, seq in enumerate(sequences) for seg in seq.segments
                      if seg.kind is SegmentKind.MODEL]
        self.cursor = 0

    def exhausted(self) -> bool:
        return self.cursor >= len(self.turns)

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str | None = None,
                       routing_key: str | None = None, **_: Any) -> GenerateResult:
        if self.exhausted():
            raise _Mismatch(f"the replay asked for a model turn beyond the {len(self.turns)} recorded")
        index, seq, seg = self.turns[self.cursor]
        self.cursor += 1
        expected = seq.tokens[: seg.start]
        if list(input_ids) != expected:
            at = next((k for k, (a, b) in enumerate(zip(input_ids, expected, strict=False)) if a != b),
                      min(len(input_ids), len(expected)))
            raise _Mismatch(f"sequence {index}, model segment at token {seg.start}: the rebuilt prompt "
                            f"({len(input_ids)} tokens) differs from the record ({len(expected)}) from token {at} "
                            "on (the environment answered differently)")
        if sampling.max_new_tokens < seg.length:
            raise _Mismatch(f"sequence {index}, model segment at token {seg.start}: the turn's budget is "
                            f"{sampling.max_new_tokens} tokens but the record sampled {seg.length} (a smaller "
                            "max_new_tokens or context?)")
        kind = FinishKind(seg.finish_reason) if seg.finish_reason else FinishKind.STOP
        finish = FinishReason(kind, message="replayed abort" if kind is FinishKind.ABORT else None)
        ids = tuple(seq.tokens[seg.start: seg.end])
        lo = seg.start - seq.prompt_length  # logprobs cover the response only
        return GenerateResult(rid=rid or "replay", output_ids=ids, output_logprobs=tuple(seq.logprobs[lo: lo + len(ids)]),
                              finish_reason=finish, weight_version=seg.weight_version, prompt_tokens=0,
                              cached_tokens=0, completion_tokens=len(ids))


async def replay(runner: EpisodeRunner, record: MemberRecord) -> str | None:
    """Rebuilds ``record`` in ``runner`` (a new runner on a fresh environment): runs the agent loop on the
    recorded model turns, so the environment sees every completed turn again. Returns None when the
    rebuilt episode equals the record (the runner then holds its counters and its partial turn, suspended),
    else why not (the runner is then unusable: close it)."""
    client = _ReplayClient(record.sequences)
    own = runner.client
    runner.client = client
    try:
        begin = getattr(runner.env, "begin_replay", None)  # a workspace answers replayed calls from the record
        if callable(begin):
            begin(record.sequences, record.env_info)
        while True:
            before = client.cursor
            episode = await runner.advance(client.exhausted)
            if episode is not None:
                return (f"the rebuilt episode ended ({episode.stop_reason.value if episode.stop_reason else None}) "
                        f"after {client.cursor} of {len(client.turns)} recorded model segments")
            if client.exhausted():
                break
            if client.cursor == before:
                return f"the replay stopped after {client.cursor} of {len(client.turns)} recorded model segments"
    except _Mismatch as exc:
        return str(exc)
    except Exception as exc:  # reset() or step() raised: the environment cannot be rebuilt as it was
        return f"the environment raised during the replay: {type(exc).__name__}: {exc}"
    finally:
        runner.client = own
    problem = _compare(runner.sequences, record)
    if problem is None and runner.partial_turn_tokens != record.partial_turn_tokens:
        problem = (f"the rebuilt partial turn has {runner.partial_turn_tokens} tokens; the record has "
                   f"{record.partial_turn_tokens}")
    if problem is not None:
        return problem
    _adopt(runner, record)
    return None


_COMPARED = ("tokens", "prompt_length", "loss_mask", "logprobs", "segments", "messages", "sequence_index")


def _compare(rebuilt: Sequence[Trajectory], record: MemberRecord) -> str | None:
    if len(rebuilt) != len(record.sequences):
        return f"the replay made {len(rebuilt)} sequences; the record has {len(record.sequences)}"
    for i, (mine, saved) in enumerate(zip(rebuilt, record.sequences, strict=True)):
        a, b = mine.to_dict(), saved.to_dict()
        for key in _COMPARED:
            if _plain(a[key]) != _plain(b[key]):
                return f"sequence {i}: the rebuilt {key} differ from the record's"
    return None


def _adopt(runner: EpisodeRunner, record: MemberRecord) -> None:
    """The recorded ids and counters (the replay's own timings and engine counts are not the episode's)."""
    for mine, saved in zip(runner.sequences, record.sequences, strict=True):
        mine.session_id, mine.info, mine.metrics = saved.session_id, dict(saved.info), dict(saved.metrics)
        mine.errors = list(saved.errors)
        mine.channels = {name: channel.copy() for name, channel in saved.channels.items()}  # routing, as recorded
    runner.metrics = Counter(record.metrics)
    runner.timings = dict(record.timings)
    runner.reward_parts = dict(record.reward_parts)
    runner.env_info[:] = [dict(i) for i in record.env_info]
    runner.suspensions = record.suspensions
    runner.abort_message = record.abort_message
