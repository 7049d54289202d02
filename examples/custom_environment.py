"""Write your own environment: a small tool-using task, checked and run end to end.

    python examples/custom_environment.py                 # scripted policy: no model, no GPU
    python examples/custom_environment.py --engine-url http://127.0.0.1:30000 --tokenizer /path/to/model

The environment below asks how many seconds are in some amount of time and gives the model a
``to_seconds`` tool. The script then (1) runs the conformance checker that ``agentrl env check``
runs, (2) plays one episode through the real agent loop — with a scripted policy by default, or
against a running SGLang server — and (3) prints the trajectory: its segments, masks and reward.
Fork it: change the task, the tool and the reward, keep the rest.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from agentrl.chat import ChatTemplate, Message
from agentrl.environments import Environment, EnvLimits, FailurePolicy, check_environment
from agentrl.rewards import final_answer_text, math_answer_reward
from agentrl.rollout import ClientConfig, InferenceClient, SamplingParams
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


def show(traj: Trajectory, template: ChatTemplate) -> None:
    print(f"status={traj.status.value} stop_reason={traj.stop_reason.value if traj.stop_reason else None} "
          f"reward={traj.reward} metrics={traj.metrics}")
    for seg in traj.segments:
        text = template.decode(traj.tokens[seg.start:seg.end]).replace("\n", "\\n")
        print(f"  {seg.kind.value:8} [{seg.start:4},{seg.end:4}) trained={seg.trainable!s:5} {text[:70]!r}")


async def main(engine_url: str | None, tokenizer_path: str | None) -> None:
    report = await check_environment(SecondsEnv, ROWS)
    print(report.format())

    if tokenizer_path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    else:
        tokenizer = build_tokenizer()  # agentrl's small Qwen-style test tokenizer
    template = ChatTemplate.from_name("qwen3", tokenizer=tokenizer)
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=256, temperature=1.0))
    if engine_url:
        async with InferenceClient(ClientConfig(base_url=engine_url)) as real:
            episode = await run_episode(SecondsEnv(ROWS[0]), template, real, config)
    else:
        client: GenerateClient = scripted_policy(tokenizer, ROWS[0])
        episode = await run_episode(SecondsEnv(ROWS[0]), template, client, config)
    show(episode.trajectory, template)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-url", help="a running SGLang server (default: a scripted policy)")
    parser.add_argument("--tokenizer", help="the served model's tokenizer folder (with --engine-url)")
    args = parser.parse_args()
    asyncio.run(main(args.engine_url, args.tokenizer))
