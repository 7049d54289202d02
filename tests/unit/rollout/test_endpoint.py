"""Message-level episodes against an OpenAI-compatible server (the fake one on 127.0.0.1): the
conversation on the wire, termination, failures, the eval report, and that such episodes can never
enter a training batch."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agentrl.chat.types import Message, ToolCallFailure
from agentrl.environments import StepResult, ToyArithmeticEnv, make_arithmetic_rows
from agentrl.rollout.endpoint import ChatEndpoint, chat_url, evaluate_endpoint, run_message_episode
from agentrl.rollout.eval import EvalConfig
from agentrl.rollout.types import SamplingParams
from agentrl.testing.chat_server import FakeChatServer, arithmetic_chat_answer
from agentrl.train import build_training_batch
from agentrl.trajectory import ErrorKind, Status, StopReason, TrajectoryError

ROWS = make_arithmetic_rows(3, seed=5)
SAMPLING = SamplingParams(max_new_tokens=64, temperature=0.0)


@pytest.fixture
def server() -> Iterator[FakeChatServer]:
    with FakeChatServer() as s:
        yield s


def test_chat_url_forms() -> None:
    assert chat_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"


async def test_episode_calls_the_tool_and_is_scored(server: FakeChatServer) -> None:
    async with ChatEndpoint(server.url) as endpoint:
        episode = await run_message_episode(ToyArithmeticEnv(ROWS[0]), endpoint, SAMPLING, sample_id="s:0:0")
    traj = episode.trajectory
    assert traj.message_level and traj.tokens == [] and traj.loss_mask == []
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[3].content == ROWS[0]["answer"]  # the calculator really ran
    assert traj.reward == 1.0 and traj.status is Status.COMPLETED and traj.stop_reason is StopReason.NO_TOOL_CALLS
    assert traj.metrics["tool_calls"] == 1.0 and traj.metrics["turns"] == 2.0
    assert traj.metrics["usage/completion_tokens"] == 10.0  # the server's own count, 5 per answer
    first, second = server.requests
    assert first["model"] == "fake-model" and first["max_tokens"] == 64 and first["temperature"] == 0.0
    assert [t["function"]["name"] for t in first["tools"]] == ["calculator"]
    call = second["messages"][2]["tool_calls"][0]
    assert isinstance(call["function"]["arguments"], str)  # JSON text on the wire, as OpenAI defines it
    assert json.loads(call["function"]["arguments"]) == {"expression": ROWS[0]["question"][8:-1]}
    tool = second["messages"][3]
    assert (tool["role"], tool["content"], tool["tool_call_id"]) == ("tool", ROWS[0]["answer"], "call_0")


def _answers(*replies: dict[str, Any]) -> Any:
    it = iter(replies)
    return lambda messages, tools: next(it)


@pytest.mark.parametrize(("reply", "status", "reason", "error_kind"), [
    ({"role": "assistant", "content": "The answer is", "finish_reason": "length"},
     Status.TRUNCATED, StopReason.ENGINE_LENGTH, None),
    ({"role": "assistant", "content": "This model's maximum context length is 512 tokens", "finish_reason": "error"},
     Status.TRUNCATED, StopReason.CONTEXT_BUDGET, ErrorKind.PROMPT_TOO_LONG),
])
async def test_episode_termination(reply: dict[str, Any], status: Status, reason: StopReason,
                                   error_kind: ErrorKind | None) -> None:
    with FakeChatServer(_answers(reply)) as server:
        async with ChatEndpoint(server.url, model="m") as endpoint:
            episode = await run_message_episode(ToyArithmeticEnv(ROWS[0]), endpoint, SAMPLING)
    assert (episode.status, episode.stop_reason) == (status, reason)
    assert [e.kind for e in episode.trajectory.errors] == ([error_kind] if error_kind else [])
    if error_kind:
        assert "maximum context length" in episode.trajectory.errors[0].message


async def test_unreachable_server_fails_the_episode_as_a_value() -> None:
    async with ChatEndpoint("http://127.0.0.1:9/v1", model="m", timeout_s=5) as endpoint:
        episode = await run_message_episode(ToyArithmeticEnv(ROWS[0]), endpoint, SAMPLING)
    [error] = episode.trajectory.errors
    assert episode.status is Status.FAILED and error.kind is ErrorKind.ENGINE and "ConnectError" in error.message
    assert error.component == "endpoint"


MALFORMED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{not json"}}]}


async def test_malformed_arguments_count_as_a_failure() -> None:
    with FakeChatServer(_answers(MALFORMED, {"role": "assistant", "content": "no idea"})) as server:
        async with ChatEndpoint(server.url) as endpoint:
            episode = await run_message_episode(ToyArithmeticEnv(ROWS[0]), endpoint, SAMPLING)
    assert episode.trajectory.metrics["failures/malformed_json"] == 1.0
    assert episode.reward is not None and episode.reward <= 0.0


class TolerantArithmetic(ToyArithmeticEnv):
    """Lets arguments that are not a JSON object pass as a tolerated failure: recorded, never fed back."""

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        return await super().step(reply, [dataclasses.replace(f, tolerated=True) for f in failures])


async def test_tolerated_failures_are_counted_as_the_token_loop_counts_them() -> None:
    with FakeChatServer(_answers(MALFORMED)) as server:
        async with ChatEndpoint(server.url) as endpoint:
            episode = await run_message_episode(TolerantArithmetic(ROWS[0]), endpoint, SAMPLING)
    metrics = episode.trajectory.metrics
    assert metrics["tolerated/malformed_json"] == 1.0 and "failures/malformed_json" not in metrics
    assert episode.stop_reason is StopReason.NO_TOOL_CALLS  # nothing fed back: the reply ends as one without calls


async def test_evaluate_endpoint_report(server: FakeChatServer) -> None:
    async with ChatEndpoint(server.url) as endpoint:
        report = await evaluate_endpoint(ToyArithmeticEnv, endpoint, ROWS, EvalConfig(name="arith"))
    assert (report.prompts, report.samples) == (3, 3)
    assert report.mean_reward == 1.0 and report.pass_at_k == {1: 1.0} and report.tool_call_rate == 1.0
    assert report.truncation_rate == 0.0 and report.stop_reasons == {"no_tool_calls": 3}
    assert all(ep.trajectory.message_level for ep in report.episodes)
    assert len(server.requests) == 6


async def test_message_level_episodes_never_enter_a_training_batch(server: FakeChatServer) -> None:
    async with ChatEndpoint(server.url) as endpoint:
        episode = await run_message_episode(ToyArithmeticEnv(ROWS[0]), endpoint, SAMPLING)
    with pytest.raises(ValueError, match=r"trajectories\[0\]: rollout .* is message-level .* can never enter a "
                                         r"training batch"):
        build_training_batch([episode])
    episode.trajectory.status = Status.FAILED  # excluded statuses are skipped silently; these never are
    with pytest.raises(ValueError, match="message-level"):
        build_training_batch([episode.trajectory])
    with pytest.raises(TrajectoryError, match="message-level"):
        episode.trajectory.validate()


def test_arithmetic_chat_answer_plays_the_policy() -> None:
    msgs = [{"role": "user", "content": "What is 12 * 3?"}]
    first = arithmetic_chat_answer(msgs, [])
    assert json.loads(first["tool_calls"][0]["function"]["arguments"]) == {"expression": "12 * 3"}
    done = arithmetic_chat_answer([*msgs, {"role": "tool", "content": "36"}], [])
    assert "\\boxed{36}" in done["content"]
