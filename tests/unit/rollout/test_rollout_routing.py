"""Mixture-of-experts routing on the rollout side: the client asks for it (around sglang-router, which
drops the fields), checks and decodes it; the agent loop asks only for positions it does not hold,
writes them into the trajectory's routed_experts channel through forks and resumed turns, and counts
what is missing."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from agentrl.chat import ChatTemplate, Message, ToolCallFailure
from agentrl.environments import Environment, StepResult
from agentrl.rollout import ClientConfig, InferenceClient, RoutingShape, SamplingParams
from agentrl.rollout.agent import AgentConfig, EpisodeRunner, run_episode
from agentrl.rollout.client import parse_generate_response
from agentrl.rollout.types import GenerateResult, ProtocolError
from agentrl.testing.fake_worker import FakeCluster
from agentrl.testing.scripted import ScriptedClient, ScriptedTurn, scripted_routing
from agentrl.token_data import ROUTED_EXPERTS
from agentrl.trajectory import Status, StopReason, Trajectory

SHAPE = RoutingShape(layers=2, top_k=2, experts=8)


@pytest.fixture(scope="module")
def qwen3(tok: Any) -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=tok)


class FollowUps(Environment):
    """A user asks ``turns`` questions in a row (one per model answer)."""

    turns_wanted = 3

    async def reset(self) -> list[Message]:
        return [Message(role="user", content="2**10?")]

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        self._begin_step()
        if self.turns < self.turns_wanted:
            return StepResult(messages=[Message(role="user", content=f"And 2**{10 + self.turns}?")])
        return self._finish(StepResult(), StopReason.ENV_DONE)

    def reward(self, trajectory: Trajectory) -> float:
        return 1.0


PLAIN = "\\boxed{1024}<|im_end|>"
THINKING = "<think>\nSo.\n</think>\n\n\\boxed{1024}<|im_end|>"


def check_channel(traj: Trajectory) -> None:
    """Every position but the last holds the scripted engine's routing of its token; the last none."""
    channel = traj.channels[ROUTED_EXPERTS]
    assert channel.dtype == "uint8" and channel.row_shape == (2, 2) and len(channel) == len(traj.tokens)
    assert channel.present[:-1].all() and not channel.present[-1]
    assert np.array_equal(channel.values[:-1], scripted_routing(traj.tokens[:-1], SHAPE))


async def test_each_turn_asks_only_for_positions_not_held(tok: Any, qwen3: ChatTemplate) -> None:
    client = ScriptedClient(tok, [PLAIN, PLAIN, PLAIN])
    episode = await run_episode(FollowUps({}), qwen3, client, AgentConfig(
        sampling=SamplingParams(max_new_tokens=64), routed_experts=SHAPE))
    (traj,) = episode.sequences
    check_channel(traj)
    # linear transfer: a request starts where the previous answer's routing ended (its last sampled
    # token's position), so each position travelled exactly once
    starts = [r.routed_experts_start for r in client.requests]
    model_ends = [seg.end for seg in traj.segments if seg.kind.value == "model"]
    assert len(starts) == 3 and starts == [0, *(end - 1 for end in model_ends[:-1])]
    assert traj.metrics["routing/rows"] == len(traj.tokens) - 1 and traj.metrics["routing/missing_tokens"] == 0


async def test_a_forked_sequence_asks_from_its_start_and_both_hold_routing(tok: Any, qwen3: ChatTemplate) -> None:
    client = ScriptedClient(tok, [THINKING, PLAIN])
    env = FollowUps({})
    env.turns_wanted = 2
    episode = await run_episode(env, qwen3, client, AgentConfig(sampling=SamplingParams(max_new_tokens=64),
                                                                routed_experts=SHAPE))
    assert len(episode.sequences) == 2 and episode.sequences[1].fork_reason is not None
    assert [r.routed_experts_start for r in client.requests] == [0, 0]
    for traj in episode.sequences:
        check_channel(traj)


async def test_an_aborted_turn_resumes_from_the_first_missing_position(tok: Any, qwen3: ChatTemplate) -> None:
    class LosesRouting(ScriptedClient):
        async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, **kw: Any) -> GenerateResult:
            result = await super().generate(input_ids, sampling, **kw)
            if len(self.requests) == 1:  # the aborted part of the turn came back without routing
                return GenerateResult(**{**result.__dict__, "routed_experts": None})
            return result

    client = LosesRouting(tok, [ScriptedTurn("\\boxed{10", finish="abort"), "24}<|im_end|>"])
    env = FollowUps({})
    env.turns_wanted = 1
    runner = EpisodeRunner(env, qwen3, client, AgentConfig(sampling=SamplingParams(max_new_tokens=64),
                                                           routed_experts=SHAPE))
    assert await runner.advance() is None  # suspended
    held = len(runner.traj.tokens)
    episode = await runner.advance()
    assert episode is not None and episode.status is Status.COMPLETED
    assert [r.routed_experts_start for r in client.requests] == [0, 0]  # nothing was held: from the start
    assert len(client.requests[1].input_ids) == held
    check_channel(episode.trajectory)
    assert episode.trajectory.metrics["routing/missing_answers"] == 1
    await runner.close()


