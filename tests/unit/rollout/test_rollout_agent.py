"""run_episode checks the engine's token ids against the tokenizer's vocabulary, in every sequence."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from agentrl.chat import ChatTemplate, Message, ToolCallFailure
from agentrl.environments import Environment, StepResult
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.types import GenerateResult, SamplingParams
from agentrl.testing import build_tokenizer
from agentrl.testing.scripted import ScriptedClient
from agentrl.trajectory import Status, StopReason, Trajectory


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tokenizer()


@pytest.fixture(scope="module")
def qwen3(tok: Any) -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=tok)


class FollowUpEnv(Environment):
    """Asks a second question after the first answer (a new user query forks a new sequence)."""

    async def reset(self) -> list[Message]:
        return [Message(role="user", content="2**10?")]

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        self._begin_step()
        if self.turns == 1:
            return StepResult(messages=[Message(role="user", content="And 2**11?")])
        return self._finish(StepResult(), StopReason.ENV_DONE)

    def reward(self, trajectory: Trajectory) -> float:
        return 1.0


class OutOfVocabularyClient(ScriptedClient):
    """Scripted answers; turn ``bad_turn`` (0-based) ends with an id one past the vocabulary."""

    def __init__(self, tokenizer: Any, script: list[str], bad_turn: int) -> None:
        super().__init__(tokenizer, script)
        self.bad_turn = bad_turn

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, **kw: Any) -> GenerateResult:
        result = await super().generate(input_ids, sampling, **kw)
        if len(self.requests) - 1 != self.bad_turn:
            return result
        bad = len(self.tokenizer)
        return dataclasses.replace(result, output_ids=(*result.output_ids, bad),
                                   output_logprobs=(*result.output_logprobs, -1.0))


ANSWER = "<think>\nDone.\n</think>\n\n\\boxed{1024}<|im_end|>"


async def _run(template: ChatTemplate, client: ScriptedClient) -> Any:
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=256))
    return await run_episode(FollowUpEnv({}), template, client, config, group_id="g")


async def test_every_sequence_knows_the_vocabulary(tok: Any, qwen3: ChatTemplate) -> None:
    ep = await _run(qwen3, ScriptedClient(tok, [ANSWER, ANSWER]))
    assert len(ep.sequences) == 2 and ep.status is Status.COMPLETED
    assert [s.vocab_size for s in ep.sequences] == [len(tok), len(tok)]


@pytest.mark.parametrize("bad_turn", [0, 1], ids=["first-sequence", "forked-sequence"])
async def test_an_out_of_vocabulary_id_fails_without_appending(tok: Any, qwen3: ChatTemplate, bad_turn: int) -> None:
    ep = await _run(qwen3, OutOfVocabularyClient(tok, [ANSWER, ANSWER], bad_turn))
    assert (ep.status, ep.stop_reason) == (Status.FAILED, StopReason.FAILED)
    assert len(ep.sequences) == bad_turn + 1 and ep.trajectory.response_length == 0
    error = ep.trajectory.info["engine_error"]
    assert "breaks a trajectory invariant" in error and str(len(tok)) in error


async def test_a_template_without_tokenizer_is_refused() -> None:
    bare = ChatTemplate.from_name("qwen3")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        await _run(bare, ScriptedClient(None, []))
