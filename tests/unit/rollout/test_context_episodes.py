"""Context policies in the agent loop: the long_recall task played by its scripted policy (a fake engine)
under each policy. Every compaction starts a sequence of the same rollout (fork reason ``compaction``);
a summary is a sampled, trained turn of the sequence it closes; budgets end an episode with their own
stop reason; a policy's bug ends it as a value."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from agentrl.chat import ChatTemplate, Message
from agentrl.environments import EnvLimits
from agentrl.environments.long_recall import LongRecallEnv, make_recall_rows, recall_policy
from agentrl.rollout.agent import AgentConfig, EpisodeRunner, run_episode
from agentrl.rollout.context import (
    AskSummary,
    ContextPolicy,
    ContextView,
    ElideToolOutput,
    Rewrite,
    Summarize,
    Window,
)
from agentrl.rollout.types import FinishKind, FinishReason, GenerateResult, SamplingParams
from agentrl.testing.policy import FakePolicyClient
from agentrl.trajectory import ErrorKind, ForkReason, SegmentKind, Status, StopReason

INSTRUCTION = Summarize().instruction
ROW = make_recall_rows(1, seed=3)[0]
CONFIG = AgentConfig(sampling=SamplingParams(max_new_tokens=200), context_length=2048, reward_pool=False)


@pytest.fixture(scope="module")
def qwen3(tok: Any) -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=tok)


async def _play(template: ChatTemplate, policy: ContextPolicy | None, *, lossy: float = 0.0,
                config: AgentConfig = CONFIG, limits: EnvLimits | None = None, client: Any = None) -> Any:
    client = client or FakePolicyClient(template.tokenizer, recall_policy(INSTRUCTION, lossy=lossy))
    env = LongRecallEnv(ROW, context_policy=policy, limits=limits)
    episode = await run_episode(env, template, client, config, group_id="g")
    episode.validate()  # every sequence's invariants, one rollout id, in order
    return episode


def _check_sequences(episode: Any) -> None:
    first = episode.sequences[0]
    for i, seq in enumerate(episode.sequences):
        assert (seq.rollout_id, seq.group_id, seq.sequence_index) == (first.rollout_id, "g", i)
        assert seq.reward == episode.reward and seq.status is episode.status
        assert seq.fork_reason is (None if i == 0 else ForkReason.COMPACTION)


async def test_without_a_policy_the_pages_overflow_the_context(qwen3: ChatTemplate) -> None:
    ep = await _play(qwen3, None)
    assert (ep.status, ep.stop_reason, ep.reward) == (Status.TRUNCATED, StopReason.CONTEXT_BUDGET, 0.0)
    assert len(ep.sequences) == 1 and len(ep.trajectory.tokens) <= 2048
    assert 15 <= ep.trajectory.num_model_turns <= 18  # still reading when the context ran out


async def test_window_goes_on_in_new_sequences_but_loses_the_early_codes(qwen3: ChatTemplate) -> None:
    ep = await _play(qwen3, Window(trigger=1000))
    assert (ep.status, ep.stop_reason, ep.reward) == (Status.COMPLETED, StopReason.NO_TOOL_CALLS, 0.0)
    _check_sequences(ep)
    assert len(ep.sequences) >= 3
    for prev, seq in zip(ep.sequences, ep.sequences[1:], strict=False):
        record = seq.info["compaction"]
        assert record["policy"] == "window" and record["from_sequence"] == prev.sequence_index
        assert record["tokens_before"] > 1000 >= 500 >= record["tokens_after"] == seq.prompt_length
        assert seq.messages[:2] == ep.sequences[0].messages[:2]  # the opening is kept
        assert seq.messages[2].role == "assistant"  # then whole turns
    assert ep.trajectory.metrics["context/compactions"] == len(ep.sequences) - 1
    answer = ep.trajectory.messages[-1].content
    assert "p20=" in answer and f"p20={ROW['codes'][19]}" in answer  # the last pages are in the window


async def test_hysteresis_keeps_training_tokens_within_twice_the_unique_tokens(qwen3: ChatTemplate) -> None:
    ep = await _play(qwen3, Window(trigger=1000))
    trained_over = sum(len(s.tokens) for s in ep.sequences)  # every sequence's tokens go through the trainer
    last = ep.sequences[-1]
    kept_of_last = last.prompt_length
    unique = sum(s.response_length for s in ep.sequences) + ep.sequences[0].prompt_length
    assert trained_over <= 2 * unique, (trained_over, unique, kept_of_last)
    turns = [s.num_model_turns for s in ep.sequences]
    assert min(turns[:-1]) >= 3  # each compaction frees room for several turns, not one


async def test_summarize_trains_the_summary_in_the_sequence_it_was_sampled_in(qwen3: ChatTemplate) -> None:
    ep = await _play(qwen3, Summarize(trigger=1100, instruction=INSTRUCTION))
    assert (ep.status, ep.stop_reason, ep.reward) == (Status.COMPLETED, StopReason.NO_TOOL_CALLS, 1.0)
    _check_sequences(ep)
    assert len(ep.sequences) == 3
    for seq, nxt in zip(ep.sequences, ep.sequences[1:], strict=False):
        summary, instruction = seq.messages[-1], seq.messages[-2]
        assert instruction == Message(role="user", content=INSTRUCTION) and summary.role == "assistant"
        index = len(seq.messages) - 1
        [segment] = [s for s in seq.segments if s.message_index == index]
        assert segment.kind is SegmentKind.MODEL and segment.trainable
        lo, hi = segment.start - seq.prompt_length, segment.end - seq.prompt_length
        assert seq.loss_mask[lo:hi] == [1] * (hi - lo) and set(seq.logprobs[lo:hi]) == {-0.5}  # the engine's
        assert qwen3.decode(seq.tokens[segment.start:segment.end]).startswith("p1=")
        user = [s for s in seq.segments if s.message_index == index - 1]
        assert [s.kind for s in user] == [SegmentKind.USER]  # the instruction, a segment of its own
        tool = [s for s in seq.segments if s.message_index == index - 2]
        assert [s.kind for s in tool] == [SegmentKind.TOOL]  # the reply that did not fit, summarised too
        assert seq.info["summary_turn"] == {"message_index": index, "tokens": segment.length, "trained": True}
        record = nxt.info["compaction"]
        assert record["summary"] == summary.content and record["summary_trained"] is True
        assert nxt.messages[2].content == "Summary of the earlier turns:\n" + summary.content
        assert nxt.prompt_length == record["tokens_after"] == len(qwen3.encode(
            nxt.messages[:3], LongRecallEnv(ROW).tool_specs(), add_generation_prompt=True))
    metrics = ep.trajectory.metrics
    assert (metrics["context/summary_turns"], metrics["context/compactions/summarize"]) == (2.0, 2.0)
    assert ep.trajectory.messages[-1].content == "codes: " + " ".join(f"p{i + 1}={c}" for i, c in
                                                                      enumerate(ROW["codes"]))


async def test_the_masked_summary_control_keeps_the_tokens_but_trains_none_of_them(qwen3: ChatTemplate) -> None:
    trained = await _play(qwen3, Summarize(trigger=1100, instruction=INSTRUCTION))
    masked = await _play(qwen3, Summarize(trigger=1100, instruction=INSTRUCTION, train_summary=False))
    assert masked.reward == 1.0 and len(masked.sequences) == 3
    for a, b in zip(trained.sequences, masked.sequences, strict=True):
        assert a.tokens == b.tokens and a.logprobs == b.logprobs
        index = len(a.messages) - 1
        summary = [s for s in b.segments if s.message_index == index and s.kind is SegmentKind.MODEL]
        if b is masked.sequences[-1]:
            assert b.loss_mask == a.loss_mask
            continue
        assert [s.trainable for s in summary] == [False] and b.info["summary_turn"]["trained"] is False
        lost = sum(a.loss_mask) - sum(b.loss_mask)
        assert lost == summary[0].length > 0
    assert masked.sequences[1].info["compaction"]["summary_trained"] is False


async def test_a_separate_summarizer_writes_environment_tokens(qwen3: ChatTemplate) -> None:
    seen: list[int] = []

    async def notes(messages: Sequence[Message]) -> str:
        seen.append(len(messages))
        text = " ".join(str(m.content) for m in messages)
        codes = " ".join(f"p{k + 1}={c}" for k, c in enumerate(ROW["codes"]) if f"p{k + 1}={c}" in text)
        return f"{codes} next {text.rsplit('next ', 1)[1].split()[0]}"

    ep = await _play(qwen3, Summarize(trigger=1100, summarizer=notes))
    assert ep.reward == 1.0 and len(seen) == len(ep.sequences) - 1 >= 1
    for seq in ep.sequences[:-1]:
        assert seq.messages[-1].role == "assistant" and INSTRUCTION not in str(seq.messages)  # nothing was asked
    for seq in ep.sequences[1:]:
        assert seq.info["compaction"]["summarizer"] == "separate"
        assert seq.messages[2].content.startswith("Summary of the earlier turns:\np1=")  # in the prompt: not trained


async def test_a_summary_without_room_for_the_reply_carries_the_last_turn(qwen3: ChatTemplate) -> None:
    # a context just above the trigger: the pending page and a 200-token summary do not fit, the instruction does
    config = dataclasses.replace(CONFIG, context_length=1250)
    ep = await _play(qwen3, Summarize(trigger=1100, max_tokens=200, instruction=INSTRUCTION), config=config)
    assert ep.reward == 1.0 and len(ep.sequences) >= 3
    first, second = ep.sequences[0], ep.sequences[1]
    assert first.messages[-2].content == INSTRUCTION and first.messages[-3].role == "assistant"  # no tool reply
    assert second.info["compaction"]["carried_messages"] == 2
    summary, call, page = second.messages[2:5]
    assert summary.content.startswith("Summary of the earlier turns:\np1=") and call == first.messages[-3]
    k = call.tool_calls[0].arguments["page"]
    assert page.role == "tool" and page.content.startswith(f"p{k - 1}={ROW['codes'][k - 2]} p{k}={ROW['codes'][k - 1]}\n")


async def test_the_rollouts_sampled_token_budget_spans_its_sequences(qwen3: ChatTemplate) -> None:
    ep = await _play(qwen3, Summarize(trigger=1100, instruction=INSTRUCTION), limits=EnvLimits(
        max_turns=64, max_tool_calls=64, max_sampled_tokens=500))
    assert (ep.status, ep.stop_reason) == (Status.TRUNCATED, StopReason.MAX_SAMPLED_TOKENS)
    assert len(ep.sequences) >= 2  # the budget counts the sequences after the first compaction too
    assert sum(s.num_trainable_tokens for s in ep.sequences) == 500 == ep.trajectory.metrics["generated_tokens"]
    assert ep.trajectory.info.get("last_message_partial") is True


async def test_a_policy_that_raises_or_returns_nonsense_fails_the_episode_as_a_value(qwen3: ChatTemplate) -> None:
    class Broken(ContextPolicy):
        async def compact(self, view: ContextView) -> Rewrite:
            raise RuntimeError("boom")

    class Nonsense(ContextPolicy):
        async def compact(self, view: ContextView) -> Rewrite:
            return Rewrite(view.messages[:3])  # ends with an assistant message

    ep = await _play(qwen3, Broken(trigger=1000))
    [error] = ep.trajectory.errors
    assert (ep.stop_reason, error.kind, error.component) == (StopReason.FAILED, ErrorKind.CONTEXT, "context")
    assert "Broken.compact raised RuntimeError: boom" in error.message
    ep = await _play(qwen3, Nonsense(trigger=1000))
    [error] = ep.trajectory.errors
    assert ep.stop_reason is StopReason.FAILED and "ends with a 'assistant' message" in error.message


async def test_a_user_written_policy_and_one_with_nothing_to_compact(qwen3: ChatTemplate) -> None:
    class LastTwoPages(ContextPolicy):
        """Keeps the opening and the last two turns, whatever the target."""

        async def compact(self, view: ContextView) -> Rewrite:
            start = view.turns()[-2][0]
            return Rewrite((*view.messages[:view.opening], *view.messages[start:]), note={"mine": True})

    class Never(ContextPolicy):
        async def compact(self, view: ContextView) -> AskSummary | None:
            return None

    ep = await _play(qwen3, LastTwoPages(trigger=900))
    assert ep.stop_reason is StopReason.NO_TOOL_CALLS and len(ep.sequences) > 2
    assert all(s.info["compaction"]["mine"] is True and s.info["compaction"]["policy"] == "custom"
               for s in ep.sequences[1:])
    ep = await _play(qwen3, Never(trigger=900))
    assert ep.stop_reason is StopReason.CONTEXT_BUDGET and len(ep.sequences) == 1
    assert ep.trajectory.metrics["context/nothing_to_compact"] >= 1


async def test_elision_compacts_until_only_calls_and_stubs_are_left(qwen3: ChatTemplate) -> None:
    ep = await _play(qwen3, ElideToolOutput(trigger=1000, keep_turns=2))
    _check_sequences(ep)
    assert ep.reward == 0.0 and ep.stop_reason is StopReason.NO_TOOL_CALLS
    second = ep.sequences[1]
    stubs = [m for m in second.messages if m.role == "tool" and str(m.content).startswith("[output of call")]
    assert stubs and all(str(m.content).endswith("tokens]") for m in stubs)
    assert ep.trajectory.metrics["context/elided_tool_outputs"] >= len(stubs)


class _AbortOnce:
    """The scripted policy, with the first summary request cut short by an abort after ``keep`` tokens."""

    def __init__(self, inner: FakePolicyClient, keep: int) -> None:
        self.inner, self.keep, self.aborted = inner, keep, False

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, **kw: Any) -> GenerateResult:
        result = await self.inner.generate(input_ids, sampling, **kw)
        asking = qwen3_instruction_pending(self.inner.tokenizer.decode(list(input_ids)))
        if asking and not self.aborted:
            self.aborted = True
            return dataclasses.replace(result, output_ids=result.output_ids[:self.keep],
                                       output_logprobs=result.output_logprobs[:self.keep],
                                       finish_reason=FinishReason(FinishKind.ABORT, message="step full"))
        return result


def qwen3_instruction_pending(text: str) -> bool:
    return text.rstrip().endswith("<|im_start|>assistant") and INSTRUCTION in text[text.rfind("<|im_start|>user"):]


async def test_a_summary_cut_short_by_an_abort_resumes_as_the_same_turn(qwen3: ChatTemplate) -> None:
    client = _AbortOnce(FakePolicyClient(qwen3.tokenizer, recall_policy(INSTRUCTION)), keep=5)
    env = LongRecallEnv(ROW, context_policy=Summarize(trigger=1100, instruction=INSTRUCTION))
    runner = EpisodeRunner(env, qwen3, client, CONFIG)
    assert await runner.advance() is None  # suspended inside the summary turn
    assert runner.partial_turn_tokens == 5 and len(runner.sequences) == 1
    episode = await runner.advance()
    await runner.close()
    assert episode is not None and episode.reward == 1.0 and len(episode.sequences) == 3
    first = episode.sequences[0]
    index = len(first.messages) - 1
    parts = [s for s in first.segments if s.message_index == index]
    assert [s.kind for s in parts] == [SegmentKind.MODEL, SegmentKind.MODEL] and parts[0].length == 5
    assert episode.sequences[1].info["compaction"]["summary"] == first.messages[-1].content


async def test_the_viewer_shows_each_compaction_and_its_summary(qwen3: ChatTemplate) -> None:
    from agentrl.inspect import episode_html

    ep = await _play(qwen3, Summarize(trigger=1100, instruction=INSTRUCTION, train_summary=False))
    page = episode_html(ep)
    summary = ep.sequences[1].info["compaction"]["summary"]
    assert "compaction (summarize) of sequence 0" in page and "compaction (summarize) of sequence 1" in page
    assert f"summary (not trained): <b>{summary}</b>" in page
    assert "ends with the summary the policy wrote" in page and "masked out of the loss" in page


async def test_a_checkpointed_episode_cut_inside_a_summary_is_rebuilt_by_replay(qwen3: ChatTemplate) -> None:
    from agentrl.rollout._step import MemberRecord
    from agentrl.rollout.restore import replay

    policy = Summarize(trigger=1100, instruction=INSTRUCTION)
    client = _AbortOnce(FakePolicyClient(qwen3.tokenizer, recall_policy(INSTRUCTION)), keep=5)
    first = EpisodeRunner(LongRecallEnv(ROW, context_policy=policy), qwen3, client, CONFIG)
    assert await first.advance() is None
    record = MemberRecord(sequences=[dataclasses.replace(s) for s in first.sequences],
                          partial_turn_tokens=first.partial_turn_tokens, metrics=dict(first.metrics),
                          timings=dict(first.timings))
    await first.close()
    fresh = EpisodeRunner(LongRecallEnv(ROW, context_policy=policy), qwen3,
                          FakePolicyClient(qwen3.tokenizer, recall_policy(INSTRUCTION)), CONFIG)
    assert await replay(fresh, record) is None  # the compaction is reached again, the summary turn held
    assert fresh.partial_turn_tokens == 5
    episode = await fresh.advance()
    await fresh.close()
    assert episode is not None and episode.reward == 1.0 and len(episode.sequences) == 3
