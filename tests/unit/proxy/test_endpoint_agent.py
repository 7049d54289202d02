"""An agent harness evaluated against an OpenAI-compatible endpoint (``agentrl eval --endpoint``), on
the fake chat server: its client talks to the endpoint itself, each request gets the endpoint's model
and the evaluation's sampling, and the episode is the last exchange, message-level, scored by the
agent's reward; a harness that raises fails its episode with where it raised."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.proxy import Agent
from agentrl.rollout.endpoint import ChatEndpoint, evaluate_endpoint, run_message_episode
from agentrl.rollout.eval import EvalConfig
from agentrl.rollout.types import SamplingParams
from agentrl.testing.chat_server import FakeChatServer
from agentrl.trajectory import ErrorKind, Status, StopReason

ROWS = make_arithmetic_rows(3, seed=5)
SAMPLING = SamplingParams(max_new_tokens=48, temperature=0.0)
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Evaluate a product.",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                             "required": ["expression"]}}}
HERE = "tests/unit/proxy/test_endpoint_agent.py"


def product(arguments: str) -> str:
    a, b = (int(x) for x in json.loads(arguments)["expression"].split("*"))
    return str(a * b)


async def async_run(task: dict[str, Any], client: openai.AsyncOpenAI) -> str | None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    for _ in range(3):
        reply = await client.chat.completions.create(model="agentrl", messages=messages, tools=[CALCULATOR],
                                                     temperature=0.9, max_tokens=500)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": product(c.function.arguments)}
                     for c in message.tool_calls]
    return None


def sync_run(task: dict[str, Any], client: openai.OpenAI) -> str | None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    first = client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR])  # type: ignore[arg-type]
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": product(call.function.arguments)}]  # type: ignore[union-attr]
    return client.chat.completions.create(model="m", messages=messages, tools=[CALCULATOR]).choices[0].message.content  # type: ignore[arg-type]


def reward(task: dict[str, Any], answer: Any) -> float:
    return float(f"\\boxed{{{task['answer']}}}" in str(answer))


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as s:
        yield s


@pytest.mark.parametrize("run", [async_run, sync_run])
async def test_the_harness_runs_against_the_endpoint_and_is_scored(server: FakeChatServer, run: Any) -> None:
    agent = Agent(run, reward)
    async with ChatEndpoint(server.url) as endpoint:
        episode = await run_message_episode(agent(ROWS[0]), endpoint, SAMPLING, group_id="g", sample_id="s:0:0")
    traj = episode.trajectory
    assert traj.message_level and traj.tokens == [] and traj.info["endpoint"] == endpoint.url
    assert [m.role for m in traj.messages] == ["user", "assistant", "tool", "assistant"]  # the last exchange
    assert traj.messages[1].tool_calls[0].name == "calculator" and traj.messages[2].content == ROWS[0]["answer"]
    assert traj.info["answer"] == f"The answer is \\boxed{{{ROWS[0]['answer']}}}."
    assert traj.reward == 1.0 and traj.status is Status.COMPLETED and traj.stop_reason is StopReason.ENV_DONE
    assert traj.metrics["turns"] == 2.0 and traj.metrics["usage/completion_tokens"] == 10.0
    assert (traj.group_id, traj.sample_id) == ("g", "s:0:0")
    # each request as the endpoint got it: its model, the evaluation's temperature, the per-turn cap
    for sent in server.requests:
        assert (sent["model"], sent["temperature"], sent["max_tokens"]) == ("fake-model", 0.0, 48)


def raises(task: dict[str, Any], client: openai.OpenAI) -> str:
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
    raise KeyError("answer")  # the line the error names


async def quiet(task: dict[str, Any], client: openai.AsyncOpenAI) -> str:
    return "no call"


@pytest.mark.parametrize(("run", "says", "origin"), [
    (raises, "run() raised KeyError: 'answer'", f"{HERE}:89 in raises"),
    (quiet, "run() returned without calling the model", None),
])
async def test_a_harness_that_fails_fails_its_episode(server: FakeChatServer, run: Any, says: str,
                                                      origin: str | None) -> None:
    async with ChatEndpoint(server.url) as endpoint:
        episode = await run_message_episode(Agent(run, reward)(ROWS[0]), endpoint, SAMPLING)
    [error] = episode.trajectory.errors
    assert episode.status is Status.FAILED and episode.reward is None
    assert (error.kind, error.component, error.origin) == (ErrorKind.AGENT, "run", origin)
    assert error.message.startswith(says)


async def test_evaluate_endpoint_takes_an_agent_like_an_environment(server: FakeChatServer) -> None:
    async with ChatEndpoint(server.url) as endpoint:
        report = await evaluate_endpoint(Agent(async_run, reward), endpoint, ROWS, EvalConfig(samples_per_prompt=2),
                                         max_new_tokens=48)
    assert (report.prompts, report.samples, report.mean_reward) == (3, 6, 1.0)
    assert all(ep.trajectory.message_level for ep in report.episodes)
