"""The long_key task (the long-horizon experiment's environment) played by its scripted policy under each
context policy: without one the pages overflow the context; a window or elision loses page 1's key; a
summary keeps it only when every summary of the episode writes it; the key is the only digit in view."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import tomllib

from agentrl.chat import ChatTemplate
from agentrl.cli.sft import load_sft_config
from agentrl.environments.conformance import check_environment
from agentrl.environments.long_key import (
    FULL_SUMMARY,
    LOSSY_SUMMARY,
    KeyTask,
    LongKeyEnv,
    key_page,
    key_policy,
    make_key_rows,
    score_key,
)
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.context import ContextPolicy, ElideToolOutput, Summarize, Window
from agentrl.rollout.types import SamplingParams
from agentrl.testing.policy import FakePolicyClient
from agentrl.trajectory import ForkReason, Status, StopReason

INSTRUCTION = Summarize().instruction
CONFIG = AgentConfig(sampling=SamplingParams(max_new_tokens=200), context_length=2048, reward_pool=False)
ROWS = make_key_rows(12, seed=7)


@pytest.fixture(scope="module")
def qwen3(tok: Any) -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=tok)


async def _play(template: ChatTemplate, row: dict[str, Any], policy: ContextPolicy | None, *,
                lossy: float = 0.0, seed: int = 0) -> Any:
    client = FakePolicyClient(template.tokenizer, key_policy(INSTRUCTION, lossy=lossy, seed=seed))
    episode = await run_episode(LongKeyEnv(row, context_policy=policy), template, client, CONFIG, group_id="g")
    episode.validate()
    return episode


def _digits(template: ChatTemplate, sequence: Any) -> set[str]:
    return set(re.findall(r"\d", template.decode(sequence.tokens)))


def test_rows_are_deterministic_and_their_keys_spread_over_the_digits() -> None:
    rows = make_key_rows(400, seed=1)
    assert rows == make_key_rows(400, seed=1) and rows != make_key_rows(400, seed=2)
    counts = {d: sum(r["key"] == d for r in rows) for d in "0123456789"}
    assert all(20 <= c <= 60 for c in counts.values()), counts
    with pytest.raises(ValueError, match="pages=1"):
        make_key_rows(2, pages=1)
    with pytest.raises(ValueError, match="n=0"):
        make_key_rows(0)


def test_only_page_one_holds_the_key_and_only_the_last_page_says_end() -> None:
    task = KeyTask(key="4", pages=5, seed=11)
    pages = [key_page(task, p, 10) for p in range(1, 6)]
    assert pages[0].startswith("key 4\n") and all("key" not in p for p in pages[1:])
    assert [p.rsplit("\n", 1)[1] for p in pages] == ["more"] * 4 + ["end"]
    assert not any(re.search(r"\d", p) for p in pages[1:])


def test_the_answer_scores_by_its_last_key() -> None:
    assert score_key("key 3", "3") == 1.0
    assert score_key("key 5 then key 3", "3") == 1.0
    assert score_key("key 3 then key 5", "3") == 0.0
    assert score_key("3", "3") == 0.0


async def test_the_read_tool_refuses_arguments_and_reading_past_the_end() -> None:
    env = LongKeyEnv({"key": "2", "pages": 2, "seed": 0}, filler_words=3)
    tool = env.tool_map["read"]
    assert "takes no arguments" in (await tool(page=1)).content
    first, last = (await tool()).content, (await tool()).content
    assert first.startswith("key 2") and last.endswith("end")
    assert "no more pages" in (await tool()).content


async def test_without_a_policy_every_episode_ends_at_the_context(qwen3: ChatTemplate) -> None:
    for row in ROWS[:3]:
        ep = await _play(qwen3, row, None)
        assert (ep.status, ep.stop_reason, ep.reward) == (Status.TRUNCATED, StopReason.CONTEXT_BUDGET, 0.0)


@pytest.mark.parametrize("policy", [Window(trigger=1100), ElideToolOutput(trigger=1100)], ids=["window", "elide"])
async def test_a_window_or_elision_loses_the_key_after_the_first_compaction(qwen3: ChatTemplate,
                                                                          policy: ContextPolicy) -> None:
    rewards = []
    for i, row in enumerate(ROWS):
        ep = await _play(qwen3, row, policy, seed=i)
        assert ep.stop_reason is StopReason.NO_TOOL_CALLS and len(ep.sequences) >= 2
        assert _digits(qwen3, ep.sequences[0]) == {row["key"]}
        assert all(s.fork_reason is ForkReason.COMPACTION for s in ep.sequences[1:])
        # the last sequence's prompt no longer holds the key: the answer (its last turn) is a guess
        last = ep.sequences[-1]
        assert not re.search(r"key \d", qwen3.decode(last.tokens[:last.prompt_length]))
        rewards.append(ep.reward)
    assert sum(rewards) <= len(ROWS) / 2  # guesses: one in ten on average


async def test_summaries_that_keep_the_key_carry_it_to_the_answer(qwen3: ChatTemplate) -> None:
    for row in ROWS[:4]:
        ep = await _play(qwen3, row, Summarize(trigger=1100))
        assert (ep.stop_reason, ep.reward, len(ep.sequences)) == (StopReason.NO_TOOL_CALLS, 1.0, 3)
        for seq in ep.sequences:
            assert _digits(qwen3, seq) == {row["key"]}  # the key is the only digit of every sequence
        for seq in ep.sequences[:-1]:
            summary = seq.messages[-1]
            assert summary.role == "assistant" and summary.content == FULL_SUMMARY.format(key=row["key"])


async def test_one_summary_that_drops_the_key_loses_it_for_the_rest_of_the_episode(qwen3: ChatTemplate) -> None:
    dropped = kept = 0
    for i, row in enumerate(ROWS):
        ep = await _play(qwen3, row, Summarize(trigger=1100), lossy=0.6, seed=i)
        summaries = [seq.messages[-1].content for seq in ep.sequences[:-1]]
        if LOSSY_SUMMARY in summaries:
            dropped += 1
            lost = summaries.index(LOSSY_SUMMARY) + 1
            assert not any(re.search(r"\d", qwen3.decode(s.tokens[:s.prompt_length])) for s in ep.sequences[lost:])
        else:
            kept += 1
            assert ep.reward == 1.0
    assert dropped and kept


def test_the_two_warm_up_stages_chain_and_the_run_starts_from_the_second() -> None:
    """examples/: stage 1 (copying) writes the model stage 2 (the task) starts from, whose output the RL
    config trains."""
    examples = Path(__file__).resolve().parents[3] / "examples"
    copy = load_sft_config(examples / "sft_long_horizon_copy.toml", []).config
    task = load_sft_config(examples / "sft_long_horizon.toml", []).config
    run = tomllib.loads((examples / "long_horizon_cpu.toml").read_text())
    assert (copy.model.path, copy.data.path) == ("models/long-tiny", "data/long_horizon/copy.jsonl")
    assert (task.model.path, task.data.path) == (copy.output, "data/long_horizon/warmup.jsonl")
    assert run["model"]["path"] == task.output and run["environment"]["name"] == "long_key"


async def test_an_answer_before_the_last_page_scores_nothing(qwen3: ChatTemplate) -> None:
    """Reading page 1 and answering its key at once (what RL found when this was rewarded) earns 0; the same
    answer after the last page earns 1."""
    row = ROWS[0]
    scripted = key_policy(INSTRUCTION)

    def hasty(req: Any) -> str:
        return f"key {row['key']}<|im_end|>" if "key " + row["key"] in req.text else scripted(req)

    env = LongKeyEnv(row)
    episode = await run_episode(env, qwen3, FakePolicyClient(qwen3.tokenizer, hasty), CONFIG, group_id="g")
    assert (episode.stop_reason, env.pages_read, episode.reward) == (StopReason.NO_TOOL_CALLS, 1, 0.0)
    assert episode.trajectory.messages[-1].content == f"key {row['key']}"
    full = LongKeyEnv(row, context_policy=Summarize(trigger=1100))
    episode = await run_episode(full, qwen3, FakePolicyClient(qwen3.tokenizer, scripted), CONFIG, group_id="g")
    assert (full.pages_read, episode.reward) == (row["pages"], 1.0)


async def test_the_conformance_check_passes_and_reaches_a_winning_answer() -> None:
    report = await check_environment(LongKeyEnv, make_key_rows(2, pages=4, seed=1))
    assert report.ok and not report.warnings, report.format()
