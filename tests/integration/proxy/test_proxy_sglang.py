"""The agent proxy against the real CPU SGLang engine (the session's shared engine, the tiny Qwen3):

- 64 concurrent sessions, each a harness on the real ``openai`` client (half streaming);
- a conversation the agent loop can drive gives the same token sequences through the proxy as
  through ``run_episode``, and every prompt the engine was sent is the full render (no drift);
- ``tool_choice="required"`` served with a grammar the engine's xgrammar compiles;
- ``agentrl train`` of ``examples.byo_agent:openai_agent`` for 2 steps (``--no-ray``), by name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import pytest

from agentrl.chat import ChatTemplate, Message
from agentrl.chat.types import ToolCallFailure
from agentrl.environments import Environment, StepResult
from agentrl.episode import load_episodes
from agentrl.proxy import ProxyConfig, ProxyServer, ProxySession
from agentrl.rollout import AgentConfig, ClientConfig, InferenceClient, SamplingParams, run_episode
from agentrl.testing import build_tiny_model, build_tokenizer
from agentrl.trajectory import SegmentKind, StopReason, Trajectory

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
WORDS = "[a-z]{2,5}( [a-z]{2,5})?"  # every turn ends (with <|im_end|>) once the grammar is done
FOLLOW_UPS = ["go on", "and then"]


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", build_tokenizer())


async def conversation(client: openai.AsyncOpenAI, opening: list[dict[str, Any]], *, stream: bool) -> list[Any]:
    """A harness: the opening, then each reply sent back as returned plus a user follow-up."""
    messages = list(opening)
    usages = []
    for turn in range(len(FOLLOW_UPS) + 1):
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model="agentrl", messages=messages, max_tokens=24, stream=True, stream_options={"include_usage": True})]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usages.append(chunks[-1].usage)
        else:
            reply = await client.chat.completions.create(model="agentrl", messages=messages, max_tokens=24)
            content = reply.choices[0].message.content or ""
            usages.append(reply.usage)
        if turn < len(FOLLOW_UPS):
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": FOLLOW_UPS[turn]}]
    return usages


async def test_64_concurrent_sessions_on_the_real_engine(tiny_engine: str, template: ChatTemplate) -> None:
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=24, regex=WORDS), context_length=1024,
                         reward_pool=False)
    async with InferenceClient(ClientConfig(base_url=tiny_engine)) as engine, ProxyServer(ProxyConfig(api_key="k")) as server:
        sessions = [server.open(ProxySession(template, engine, config)) for _ in range(64)]

        async def one(i: int, session: ProxySession) -> list[Any]:
            async with openai.AsyncOpenAI(base_url=server.base_url(session), api_key="k") as client:
                return await conversation(client, [{"role": "user", "content": f"secret {i}: say words"}],
                                          stream=i % 2 == 1)

        usages = await asyncio.gather(*(one(i, s) for i, s in enumerate(sessions)))
        episodes = [server.close(s, StopReason.ENV_DONE) for s in sessions]
    for i, (episode, used) in enumerate(zip(episodes, usages, strict=True)):
        episode.validate()
        model = [s for t in episode.sequences for s in t.segments if s.kind is SegmentKind.MODEL]
        assert len(model) == 3 and {s.weight_version for s in model} == {"0"}
        assert [u.completion_tokens for u in used] == [s.length for s in model]
        text = template.decode(episode.sequences[0].tokens)
        assert f"secret {i}:" in text and sum(f"secret {j}:" in text for j in range(64)) == 1
    assert sum(audit_drift(template, e.sequences) for e in episodes) == 0
    forks = sum(len(e.sequences) - 1 for e in episodes)
    print(f"64 sessions, 3 turns each: {forks} forks (template), "
          f"{sum(e.num_trainable_tokens for e in episodes)} trainable tokens")


class FollowUps(Environment):
    """A user follow-up after each model turn, then done: a conversation the agent loop drives."""

    async def reset(self) -> list[Message]:
        return [Message("user", "say words")]

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        self._begin_step()
        if self.turns > len(FOLLOW_UPS):
            return self._finish(StepResult(), StopReason.ENV_DONE)
        return StepResult(messages=[Message("user", FOLLOW_UPS[self.turns - 1])])

    def reward(self, trajectory: Trajectory) -> float:
        return 0.0


class Recording:
    """The engine client, recording each prompt it sends."""

    def __init__(self, client: InferenceClient) -> None:
        self.client, self.prompts = client, []

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, **kw: Any) -> Any:
        self.prompts.append(list(input_ids))
        return await self.client.generate(input_ids, sampling, **kw)


@pytest.mark.parametrize("audit", [False, True])
async def test_the_proxy_gives_run_episodes_tokens_on_the_real_engine(tiny_engine: str, template: ChatTemplate,
                                                                     audit: bool) -> None:
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=24, temperature=0.0, regex=WORDS),
                         context_length=1024, reward_pool=False, audit=audit)
    async with InferenceClient(ClientConfig(base_url=tiny_engine)) as engine:
        looped = await run_episode(FollowUps({}), template, engine, config)
        recording = Recording(engine)
        async with ProxyServer() as server:
            session = server.open(ProxySession(template, recording, config))
            async with openai.AsyncOpenAI(base_url=server.base_url(session), api_key="x") as client:
                await conversation(client, [{"role": "user", "content": "say words"}], stream=audit)
            proxied = server.close(session, StopReason.ENV_DONE)
    assert len(looped.sequences) == len(proxied.sequences)
    for a, b in zip(looped.sequences, proxied.sequences, strict=True):
        assert a.tokens == b.tokens and a.loss_mask == b.loss_mask
        # the engine's own logprobs of the same tokens (float32 rounding differs with what its cache held)
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        assert [dataclasses.replace(s, message_index=None) for s in a.segments] == \
            [dataclasses.replace(s, message_index=None) for s in b.segments]
    assert session.metrics["bridge/sampled_text_differs"] == 0
    assert audit_drift(template, proxied.sequences) == 0
    # each prompt the engine got is the start of a sequence: tokens were only ever appended
    assert all(any(t.tokens[:len(p)] == p for t in proxied.sequences) for p in recording.prompts)


def audit_drift(template: ChatTemplate, sequences: Sequence[Trajectory]) -> int:
    """How many model turns were sampled from a prompt that is not the full render of the conversation
    before them (text true to the bytes: what the bridge session proves at every step, here checked
    independently of it)."""
    drift = 0
    for traj in sequences:
        for seg in traj.segments_of(SegmentKind.MODEL):
            if seg.start == traj.prompt_length or traj.segments[traj.segments.index(seg) - 1].kind is SegmentKind.MODEL:
                continue  # the sequence's own prompt (a render by construction), or a turn continued after an abort
            assert seg.message_index is not None
            rendered = template.render(traj.messages[:seg.message_index], add_generation_prompt=True)
            drift += template.decode(traj.tokens[:seg.start]) != rendered
    return drift


async def test_a_forced_call_is_served_with_a_grammar_the_engine_compiles(tiny_engine: str,
                                                                           template: ChatTemplate) -> None:
    tool = {"type": "function", "function": {"name": "multiply", "parameters": {
        "type": "object", "required": ["a", "b"],  # small values: the random model would write digits forever
        "properties": {"a": {"type": "integer", "enum": [3, 4]}, "b": {"type": "integer", "enum": [3, 4]}}}}}
    # The grammar admits one 76-character call; the random model may spell it a character a token, so
    # the budget covers the longest spelling (the canonical tokenization is 25 tokens).
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=128), context_length=1024, reward_pool=False)
    async with InferenceClient(ClientConfig(base_url=tiny_engine)) as engine, \
            ProxyServer(ProxyConfig(constrained_decoding=True)) as server:
        session = server.open(ProxySession(template, engine, config, server.config))
        async with openai.AsyncOpenAI(base_url=server.base_url(session), api_key="x") as client:
            reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "3*4"}],
                                                         tools=[tool], tool_choice="required")
        server.close(session, StopReason.ENV_DONE)
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and calls is not None and len(calls) == 1
    assert calls[0].function.name == "multiply"  # type: ignore[union-attr]
    assert set(json.loads(calls[0].function.arguments)) == {"a", "b"}  # type: ignore[union-attr]


def test_agentrl_train_takes_an_agent_by_name_for_two_steps(tmp_path: Path, shared_engine: str) -> None:
    run = tmp_path / "run"
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("agentrl")), "train", "examples/byo_agent_tiny.toml",
         "environment.name=examples.byo_agent:openai_agent", f"model.path={build_tiny_model()}",
         f"rollout.engines.urls={shared_engine}", "rollout.engines.context_length=1024",
         "rollout.engines.max_total_tokens=8192", "train.max_tokens_per_micro_batch=2048",
         f"logging.run_dir={run}", "--no-ray", "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"done: 2 steps; run folder {run}" in proc.stdout
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    episodes = load_episodes(run)  # both steps' saved episodes, in step order
    assert len(episodes) == 8 and all(ep.trajectory.metrics["proxy/requests"] >= 1 for ep in episodes)
    versions = [{s.weight_version for t in ep.sequences for s in t.segments if s.kind is SegmentKind.MODEL}
                for ep in episodes]
    assert versions == [{"0"}] * 4 + [{"1"}] * 4  # step 2 sampled from the weights step 1 trained
    print(f"2 steps: rewards {[m.get('rollout/reward_mean') for m in metrics]}, "
          f"forks {sum(len(ep.sequences) - 1 for ep in episodes)}, "
          f"requests {sum(ep.trajectory.metrics['proxy/requests'] for ep in episodes):.0f}")
