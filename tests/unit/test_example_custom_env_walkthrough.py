"""examples/custom_env_walkthrough.py: its warm-up, environment, dataset and run config train three steps.

The walkthrough itself runs ``agentrl.train`` on a real CPU SGLang engine; booting one costs 28 s on
a quiet 2-core machine and 54-210 s under load, over this suite's budget, so this test drives the
same environment class, rows and config through the runner on the fake engine
(:func:`agentrl.testing.runner.build_fake_runner`: the real agent loop, tool, scheduler, torch
trainer and run folder; only generation is scripted). The fake policy calls ``count_letter``, then
answers with the tool's result or one more, chosen per episode, so rewards differ inside a group.
The environment's own reward is used, and checked against the count the test computes itself. The
run starts from the walkthrough's warm-up (two SFT steps here) on its transcripts."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agentrl.runner.rundir import RunDirectory
from agentrl.testing.policy import PolicyRequest
from agentrl.testing.runner import build_fake_runner

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "custom_env_walkthrough.py"
_QUESTION = re.compile(r"the letter '(.)' occur in '([a-z]+)'")


@pytest.fixture(scope="module")
def walkthrough() -> ModuleType:
    spec = importlib.util.spec_from_file_location("custom_env_walkthrough", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic and dataclasses look the module up there
    spec.loader.exec_module(module)
    return module


def letter_policy(req: PolicyRequest) -> str:
    letter, word = _QUESTION.findall(req.text)[-1]
    if "<tool_response>" not in req.text:
        call = '{"name": "count_letter", "arguments": {"text": "%s", "letter": "%s"}}' % (word, letter)  # noqa: UP031
        return f"<tool_call>\n{call}\n</tool_call><|im_end|>"
    result = int(req.text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0])
    off_by_one = hashlib.sha256(str(req.routing_key).encode()).digest()[0] % 2  # per episode
    return f"So the letter occurs \\boxed{{{result + off_by_one}}} times.<|im_end|>"


def test_warm_up_transcripts_are_the_winning_episodes(walkthrough: ModuleType) -> None:
    rows = walkthrough.make_rows(6, seed=3)
    for row, conv in zip(rows, walkthrough.transcripts(rows), strict=True):
        roles = [m["role"] for m in conv["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        truth = str(row["word"].count(row["letter"]))
        call = conv["messages"][2]["tool_calls"][0]["function"]
        assert call == {"name": "count_letter", "arguments": {"text": row["word"], "letter": row["letter"]}}
        assert conv["messages"][3]["content"] == truth and conv["messages"][4]["content"] == f"\\boxed{{{truth}}}"
        assert [t["function"]["name"] for t in conv["tools"]] == ["count_letter"]


async def test_walkthrough_environment_trains_three_steps(tmp_path: Path, walkthrough: ModuleType) -> None:
    model = walkthrough.warm_up(tmp_path, steps=2)
    assert (model / "config.json").is_file() and (model / "sft_summary.json").is_file()
    config = walkthrough.build_config(tmp_path, steps=3, rows=16, model=model)
    assert config.environment.name == "letter_count" and config.rollout.scheduler.samples_per_step == 8
    runner, _ = build_fake_runner(config, environment=walkthrough.LetterCountEnv, policy=letter_policy,
                                  reward=None)
    summary = await runner.run()
    assert summary.steps == 3

    run_dir = RunDirectory(config.run_dir(), config_hash=config.hash())
    metrics = [m for m in run_dir.read_metrics() if "prompt_ids" in m]
    assert len(metrics) == 3
    assert all(m["rollout/tool_call_rate"] == 1.0 for m in metrics)
    assert any(m["train/skipped"] == 0.0 for m in metrics)  # advantages were not all zero: the weights moved
    rewards = []
    for step in (1, 2, 3):
        for episode in run_dir.read_trajectories(step):
            messages = episode.trajectory.messages
            letter, word = _QUESTION.findall(str(messages[1].content))[-1]
            truth = word.count(letter)
            tool_outputs = [m.content for m in messages if m.role == "tool"]
            assert tool_outputs == [str(truth)]  # the real tool ran on the model's call
            answer = int(re.findall(r"\\boxed\{(\d+)\}", str(messages[-1].content))[-1])
            assert episode.reward == (1.0 if answer == truth else 0.0)
            rewards.append(episode.reward)
    assert len(rewards) == 24 and 0 < sum(rewards) < 24
