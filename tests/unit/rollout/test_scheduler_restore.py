"""Scheduler.load_state_dict: buffered groups saved as JSON, loaded by a new scheduler (new environments), and
continued exactly as the uninterrupted scheduler continues them; replay mismatches, rejected rows, other data."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pytest

from agentrl.chat import ChatTemplate, Message, ToolCallFailure
from agentrl.data import DataError, DataSource
from agentrl.environments import StepResult, ToyArithmeticEnv, make_arithmetic_rows
from agentrl.rollout import AgentConfig, RestoreError, RoutingShape, SamplingParams, run_episode
from agentrl.rollout._step import Member
from agentrl.rollout.restore import member_state, restore_groups
from agentrl.rollout.scheduler import Scheduler, SchedulerConfig, SchedulerError, StepBatch
from agentrl.testing.policy import FakePolicyClient, PolicyRequest
from agentrl.token_data import ROUTED_EXPERTS
from agentrl.trajectory import SegmentKind, Status, StopReason, Trajectory

QUESTION = re.compile(r"What is (\d+) \* (\d+)\?")
ROWS = make_arithmetic_rows(8, seed=5)
SLOW = {ROWS[0]["question"], ROWS[1]["question"]}  # these prompts are cut short in step 1
PER_TURN = 200


@pytest.fixture(scope="module")
def template(tok: Any) -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=tok)


def _question(text: str) -> str:
    a, b = QUESTION.findall(text)[-1]
    return f"What is {a} * {b}?"


def second_turn(req: PolicyRequest) -> bool:
    return "<tool_response>" in req.text or "Say it again." in req.text


def tool_then_answer(req: PolicyRequest) -> str:
    """Calls the calculator, then answers; the slow prompts answer at length."""
    a, b = (int(x) for x in QUESTION.findall(req.text)[-1])
    if not second_turn(req):
        call = '{"name": "calculator", "arguments": {"expression": "%s"}}' % f"{a} * {b}"  # noqa: UP031
        return f"<tool_call>\n{call}\n</tool_call><|im_end|>"
    return ("x" * 60 if _question(req.text) in SLOW else "a b " * 20) + f" \\boxed{{{a * b}}}<|im_end|>"


def think_then_repeat(req: PolicyRequest) -> str:
    """With FollowUp: turn 1 thinks and answers (the next render strips the thought: a fork), turn 2 repeats."""
    if not second_turn(req):
        return "<think>hm</think>\\boxed{1}<|im_end|>"
    thought = "y" * 60 if _question(req.text) in SLOW else "a b " * 20
    return f"<think>{thought}</think>\\boxed{{1}}<|im_end|>"


def delay(req: PolicyRequest) -> float:
    """The slow prompts' second turn takes 0.9 s, the others' about 0.1 s: step 1 cuts the slow ones short."""
    return 0.015 if second_turn(req) and _question(req.text) in SLOW else 0.002


class FollowUp(ToyArithmeticEnv):
    """Asks the model to say it again once (a user turn), then ends."""

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        self._begin_step()
        if self.turns == 1:
            return StepResult(messages=[Message(role="user", content="Say it again.")])
        return self._finish(StepResult(), StopReason.ENV_DONE)


class Drifting(ToyArithmeticEnv):
    """Its tool answers change between runs (``suffix``), or its opening does (``system``): no faithful replay."""

    suffix = ""
    system = ""
    opened = 0
    closed = 0

    async def reset(self) -> list[Message]:
        type(self).opened += 1
        if self.system:
            self.system_prompt = self.system
        return await super().reset()

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        result = await super().step(reply, failures)
        if self.suffix:
            result.messages = [dataclasses.replace(m, content=f"{m.content} {self.suffix}") for m in result.messages]
        return result

    async def close(self) -> None:
        type(self).closed += 1


def make(template: ChatTemplate, client: Any, env: Any = ToyArithmeticEnv, *, rows: list[dict[str, Any]] = ROWS,
         routing: RoutingShape | None = None, **cfg: Any) -> Scheduler:
    config = {"groups_per_step": 2, "group_size": 2, "over_sampling": 1.0, "partial_rollout": True, **cfg}
    return Scheduler(env, template, client, DataSource.from_rows(rows, shuffle=False), SchedulerConfig(**config),
                     agent=AgentConfig(sampling=SamplingParams(max_new_tokens=PER_TURN), routed_experts=routing))


def client_for(tok: Any, policy: Callable[[PolicyRequest], str]) -> FakePolicyClient:
    return FakePolicyClient(tok, policy, token_delay_s=delay, weight_version="0")


async def first_step(template: ChatTemplate, tok: Any, policy: Callable[[PolicyRequest], str], env: Any = ToyArithmeticEnv,
                     **cfg: Any) -> tuple[Scheduler, FakePolicyClient, dict[str, Any]]:
    """Step 1 (the slow groups are cut short and buffered), then the saved state as a checkpoint holds it."""
    # warm up (first renders, parses, schemas) so that no one-off pause skews the timing of step 1
    await run_episode(env(ROWS[-1]), template, FakePolicyClient(tok, policy), AgentConfig())
    client = client_for(tok, policy)
    sched = make(template, client, env, **cfg)
    batch = await sched.collect()
    batch.report.check()
    assert batch.report.buffered == 2 and sorted(sched.buffered_prompt_ids()) == ["1", "2"]
    state = orjson.loads(orjson.dumps(sched.state_dict()))  # plain JSON types, as a checkpoint writes them
    return sched, client, state


async def next_step(sched: Scheduler, client: FakePolicyClient) -> StepBatch:
    """Step 2 at policy version 1, with no more groups in flight than it needs (the buffered ones come first)."""
    sched.set_policy_version(1)  # the trainer updated the policy; the engine now serves version 1
    client.weight_version = "1"
    sched.config = dataclasses.replace(sched.config, over_sampling=0.0)
    batch = await sched.collect()
    batch.report.check()
    return batch


def record(batch: StepBatch) -> list[dict[str, Any]]:
    """What training sees of each trajectory (and the episode counters), in a stable order."""
    out = []
    for traj in sorted(batch.trajectories(), key=lambda t: (t.sample_id or "", t.sequence_index)):
        d = traj.to_dict()
        d["metrics"] = {k: v for k, v in d["metrics"].items() if not k.startswith("time/")}
        out.append(d)
    return out


def suspended_turn(state: dict[str, Any]) -> list[int]:
    """Each saved suspended member's partial-turn tokens (precondition: the cut fell inside a later turn)."""
    parts = []
    for group in state["buffer"]:
        for m in group["members"]:
            assert not m["finished"] and m["runner"] is not None
            parts.append(m["partial_turn_tokens"])
    return parts


