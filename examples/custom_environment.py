"""Write your own environment: a small tool-using task, checked and run end to end.

    python examples/custom_environment.py                 # scripted policy: no model, no GPU
    python examples/custom_environment.py --engine-url http://127.0.0.1:30000 --model /path/to/model \
        --seed 3 --save episodes.jsonl

The environment below asks how many seconds are in some amount of time and gives the model a
``to_seconds`` tool. The script then (1) runs the conformance checker that ``agentrl env check``
runs, (2) plays one episode through the real agent loop — with a scripted policy by default, or
against a running SGLang server (attach to it with ``--engine-url``; ``--model`` is the folder it
serves, for the tokenizer and the model's vocabulary) — and (3) prints every sequence of the
episode: its segments, masks and reward, and appends the whole episode to ``--save``.
Fork it: change the task, the tool and the reward, keep the rest.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from agentrl import Episode, save_episodes
from agentrl.chat import ChatTemplate, Message, ToolCall
from agentrl.environments import Environment, EnvLimits, FailurePolicy, check_environment
from agentrl.rewards import final_answer_text, math_answer_reward
from agentrl.rollout import ClientConfig, InferenceClient, SamplingParams, model_vocab_size
from agentrl.rollout.agent import AgentConfig, GenerateClient, run_episode
from agentrl.testing import build_tokenizer
from agentrl.testing.scripted import ScriptedClient
from agentrl.tools import tool
from agentrl.trajectory import Trajectory

SECONDS = {"minutes": 60, "hours": 3600, "days": 86400, "weeks": 604800}


# 1. A tool: the decorator derives the JSON schema from the type hints and the docstring.
@tool
def to_seconds(amount: float, unit: Literal["minutes", "hours", "days", "weeks"]) -> str:
    """Convert an amount of time to seconds.

    Args:
        amount: How many units.
        unit: The unit of the amount.
    """
    value = amount * SECONDS[unit]
    return str(int(value)) if value == int(value) else str(value)


# 2. A typed dataset row: a bad row fails at construction with the field named.
class TimeTask(BaseModel):
    amount: float
    unit: Literal["minutes", "hours", "days", "weeks"]


# 3. The environment: opening messages, tools, limits, failure policy and a reward.
class SecondsEnv(Environment):
    """How many seconds are in ``amount`` ``unit``? Reward 1 for the exact boxed number."""

    task_type = TimeTask
    tools = (to_seconds,)
    reward_range = (0.0, 1.0)
    default_limits = EnvLimits(max_turns=4, max_tool_calls=3)
    default_failure_policy = FailurePolicy(overrides={"unknown_tool": "penalize"}, penalty=-0.1)

    async def reset(self) -> list[Message]:
        return [Message(role="system", content="Use the to_seconds tool, then answer as \\boxed{N}."),
                Message(role="user", content=f"How many seconds are in {self.task.amount:g} {self.task.unit}?")]

    def reward(self, trajectory: Trajectory) -> float:
        # Only the model's final message counts: the tool's own output can never earn reward.
        expected = to_seconds.fn(self.task.amount, self.task.unit)
        return math_answer_reward(final_answer_text(trajectory.messages), expected)

    def reference_reply(self, messages: Sequence[Message]) -> Message | None:
        # A scripted solver (optional): `agentrl env check` plays it and expects full marks, so a
        # reward that could never give 1.0 is caught before a run trains on it.
        results = [m for m in messages if m.role == "tool"]
        if not results:
            call = ToolCall("to_seconds", {"amount": self.task.amount, "unit": self.task.unit}, id="call_0")
            return Message(role="assistant", content="", tool_calls=[call])
        return Message(role="assistant", content=f"\\boxed{{{results[-1].content}}}")


ROWS = [{"amount": 3.5, "unit": "hours"}, {"amount": 2, "unit": "weeks"}, {"amount": 90, "unit": "minutes"}]


def scripted_policy(tokenizer: Any, row: dict[str, Any]) -> ScriptedClient:
    """A stand-in for a model: call the tool, then copy the tool's result (read from the prompt ids) into the answer."""
    call = ('<think>\nI should convert with the tool.\n</think>\n\n<tool_call>\n{"name": "to_seconds", '
            f'"arguments": {{"amount": {row["amount"]}, "unit": "{row["unit"]}"}}}}\n</tool_call><|im_end|>')

    def copy_the_result(prompt_ids: Sequence[int]) -> str:
        seen = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        result = seen.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
        return f"<think>\nThe tool says {result}.\n</think>\n\n\\boxed{{{result}}}<|im_end|>"

    return ScriptedClient(tokenizer, [call, copy_the_result])


def show(episode: Episode, template: ChatTemplate) -> None:
    """Every sequence of the episode (more than one when the template rewrote history and it forked)."""
    print(f"status={episode.status.value} stop_reason={episode.stop_reason.value if episode.stop_reason else None} "
          f"reward={episode.reward} sequences={len(episode.sequences)} metrics={episode.trajectory.metrics}")
    for error in episode.trajectory.errors:  # a failed episode says why: kind, where, message
        print(f"  {error}")
    if "abort_reason" in episode.trajectory.info:
        print(f"  abort_reason: {episode.trajectory.info['abort_reason']}")
    for traj in episode.sequences:
        for seg in traj.segments:
            text = template.decode(traj.tokens[seg.start:seg.end]).replace("\n", "\\n")
            print(f"  [{traj.sequence_index}] {seg.kind.value:8} [{seg.start:4},{seg.end:4}) "
                  f"trained={seg.trainable!s:5} {text[:70]!r}")


async def main(engine_url: str | None, model_path: str | None, seed: int, save: str | None) -> Episode:
    report = await check_environment(SecondsEnv, ROWS)
    print(report.format())

    vocab_size = None
    if model_path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        vocab_size = model_vocab_size(model_path)  # the model's ids: checkpoints pad beyond the tokenizer
    else:
        tokenizer = build_tokenizer()  # agentrl's small Qwen-style test tokenizer
    template = ChatTemplate.from_name("qwen3", tokenizer=tokenizer)
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=256, temperature=1.0, sampling_seed=seed),
                         vocab_size=vocab_size)
    row = ROWS[seed % len(ROWS)]
    if engine_url:
        async with InferenceClient(ClientConfig(base_url=engine_url)) as real:
            episode = await run_episode(SecondsEnv(row), template, real, config)
    else:
        client: GenerateClient = scripted_policy(tokenizer, row)
        episode = await run_episode(SecondsEnv(row), template, client, config)
    show(episode, template)
    if save:
        save_episodes(save, [episode], append=True)  # the whole episode: every sequence, lossless JSONL
    return episode


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-url", help="a running SGLang server to attach to (default: a scripted policy)")
    parser.add_argument("--model", "--tokenizer", dest="model",
                        help="the folder the server serves (its tokenizer and vocabulary; with --engine-url)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed; also picks the row (default 0)")
    parser.add_argument("--save", help="append the episode to this JSONL file")
    args = parser.parse_args()
    asyncio.run(main(args.engine_url, args.model, args.seed, args.save))
