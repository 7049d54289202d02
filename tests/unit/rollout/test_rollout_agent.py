"""run_episode and token ids: padding ids (beyond the tokenizer, within the model) are kept; ids beyond the
model's vocabulary fail the episode, in every sequence."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from agentrl.chat import ChatTemplate, Message, ToolCallFailure
from agentrl.environments import Environment, StepResult
from agentrl.rollout import ClientConfig, InferenceClient
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.process import free_port
from agentrl.rollout.types import AbortCause, FinishKind, FinishReason, GenerateResult, SamplingParams
from agentrl.testing.scripted import ScriptedClient
from agentrl.trajectory import ErrorKind, Status, StopReason, Trajectory


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


class ExtraIdClient(ScriptedClient):
    """Scripted answers; turn ``bad_turn`` (0-based) gets ``extra`` inserted before its last id."""

    def __init__(self, tokenizer: Any, script: list[str], bad_turn: int, extra: int) -> None:
        super().__init__(tokenizer, script)
        self.bad_turn, self.extra = bad_turn, extra

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, **kw: Any) -> GenerateResult:
        result = await super().generate(input_ids, sampling, **kw)
        if len(self.requests) - 1 != self.bad_turn:
            return result
        ids, lps = result.output_ids, result.output_logprobs
        return dataclasses.replace(result, output_ids=(*ids[:-1], self.extra, ids[-1]),
                                   output_logprobs=(*lps[:-1], -1.0, lps[-1]))


ANSWER = "<think>\nDone.\n</think>\n\n\\boxed{1024}<|im_end|>"


async def _run(template: ChatTemplate, client: ScriptedClient, vocab_size: int | None = None) -> Any:
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=256), vocab_size=vocab_size)
    return await run_episode(FollowUpEnv({}), template, client, config, group_id="g")


async def test_every_sequence_knows_the_model_vocabulary(tok: Any, qwen3: ChatTemplate) -> None:
    ep = await _run(qwen3, ScriptedClient(tok, [ANSWER, ANSWER]), vocab_size=len(tok) + 2)
    assert len(ep.sequences) == 2 and ep.status is Status.COMPLETED
    assert [s.vocab_size for s in ep.sequences] == [len(tok) + 2] * 2
    unknown = await _run(qwen3, ScriptedClient(tok, [ANSWER, ANSWER]))
    assert [s.vocab_size for s in unknown.sequences] == [None, None]


@pytest.mark.parametrize("bad_turn", [0, 1], ids=["first-sequence", "forked-sequence"])
async def test_a_padding_id_is_kept_verbatim_and_has_no_text(tok: Any, qwen3: ChatTemplate, bad_turn: int) -> None:
    # The model's embedding is wider than the tokenizer (1,792 rows for 1,790 tokens in the tiny model):
    # the engine can sample the extra ids. They are actions of the policy: kept, trained on, no text.
    padding = len(tok) + 1
    ep = await _run(qwen3, ExtraIdClient(tok, [ANSWER, ANSWER], bad_turn, padding), vocab_size=len(tok) + 2)
    assert (ep.status, ep.stop_reason) == (Status.COMPLETED, StopReason.ENV_DONE)
    seq = ep.sequences[bad_turn]
    assert padding in seq.response_tokens
    at = seq.tokens.index(padding) - seq.prompt_length
    assert seq.loss_mask[at] == 1 and seq.logprobs[at] == -1.0
    assert ep.trajectory.metrics["padding_tokens"] == 1.0
    assert ep.trajectory.metrics.get("bridge/sampled_text_differs", 0) == 0
    assert seq.messages[-1].content == "\\boxed{1024}"  # the parser never saw it
    assert qwen3.decode([padding]) == ""


@pytest.mark.parametrize("bad_turn", [0, 1], ids=["first-sequence", "forked-sequence"])
async def test_an_id_beyond_the_model_vocabulary_fails_without_appending(tok: Any, qwen3: ChatTemplate,
                                                                        bad_turn: int) -> None:
    rows = len(tok) + 2
    ep = await _run(qwen3, ExtraIdClient(tok, [ANSWER, ANSWER], bad_turn, rows), vocab_size=rows)
    assert (ep.status, ep.stop_reason) == (Status.FAILED, StopReason.FAILED)
    assert len(ep.sequences) == bad_turn + 1 and ep.trajectory.response_length == 0
    [error] = ep.trajectory.errors
    assert (error.kind, error.component, error.turn) == (ErrorKind.ENGINE_OUTPUT, "generate", 0)  # turns of its sequence
    assert "breaks a trajectory invariant" in error.message and str(rows) in error.message


async def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(tok: Any, qwen3: ChatTemplate) -> None:
    with pytest.raises(ValueError, match=rf"vocab_size={len(tok) - 1} is smaller than the tokenizer \({len(tok)}"):
        await _run(qwen3, ScriptedClient(tok, [ANSWER]), vocab_size=len(tok) - 1)
    with pytest.raises(ValueError, match=r"AgentConfig\.vocab_size: got 0"):
        AgentConfig(vocab_size=0)


async def test_a_template_without_tokenizer_is_refused() -> None:
    bare = ChatTemplate.from_name("qwen3")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        await _run(bare, ScriptedClient(None, []))


async def test_an_unreachable_engine_fails_the_episode_with_the_clients_reason(tok: Any, qwen3: ChatTemplate) -> None:
    # aborted episodes are left out of training batches: an engine that is down must not look like one
    dead = ClientConfig(base_url=f"http://127.0.0.1:{free_port()}", max_retries=1, backoff_initial_s=0.01)
    async with InferenceClient(dead) as client:
        ep = await run_episode(FollowUpEnv({}), qwen3, client, AgentConfig(sampling=SamplingParams(max_new_tokens=8)))
    assert (ep.status, ep.stop_reason) == (Status.FAILED, StopReason.FAILED)
    [error] = ep.trajectory.errors
    assert error.kind is ErrorKind.ENGINE and error.message.startswith("engine unavailable after 2 attempts: ")
    assert ep.reward == 1.0  # a failed episode is still scored; the batcher decides what to train on


@pytest.mark.parametrize("cause", [AbortCause.ENGINE, AbortCause.CLIENT])
async def test_a_deliberate_abort_stays_aborted_with_its_reason(tok: Any, qwen3: ChatTemplate,
                                                                 cause: AbortCause) -> None:
    class Aborting(ScriptedClient):
        async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, **kw: Any) -> GenerateResult:
            result = await super().generate(input_ids, sampling, **kw)
            finish = FinishReason(FinishKind.ABORT, message="paused for a weight update", cause=cause)
            return dataclasses.replace(result, finish_reason=finish)

    ep = await _run(qwen3, Aborting(tok, [ANSWER]))
    assert (ep.status, ep.stop_reason) == (Status.ABORTED, StopReason.ABORTED)
    assert ep.trajectory.info["abort_reason"] == "paused for a weight update"
    assert ep.trajectory.errors == []