@pytest.mark.parametrize("scenario", ["tool_turn", "fork", "moe_routing"])
async def test_a_restored_buffer_continues_exactly_like_the_uninterrupted_run(tok: Any, template: ChatTemplate,
                                                                             scenario: str) -> None:
    policy, env = (think_then_repeat, FollowUp) if scenario == "fork" else (tool_then_answer, ToyArithmeticEnv)
    routing = RoutingShape(layers=2, top_k=2, experts=8) if scenario == "moe_routing" else None
    original, original_client, state = await first_step(template, tok, policy, env, routing=routing)
    partial = suspended_turn(state)
    assert all(p > 0 for p in partial), partial
    for member in (m for g in state["buffer"] for m in g["members"]):  # precondition: cut inside turn 2
        seqs = [Trajectory.from_dict(s) for s in member["sequences"]]
        turns = [len(t.segments_of(SegmentKind.MODEL)) for t in seqs]
        assert turns == ([1, 1] if scenario == "fork" else [2]), turns

    resumed_client = client_for(tok, policy)
    resumed = make(template, resumed_client, env, routing=routing)  # a new scheduler: new data source, new environments
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state  # loaded, not yet run: saved exactly as it was loaded
    assert (resumed.policy_version, resumed.steps, resumed.buffered_groups) == (0, 1, 2)

    expected = await next_step(original, original_client)
    got = await next_step(resumed, resumed_client)
    assert sorted(g.prompt_id for g in expected.groups) == ["1", "2"]  # precondition: the buffered groups won step 2
    assert record(got) == record(expected)  # tokens, masks, logprobs, segments, messages, rewards, ids, counters
    assert got.report.members_restored == 4 and got.report.restored_mismatch == 0
    for traj in got.trajectories():
        assert traj.status is Status.COMPLETED and traj.reward is not None
    if scenario == "fork":
        assert all(len(ep.sequences) == 2 for ep in got.episodes())  # the fork was replayed
    else:  # the environment's state was rebuilt: its tool call counts
        assert all(ep.trajectory.metrics["tool_calls"] == 1 for ep in got.episodes())
    if routing is not None:  # the routing held before the cut was kept; the continuation asked for the rest only
        for traj in got.trajectories():
            channel = traj.channels[ROUTED_EXPERTS]
            assert channel.present[:-1].all() and traj.metrics["routing/rows"] == len(traj.tokens) - 1
        cut_requests = [r for r in resumed_client.requests if _question(r.text) in SLOW]
        assert all(r.routed_experts_start == len(r.input_ids) - 1 for r in cut_requests)
    # the engine saw only the continuations of the cut turns, asking for what was left of their budget
    cut = [r for r in resumed_client.requests if _question(r.text) in SLOW]
    assert sorted(r.sampling.max_new_tokens for r in cut) == sorted(PER_TURN - p for p in partial)
    assert got.report.to_dict() | {"metrics": {}} == expected.report.to_dict() | {"metrics": {}, "members_restored": 4}
    assert resumed.state_dict()["data"] == original.state_dict()["data"]
    await original.shutdown()
    await resumed.shutdown()


