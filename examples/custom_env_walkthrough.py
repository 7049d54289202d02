"""Walkthrough: write an environment in this file, then train the tiny model on it for real.

    python examples/custom_env_walkthrough.py                  # warm-up, then 2 RL steps on a CPU
    python examples/custom_env_walkthrough.py --steps 3 --ray  # the same with Ray actors
    python examples/custom_env_walkthrough.py --warmup-steps 0 # RL on the random tiny model directly
    agentrl inspect runs/letter_count/run                      # the episodes it trained on

The task: how many times does a letter occur in a word ("How many r's are in 'strawberry'?"), a
classic stumble for language models, which see tokens, not letters. The environment gives the
model one tool, ``count_letter``, and rewards the exact count in ``\\boxed{}``. The script

1. defines the tool, the typed dataset row and the environment (sections 1-3),
2. checks the environment like ``agentrl env check`` does (section 4),
3. warms the tiny Qwen3 up with a few steps of multi-turn SFT on transcripts of the task (call the
   tool, copy its result into the answer), laid out exactly as RL episodes (section 5),
4. writes a small dataset and a run config for the tiny Qwen3 on a CPU (section 6), and
5. trains with ``agentrl.run(config, environment=LetterCountEnv)``: a real SGLang CPU engine
   behind sglang-router, the real agent loop and tool, GRPO on the torch backend, weight sync to
   the engine after every step (section 7).

Without the warm-up the random tiny model never calls the tool nor answers, every reward is 0 and
GRPO has nothing to learn from (each step reports ``train/skipped``); after it the model succeeds
some of the time, so rewards differ inside a group and every step updates the weights. Two RL
steps show the loop working on your environment, not learning to the end (``make demo`` does
that). Fork it: change the task, the tool and the reward, keep the rest; ``docs/environments.md``
explains each piece.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

import agentrl
from agentrl.chat import Message
from agentrl.environments import Environment, EnvLimits, FailurePolicy, check_environment
from agentrl.rewards import final_answer_text, math_answer_reward
from agentrl.runner import RunCallback, RunConfig
from agentrl.sft import SftConfig, run_sft
from agentrl.testing import build_tiny_model
from agentrl.tools import tool, tool_schema
from agentrl.trajectory import Trajectory

WORDS = ("strawberry", "banana", "mississippi", "bookkeeper", "committee", "parallel", "assessment",
         "occurrence", "balloon", "possession", "referee", "successful", "tattoo", "address")


# 1. The tool. @tool reads the JSON schema the model sees from the type hints and the docstring; a
#    call with a missing or ill-typed argument comes back to the model as a typed error, not a crash.
@tool
def count_letter(text: str, letter: str) -> str:
    """Count how many times a letter occurs in a text (case-insensitive).

    Args:
        text: The text to search.
        letter: A single letter.
    """
    if len(letter) != 1:
        return f"Error: letter must be one character, got {letter!r}"
    return str(text.lower().count(letter.lower()))


# 2. A dataset row, typed: a bad row in the data file is reported with its line and field.
class LetterTask(BaseModel):
    word: str = Field(min_length=1)
    letter: str = Field(min_length=1, max_length=1)

    @property
    def count(self) -> int:
        return self.word.lower().count(self.letter.lower())


# 3. The environment: single use, built from one row. It speaks messages; the agent loop owns the
#    tokens. The default step() runs the model's tool calls and ends the episode when it answers.
class LetterCountEnv(Environment):
    """How many times does ``letter`` occur in ``word``? Reward 1 for the exact count in ``\\boxed{}``."""

    task_type = LetterTask
    tools = (count_letter,)
    reward_range = (0.0, 1.0)
    default_limits = EnvLimits(max_turns=3, max_tool_calls=2)
    # A call to a tool that does not exist costs a little; other failures are fed back to the model.
    default_failure_policy = FailurePolicy(overrides={"unknown_tool": "penalize"}, penalty=-0.1)

    async def reset(self) -> list[Message]:
        return opening(self.task)

    def reward(self, trajectory: Trajectory) -> float:
        # Only the model's final message is scored: a tool result can never earn reward by itself.
        return math_answer_reward(final_answer_text(trajectory.messages), str(self.task.count))


def opening(task: LetterTask) -> list[Message]:
    return [Message(role="system", content="Use the count_letter tool, then give the answer as \\boxed{N}."),
            Message(role="user", content=f"How many times does the letter '{task.letter}' occur in '{task.word}'?")]


def make_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` rows ``{"word", "letter"}``: a letter of the word, the frequent ones drawn more often."""
    rng = random.Random(seed)
    return [{"word": (word := rng.choice(WORDS)), "letter": rng.choice(word)} for _ in range(n)]