async def test_an_engine_without_routing_is_counted_not_hidden(tok: Any, qwen3: ChatTemplate) -> None:
    class NoRouting(ScriptedClient):
        async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, **kw: Any) -> GenerateResult:
            result = await super().generate(input_ids, sampling, **kw)
            return GenerateResult(**{**result.__dict__, "routed_experts": None})

    env = FollowUps({})
    env.turns_wanted = 2
    episode = await run_episode(env, qwen3, NoRouting(tok, [PLAIN, PLAIN]), AgentConfig(
        sampling=SamplingParams(max_new_tokens=64), routed_experts=SHAPE))
    traj = episode.trajectory
    assert ROUTED_EXPERTS not in traj.channels
    assert traj.metrics["routing/missing_answers"] == 2
    assert traj.metrics["routing/missing_tokens"] == len(traj.tokens) - 1


async def test_no_routing_is_asked_for_unless_configured(tok: Any, qwen3: ChatTemplate) -> None:
    client = ScriptedClient(tok, [PLAIN])
    env = FollowUps({})
    env.turns_wanted = 1
    episode = await run_episode(env, qwen3, client, AgentConfig(sampling=SamplingParams(max_new_tokens=64)))
    assert client.requests[0].routed_experts_start is None and not episode.trajectory.channels


# -- the client -------------------------------------------------------------------------------------------
def _answer(rows: np.ndarray | None, prompt: int = 3, completion: int = 2) -> dict[str, Any]:
    meta: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "finish_reason": {"type": "stop"},
                            "output_token_logprobs": [[-0.5, 7, None]] * completion}
    if rows is not None:
        meta["routed_experts"] = base64.b64encode(rows.astype("<i4").tobytes()).decode()
    return {"output_ids": [7] * completion, "meta_info": meta}


def test_the_answer_must_cover_exactly_the_positions_asked_for() -> None:
    rows = np.arange(3 * 4).reshape(3, 2, 2) % 8  # positions [1, 4) of a 3 + 2 token sequence
    got = parse_generate_response(_answer(rows), "r", routed_experts=SHAPE, routed_experts_start=1)
    assert got.routed_experts.dtype == np.uint8 and np.array_equal(got.routed_experts, rows)
    assert got.routed_experts_start == 1
    with pytest.raises(ProtocolError, match=r"holds 12 ids; expected 4 positions \[0, 4\)"):
        parse_generate_response(_answer(rows), "r", routed_experts=SHAPE, routed_experts_start=0)
    with pytest.raises(ProtocolError, match=r"expert ids in \[0, 9\]; expected ids in \[0, 8\)"):
        parse_generate_response(_answer(rows + (rows == 7) * 2), "r", routed_experts=SHAPE, routed_experts_start=1)
    assert parse_generate_response(_answer(None), "r", routed_experts=SHAPE).routed_experts is None
    wide = RoutingShape(layers=2, top_k=2, experts=300)
    assert parse_generate_response(_answer(rows + 250), "r", routed_experts=wide,
                                   routed_experts_start=1).routed_experts.dtype == np.uint16


async def test_routing_requests_go_around_the_router_to_the_sessions_engine(cluster: FakeCluster) -> None:
    for w in cluster.workers:
        w.state.routing = SHAPE
    try:
        # sglang-router 0.3.2 drops the fields: through it, no routing comes back
        async with InferenceClient(ClientConfig(base_url=cluster.router.url)) as plain:
            lost = await plain.generate([10, 11, 12], SamplingParams(max_new_tokens=2), routed_experts=SHAPE)
        assert lost.routed_experts is None
        seen = [r for w in cluster.workers for r in w.state.requests]
        assert "return_routed_experts" not in seen[-1] and "routed_experts_start_len" not in seen[-1]
        # a client bound to the router sends them to an engine of the group, the same one per routing key
        config = ClientConfig(base_url=cluster.router.url, via_router=True)
        async with InferenceClient(config, control_urls=cluster.urls) as client:
            answers = [await client.generate([10, 11, 12, 13], SamplingParams(max_new_tokens=2), routing_key="s1",
                                             routed_experts=SHAPE, routed_experts_start=s) for s in (0, 2)]
            plain_answer = await client.generate([10, 11], SamplingParams(max_new_tokens=2), routing_key="s1")
        assert answers[0].meta["worker"] == answers[1].meta["worker"]
        full = [10, 11, 12, 13, *answers[0].output_ids]
        assert np.array_equal(answers[0].routed_experts, scripted_routing(full[:-1], SHAPE))
        assert np.array_equal(answers[1].routed_experts, scripted_routing(full[2:-1], SHAPE))
        assert plain_answer.routed_experts is None
        with pytest.raises(ValueError, match=r"routed_experts_start=5\): expected a position in \[0, 2\]"):
            async with InferenceClient(config, control_urls=cluster.urls) as client:
                await client.generate([10, 11], SamplingParams(max_new_tokens=2), routed_experts=SHAPE,
                                      routed_experts_start=5)
    finally:
        for w in cluster.workers:
            w.state.routing = None