async def test_groups_never_started_restore_as_fresh_members(tok: Any, template: ChatTemplate) -> None:
    client = client_for(tok, tool_then_answer)
    original = make(template, client, partial_rollout=False)  # cut-short groups are recycled: fresh members
    first = await original.collect()
    assert first.report.recycled == 2
    state = orjson.loads(orjson.dumps(original.state_dict()))
    assert all(m == {**m, "finished": False, "sequences": [], "runner": None}
               for g in state["buffer"] for m in g["members"])
    resumed_client = client_for(tok, tool_then_answer)
    resumed = make(template, resumed_client, partial_rollout=False)
    resumed.load_state_dict(state)
    expected, got = await next_step(original, client), await next_step(resumed, resumed_client)
    assert sorted(g.prompt_id for g in got.groups) == sorted(g.prompt_id for g in expected.groups) == ["1", "2"]
    assert [t["tokens"] for t in record(got)] == [t["tokens"] for t in record(expected)]
    assert got.report.members_restored == 0 and got.report.from_buffer == expected.report.from_buffer == 2


async def test_finished_members_get_their_episodes_back(tok: Any, template: ChatTemplate) -> None:
    client = client_for(tok, tool_then_answer)
    sched = make(template, client, groups_per_step=1, over_sampling=0.0, partial_rollout=False)
    (group,) = (await sched.collect()).groups
    finished = [Member(episode=ep, start_version=0) for ep in group.episodes]
    lost = Member(lost="env_build_error: RuntimeError: no image")
    saved = {"group_id": group.group_id, "prompt_id": group.prompt_id, "epoch": 0, "row": group.row,
             "members": [member_state(m) for m in (*finished, lost)]}
    saved = orjson.loads(orjson.dumps(saved))
    (restored,) = restore_groups([saved], sched.data, 3)
    assert restored.complete and restored.members[2].lost == lost.lost and restored.members[2].episode is None
    for mine, theirs in zip(restored.members[:2], group.episodes, strict=True):
        assert mine.episode is not None
        assert [s.to_dict() for s in mine.episode.sequences] == [s.to_dict() for s in theirs.sequences]
        assert mine.episode.env_info == theirs.env_info
    # a new scheduler judges a complete buffered group at once: trained with these episodes, no request sent
    state = {"data": sched.data.state_dict(), "policy_version": 0, "steps": 1, "buffer": [dict(saved, members=saved["members"][:2])]}
    again_client = client_for(tok, tool_then_answer)
    again = make(template, again_client, groups_per_step=1, over_sampling=0.0)
    again.load_state_dict(state)
    (trained,) = (await again.collect()).groups
    assert [t.tokens for t in trained.trajectories()] == [t.tokens for t in group.trajectories()]
    assert trained.rewards == group.rewards and again_client.requests == []


@pytest.mark.parametrize("drift", ["tool_answer", "opening"])
async def test_a_replay_that_does_not_match_restarts_the_member_and_is_counted(tok: Any, template: ChatTemplate,
                                                                               drift: str) -> None:
    Drifting.suffix = Drifting.system = ""
    Drifting.opened = Drifting.closed = 0
    original, _, state = await first_step(template, tok, tool_then_answer, Drifting)
    await original.shutdown()
    if drift == "tool_answer":
        Drifting.suffix = "(v2)"  # the tool answers differently now
    else:
        Drifting.system = "You are a careful calculator."
    resumed_client = client_for(tok, tool_then_answer)
    resumed = make(template, resumed_client, Drifting)
    resumed.load_state_dict(state)
    batch = await next_step(resumed, resumed_client)
    report = batch.report
    assert report.restored_mismatch == 4 and report.members_restored == 0
    assert all("differs from the record" in p for p in report.restore_problems), report.restore_problems
    assert [g.prompt_id for g in batch.groups] == ["1", "2"]
    for traj in batch.trajectories():  # restarted from scratch: nothing of the old episode is left
        model = traj.segments_of(SegmentKind.MODEL)
        assert [s.weight_version for s in model] == ["1", "1"] and traj.status is Status.COMPLETED
        assert traj.metrics["tool_calls"] == 1
    await resumed.shutdown()
    assert Drifting.opened == Drifting.closed  # every environment, replayed or not, was closed


