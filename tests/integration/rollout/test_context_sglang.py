"""Context policies against the session's real CPU SGLang engine (the tiny Qwen3, random weights): a
``summarize`` compaction of ``long_recall``, every turn a real sample. The random model is held to the
task's call by a regex (the engine's grammar backend), so it reads pages until the trigger passes,
writes its "summary" (under the same regex) and goes on in a new sequence. The checks are about
mechanics, not skill: the summary is a sampled turn with the engine's own logprobs and mask 1, the
instruction and the reply are environment segments, every sequence passes the bridge's audit and the
trajectory invariants, and the rollout batches with one denominator."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.environments import EnvLimits
from agentrl.environments.long_recall import LongRecallEnv, make_recall_rows
from agentrl.rollout import AgentConfig, ClientConfig, InferenceClient, SamplingParams
from agentrl.rollout.agent import run_episode
from agentrl.rollout.context import Summarize, Window
from agentrl.testing import build_tokenizer
from agentrl.train import build_training_batch
from agentrl.trajectory import ForkReason, SegmentKind, StopReason

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CALL = r'<tool_call>\n\{"name": "read", "arguments": \{"page": [1-9]\}\}\n</tool_call>'
# a call is 23 tokens as the tokenizer encodes it, but under the regex a random model may spell it in
# shorter pieces (up to one token a byte, ~66): 80 new tokens hold any spelling, so no turn ends by length
CONFIG = AgentConfig(sampling=SamplingParams(max_new_tokens=80, temperature=1.0, regex=CALL), context_length=1024,
                     audit=True, reward_pool=False)
LIMITS = EnvLimits(max_turns=10, max_tool_calls=10)


async def _episode(url: str, policy: Summarize | Window) -> Any:
    template = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
    env = LongRecallEnv(make_recall_rows(1, seed=1)[0], filler_words=30, context_policy=policy, limits=LIMITS)
    async with InferenceClient(ClientConfig(base_url=url)) as client:
        episode = await run_episode(env, template, client, CONFIG, group_id="g")
    episode.validate()
    return episode


async def test_a_summary_is_a_real_sample_trained_in_its_sequence(tiny_engine: str) -> None:
    episode = await _episode(tiny_engine, Summarize(trigger=600, max_tokens=80))
    assert episode.stop_reason is StopReason.MAX_TURNS and len(episode.sequences) >= 2
    first, second = episode.sequences[0], episode.sequences[1]
    assert second.fork_reason is ForkReason.COMPACTION and second.rollout_id == first.rollout_id
    index = first.info["summary_turn"]["message_index"]
    [summary] = [s for s in first.segments if s.message_index == index]
    assert summary is first.segments[-1] and summary.kind is SegmentKind.MODEL and summary.trainable
    lo, hi = summary.start - first.prompt_length, summary.end - first.prompt_length
    logprobs = first.logprobs[lo:hi]
    assert first.loss_mask[lo:hi] == [1] * (hi - lo) and all(lp <= 0 for lp in logprobs)
    assert len(set(logprobs)) > 1 and summary.weight_version == "0"  # the engine's, token by token
    kinds = [s.kind for s in first.segments[-3:-1]]
    assert kinds == [SegmentKind.TOOL, SegmentKind.USER]  # the reply that passed the trigger, the instruction
    assert second.messages[2].content.startswith("Summary of the earlier turns:\n")
    for seq in episode.sequences:
        assert seq.metrics.get("bridge/sampled_text_differs", 0) == 0
    assert episode.trajectory.metrics.get("bridge/sampled_text_differs", 0) == 0  # audited every turn
    batch = build_training_batch(_with_reward(episode))
    assert {s.denominator for s in batch.sequences} == {float(episode.num_trainable_tokens)}


def _with_reward(episode: Any) -> list[Any]:
    """The random model scores 0: a second, rewarded copy of the rollout in the group gives the batch advantages."""
    other = copy.deepcopy(episode)
    for seq in other.sequences:
        seq.rollout_id, seq.reward = "other", 1.0
    return [episode, other]


async def test_a_window_compacts_a_real_episode_with_hysteresis(tiny_engine: str) -> None:
    episode = await _episode(tiny_engine, Window(trigger=600))
    later = episode.sequences[1:]
    assert later and all(s.fork_reason is ForkReason.COMPACTION for s in later)
    # the opening (system prompt, tools, task) is ~270 tokens: a compaction keeps what fits half the
    # trigger, and at least the last turn
    for seq in later:
        kept = seq.info["compaction"]["kept_turns"]
        assert kept >= 1 and (seq.prompt_length <= 300 or kept == 1)
    # hysteresis: a sequence holds several turns before the next compaction, not one
    assert all(s.num_model_turns >= 2 for s in episode.sequences[:-1])
    assert sum(s.num_model_turns for s in episode.sequences) == 10