# 5. A warm-up: multi-turn SFT on transcripts of the winning policy (only the assistant turns are
#    trained; the tool result is masked), so that RL starts from a model that sometimes succeeds.
def transcripts(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One ``{"messages", "tools"}`` conversation per row: call the tool, then answer with its result."""
    out = []
    for row in rows:
        task = LetterTask.model_validate(row)
        count = count_letter.fn(task.word, task.letter)
        call = {"type": "function", "function": {"name": "count_letter",
                                                 "arguments": {"text": task.word, "letter": task.letter}}}
        messages = [m.to_dict() for m in opening(task)] + [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": count, "name": "count_letter"},
            {"role": "assistant", "content": f"\\boxed{{{count}}}"}]
        out.append({"messages": messages, "tools": [tool_schema(count_letter)]})
    return out


def warm_up(root: Path, *, steps: int, seed: int = 0) -> Path:
    """``steps`` SFT steps of the tiny model on 256 transcripts; returns the model folder it writes."""
    data = root / "warmup.jsonl"
    root.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(c) + "\n" for c in transcripts(make_rows(256, seed + 1))))
    config = SftConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "template": "qwen3"},
        "data": {"path": str(data), "seed": seed},
        # a transcript is ~380 tokens: a packing budget a little above that is fastest on CPU
        "train": {"steps": steps, "batch_size": 8, "max_tokens_per_micro_batch": 1024, "device": "cpu",
                  "threads": 1, "optimizer": {"lr": 3e-3, "weight_decay": 0.0}},
        "output": str(root / "warmed_up"), "overwrite": True})
    result = run_sft(config)
    print(f"warm-up: {result.steps} SFT steps in {result.seconds:.0f} s, loss {result.losses[0]:.2f} -> "
          f"{result.losses[-1]:.2f}")
    return result.output


# 6. The run: the (warmed-up) tiny Qwen3 on a CPU, one engine, 2 prompts x 4 samples per step.
def build_config(root: Path, *, steps: int = 2, rows: int = 16, seed: int = 0,
                 model: Path | None = None) -> RunConfig:
    """The run config of ``model`` (``None``: the random tiny model); writes the dataset to
    ``root/letters.jsonl`` and runs in ``root/run``."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "letters.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_rows(rows, seed)))
    return RunConfig.from_dict({
        "model": {"path": str(model or build_tiny_model()), "dtype": "float32", "template": "qwen3"},
        "data": {"train": {"path": str(data), "seed": seed}},
        # The name labels the run; the class itself is passed to agentrl.run below.
        "environment": {"name": "letter_count"},
        "rollout": {
            "engines": {"count": 1, "context_length": 1024, "max_total_tokens": 8192, "random_seed": seed},
            "sampling": {"max_new_tokens": 48, "temperature": 1.0},
            "scheduler": {"groups_per_step": 2, "group_size": 4},
        },
        "algorithm": {"estimator": "grpo"},
        "train": {"steps": steps, "optimizer": {"lr": 1e-4}, "max_tokens_per_micro_batch": 2048, "seed": seed},
        "logging": {"run_dir": str(root / "run")},
        "checkpoint": {"save_final": False},
    })


class PrintSteps(RunCallback):
    """A callback: one line per step (the CLI's progress display is a callback too)."""

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        print(f"step {step}: reward {metrics.get('rollout/reward_mean', 0.0):.2f}, accuracy "
              f"{metrics.get('rollout/accuracy', 0.0):.2f}, tool calls per episode "
              f"{metrics.get('rollout/tool_calls_per_episode', 0.0):.2f}, {metrics.get('time/step_s', 0.0):.1f} s",
              flush=True)


def main(root: Path, steps: int, warmup_steps: int, use_ray: bool) -> None:
    # 4. Check the environment before training on it: scripted episodes, no model.
    report = asyncio.run(check_environment(LetterCountEnv, make_rows(3)))
    print(report.format())
    model = warm_up(root, steps=warmup_steps) if warmup_steps else None
    # 7. Train on it.
    config = build_config(root, steps=steps, model=model)
    summary = agentrl.run(config, environment=LetterCountEnv, callbacks=[PrintSteps()], use_ray=use_ray)
    print(f"{summary.steps} steps in {summary.wall_s:.0f} s ({summary.stopped_because}); run folder "
          f"{config.run_dir()}: metrics.jsonl, trajectories/, summary.json")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("runs/letter_count"), help="where data and run go")
    parser.add_argument("--steps", type=int, default=2, help="training steps (default 2)")
    parser.add_argument("--warmup-steps", type=int, default=40, help="SFT steps before RL (default 40; 0: none)")
    parser.add_argument("--ray", action="store_true", help="run the rollout and trainer sides as Ray actors")
    args = parser.parse_args()
    main(args.root, args.steps, args.warmup_steps, args.ray)