async def test_a_row_the_environment_rejects_loses_its_members_with_the_reason(tok: Any,
                                                                               template: ChatTemplate) -> None:
    _, _, state = await first_step(template, tok, tool_then_answer)

    def factory(row: dict[str, Any]) -> ToyArithmeticEnv:
        if row["question"] in SLOW:
            raise ValueError(f"question {row['question']!r}: this sandbox image is gone")
        return ToyArithmeticEnv(row)

    resumed_client = client_for(tok, tool_then_answer)
    resumed = make(template, resumed_client, factory, over_sampling=0.0)
    resumed.load_state_dict(state)
    batch = await next_step(resumed, resumed_client)
    assert batch.report.failed == {"env_build_error": 2} and batch.report.members_lost == 4
    assert len(batch.groups) == 2 and not {g.prompt_id for g in batch.groups} & {"1", "2"}
    assert batch.report.from_buffer == 2 and batch.report.trained == 2
    await resumed.shutdown()


async def test_a_state_saved_for_other_data_or_another_group_size_is_refused(tok: Any,
                                                                             template: ChatTemplate) -> None:
    original, client, state = await first_step(template, tok, tool_then_answer)
    await original.shutdown()
    other_rows = make_arithmetic_rows(8, seed=6)  # the same size, other questions
    cases: list[tuple[Scheduler, type[Exception], str]] = [
        (make(template, client, rows=other_rows), RestoreError, r"buffer\[0\] \(prompt '1'\).*saved for other data"),
        (make(template, client, rows=ROWS[:1], groups_per_step=1), RestoreError,
         r"buffer\[1\] \(prompt '2'\): the data source '<rows>' has no row with this prompt id"),
        (make(template, client, rows=ROWS[:5]), DataError, r"rows=8 but this source has 5"),
        (make(template, client, group_size=3), RestoreError, r"2 members saved but SchedulerConfig.group_size=3"),
    ]
    reordered = Scheduler(ToyArithmeticEnv, template, client, DataSource.from_rows(ROWS, shuffle=True),
                          SchedulerConfig(groups_per_step=2, group_size=2))
    cases.append((reordered, DataError, r"shuffle=False.*other data or another order"))
    for sched, error, message in cases:
        before = orjson.dumps(sched.state_dict())
        with pytest.raises(error, match=message):
            sched.load_state_dict(state)
        assert orjson.dumps(sched.state_dict()) == before  # nothing changed
    broken = orjson.loads(orjson.dumps(state))
    broken["buffer"][1]["members"][0]["sequences"][0]["tokens"] = []
    with pytest.raises(RestoreError, match=r"buffer\[1\] \(prompt '2'\)\.members\[0\]: a broken member record"):
        make(template, client).load_state_dict(broken)
    with pytest.raises(RestoreError, match=r"missing \['buffer'\]"):
        make(template, client).load_state_dict({k: v for k, v in state.items() if k != "buffer"})
    loaded = make(template, client)
    loaded.load_state_dict(state)
    with pytest.raises(SchedulerError, match="already holds 2 buffered groups"):
        loaded.load_state_dict(state)


class HangingTools(ToyArithmeticEnv):
    """While ``hang`` is set, the slow prompts' tool calls never return (a stuck sandbox)."""

    hang = False
    opened = 0
    closed = 0

    async def reset(self) -> list[Message]:
        type(self).opened += 1
        return await super().reset()

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        if self.hang and self.task.question in SLOW:
            await asyncio.sleep(30)
        return await super().step(reply, failures)

    async def close(self) -> None:
        type(self).closed += 1


async def test_a_replay_cut_off_by_the_abort_deadline_keeps_its_record(tok: Any, template: ChatTemplate) -> None:
    HangingTools.hang, HangingTools.opened, HangingTools.closed = False, 0, 0
    original, _, state = await first_step(template, tok, tool_then_answer, HangingTools)
    await original.shutdown()
    client = client_for(tok, tool_then_answer)
    resumed = make(template, client, HangingTools, abort_timeout_s=0.3)
    resumed.load_state_dict(state)
    HangingTools.hang = True  # the replays hang in env.step; fresh prompts fill the step; the abort cancels them
    cut = await resumed.collect()
    cut.report.check()
    assert sorted(g.prompt_id for g in cut.groups) == ["5", "6"] and cut.report.buffered == 2
    assert cut.report.metrics["abort/cancelled_tasks"] == 2 and cut.report.members_restored == 0
    again = orjson.loads(orjson.dumps(resumed.state_dict()))
    assert again["buffer"] == state["buffer"]  # the cut-off members are saved as they were loaded
    HangingTools.hang = False
    batch = await next_step(resumed, client)
    assert sorted(g.prompt_id for g in batch.groups) == ["1", "2"] and batch.report.members_restored == 4
    for traj in batch.trajectories():  # turn 1 and the first part of turn 2 from the record, the rest new
        assert [s.weight_version for s in traj.segments_of(SegmentKind.MODEL)] == ["0", "0", "1"]
    await resumed.shutdown()
    assert HangingTools.opened == HangingTools.closed
