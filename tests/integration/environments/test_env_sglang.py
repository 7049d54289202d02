"""The agent loop against a real CPU SGLang server serving the tiny Qwen3 model (no scripted policy):
the session's shared engine, given back the model's own random weights.

The tiny model has random weights, so it never writes a tool call or an end-of-turn token by
itself; stop *strings* end its turns instead, which also exercises the synthetic turn close the
bridge adds when a turn does not end on ``<|im_end|>``. The checks are about tokens, not skill:
every sampled id and logprob lands in the trajectory verbatim — SGLang re-scoring the trajectory's
tokens reproduces the logprobs the loop stored for the model spans, so the engine conditioned on
exactly the buffer the trajectory holds — and the context budget caps every real request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from agentrl.chat import ChatTemplate, Message
from agentrl.environments import Environment, EnvLimits, StepResult
from agentrl.rollout import ClientConfig, InferenceClient, SamplingParams
from agentrl.rollout.agent import AgentConfig, Episode, run_episode
from agentrl.testing import build_tokenizer
from agentrl.trajectory import SegmentKind, Status, StopReason, Trajectory

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(600)]


class TalkEnv(Environment):
    """Answers every model turn with a new user message until the turn limit."""

    default_limits = EnvLimits(max_turns=3)

    async def reset(self) -> list[Message]:
        return [Message(role="user", content="Say something.")]

    async def step(self, reply: Message, failures: Any = ()) -> StepResult:
        self._begin_step()
        if self.turns >= self.limits.max_turns:
            return self._finish(StepResult(), StopReason.MAX_TURNS)
        return StepResult(messages=[Message(role="user", content="Go on.")])

    def reward(self, trajectory: Trajectory) -> float:
        return float(trajectory.num_model_turns)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_engine: str) -> AsyncIterator[InferenceClient]:
    async with InferenceClient(ClientConfig(base_url=tiny_engine)) as c:
        yield c


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.from_name("qwen3_coder", tokenizer=build_tokenizer())


async def assert_engine_agrees(client: InferenceClient, ep: Episode) -> None:
    """Re-scoring the whole buffer gives back the stored logprobs of every sampled token."""
    traj = ep.trajectory
    traj.validate()
    scored = await client.generate(traj.tokens, SamplingParams(max_new_tokens=0), logprob_start_len=0)
    assert scored.first_misscored(traj.tokens) is None  # the ids it scored are the buffer's
    model = [i for s in traj.segments if s.kind is SegmentKind.MODEL for i in range(s.start, s.end)]
    assert model
    stored = [traj.logprobs[i - traj.prompt_length] for i in model]
    assert [scored.input_logprobs[i] for i in model] == pytest.approx(stored, abs=0.05)


async def test_multi_turn_episode_keeps_engine_tokens_verbatim(client: InferenceClient,
                                                              template: ChatTemplate) -> None:
    cfg = AgentConfig(sampling=SamplingParams(max_new_tokens=24, temperature=1.0, stop=("a", "e", "i", "o")))
    ep = await run_episode(TalkEnv({}), template, client, cfg)
    traj = ep.trajectory
    assert traj.status in (Status.COMPLETED, Status.TRUNCATED)
    model = traj.segments_of(SegmentKind.MODEL)
    assert all(s.weight_version is not None for s in model)
    if traj.stop_reason is StopReason.MAX_TURNS:
        assert len(model) == 3 and traj.reward == 3.0
    # every turn that stopped on a string (not <|im_end|>) got a synthetic close before the user turn
    kinds = [s.kind for s in traj.segments]
    for i, seg in enumerate(traj.segments[:-1]):
        if seg.kind is SegmentKind.MODEL and traj.tokens[seg.end - 1] != template.turn_close_id:
            assert kinds[i + 1:i + 3] == [SegmentKind.SCAFFOLD, SegmentKind.USER]
    await assert_engine_agrees(client, ep)


async def test_context_budget_caps_real_requests(client: InferenceClient, template: ChatTemplate) -> None:
    env = TalkEnv({})
    prompt_len = len(template.encode(await TalkEnv({}).reset(), add_generation_prompt=True))
    cfg = AgentConfig(sampling=SamplingParams(max_new_tokens=64, temperature=1.0), context_length=prompt_len + 10)
    ep = await run_episode(env, template, client, cfg)
    traj = ep.trajectory
    assert (traj.status, traj.stop_reason) == (Status.TRUNCATED, StopReason.CONTEXT_BUDGET)
    assert len(traj.tokens) <= prompt_len + 10 and not traj.errors
    await assert_engine_agrees(client, ep)
