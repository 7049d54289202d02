"""Long episodes behind the agent proxy, with the ``openai`` client: a harness that compacts its history
when it gets ``context_length_exceeded`` goes on and trains (the refusal is final only when no later
request succeeds), and a session given a context policy compacts for a harness that does not."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from agentrl.chat import ChatTemplate
from agentrl.environments.long_recall import (
    SYSTEM_PROMPT,
    make_recall_rows,
    page_text,
    recall_policy,
    score_codes,
)
from agentrl.proxy import Agent, AgentRunner
from agentrl.rollout import AgentConfig, SamplingParams
from agentrl.rollout.context import Summarize, Window
from agentrl.testing.policy import FakePolicyClient
from agentrl.train import build_training_batch
from agentrl.trajectory import ForkReason, Status, StopReason

CONFIG = AgentConfig(sampling=SamplingParams(max_new_tokens=160), context_length=1024, reward_pool=False)
ROW = make_recall_rows(1, pages=14, seed=5)[0]
FILLER = 30
READ = {"type": "function", "function": {
    "name": "read", "description": "Read one page of the document.",
    "parameters": {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]}}}


async def _harness(task: dict[str, Any], client: openai.AsyncOpenAI, *, compact: bool) -> str | None:
    """Reads the pages with its own ``read`` tool; on context_length_exceeded keeps the opening and the
    last turn (``compact``) or gives up."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"The document has {len(task['codes'])} pages. Start with page 1."}]
    for _ in range(80):
        try:
            reply = await client.chat.completions.create(model="agentrl", messages=messages, tools=[READ])
        except openai.BadRequestError as exc:
            if exc.code != "context_length_exceeded" or not compact:
                return None
            messages = [*messages[:2], *messages[-2:]]
            continue
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            page = int(json.loads(call.function.arguments)["page"])
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": page_text(task["codes"], task["seed"], page, FILLER)})
    return None


async def compacting(task: dict[str, Any], client: openai.AsyncOpenAI) -> str | None:
    return await _harness(task, client, compact=True)


async def stubborn(task: dict[str, Any], client: openai.AsyncOpenAI) -> str | None:
    return await _harness(task, client, compact=False)


def reward(task: dict[str, Any], answer: Any) -> float:
    return score_codes(str(answer or ""), task["codes"])


async def _run(agent: Agent, template: ChatTemplate) -> Any:
    client = FakePolicyClient(template.tokenizer, recall_policy(Summarize().instruction))
    runner = AgentRunner(agent(ROW), template, client, CONFIG, group_id="g", sample_id="p:0")
    try:
        episode = await runner.advance()
    finally:
        await runner.close()
    assert episode is not None
    episode.validate()
    return episode


async def test_a_harness_that_compacts_on_context_length_exceeded_goes_on_and_trains(template: ChatTemplate) -> None:
    episode = await _run(Agent(compacting, reward), template)
    assert (episode.status, episode.stop_reason) == (Status.COMPLETED, StopReason.ENV_DONE)
    assert episode.trajectory.info["answer"].startswith("codes: p1=")
    metrics = episode.trajectory.metrics
    assert metrics["proxy/context_refusals"] >= 1 and metrics["proxy/context_recoveries"] >= 1
    compacted = [s for s in episode.sequences if s.fork_reason is ForkReason.COMPACTION]
    assert len(compacted) == metrics["proxy/context_refusals"]  # each shorter history after a refusal forks
    assert all(s.info["forked_because"].startswith("compaction:") for s in compacted)
    assert {s.rollout_id for s in episode.sequences} == {episode.sequences[0].rollout_id}
    assert all(s.num_trainable_tokens > 0 for s in episode.sequences)  # every sequence trains
    batch = build_training_batch([episode])
    assert len(batch.sequences) == len(episode.sequences)
    assert {seq.denominator for seq in batch.sequences} == {float(episode.num_trainable_tokens)}


async def test_the_refusal_is_final_when_no_later_request_succeeds(template: ChatTemplate) -> None:
    episode = await _run(Agent(stubborn, reward), template)
    assert (episode.status, episode.stop_reason) == (Status.TRUNCATED, StopReason.CONTEXT_BUDGET)
    assert len(episode.sequences) == 1 and episode.trajectory.metrics["proxy/context_refusals"] == 1


async def test_a_session_with_a_policy_compacts_for_a_harness_that_does_not(template: ChatTemplate) -> None:
    agent = Agent(stubborn, reward, context_policy=Window(trigger=800))
    episode = await _run(agent, template)
    assert (episode.status, episode.stop_reason) == (Status.COMPLETED, StopReason.ENV_DONE)
    metrics = episode.trajectory.metrics
    assert metrics.get("proxy/context_refusals", 0) == 0 and metrics["context/compactions"] >= 2
    later = episode.sequences[1:]
    assert all(s.fork_reason is ForkReason.COMPACTION and s.info["compaction"]["policy"] == "window" for s in later)
    assert all(s.info["compaction"]["tokens_after"] <= 400 < 800 < s.info["compaction"]["tokens_before"]
               for s in later)
    # the harness resends its whole history each time: the compacted sequence goes on under it (hysteresis),
    # so sequences start every few turns, not on every request
    requests = metrics["proxy/requests"]
    assert len(episode.sequences) <= requests / 3
    assert metrics.get("proxy/fork/harness", 0) == 0
    assert episode.reward == 0.0  # the window lost the early pages' codes


def test_a_summary_the_model_would_write_is_refused_for_a_proxy_session(template: ChatTemplate) -> None:
    agent = Agent(stubborn, reward, context_policy=Summarize(trigger=800))
    with pytest.raises(ValueError, match="Summarize without a summarizer asks the model for a summary in a turn the "
                                         "harness never asked for"):
        AgentRunner(agent(ROW), template, FakePolicyClient(template.tokenizer, recall_policy("x")), CONFIG)
