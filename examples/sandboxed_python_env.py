"""Your own environment with the sandboxed ``python`` tool, and one warm pool shared by every episode.

    python examples/sandboxed_python_env.py                         # 8 episodes, scripted policy, no model
    python examples/sandboxed_python_env.py --write-rows rows.jsonl --count 64
    agentrl env check examples.sandboxed_python_env:DigitSumEnv --data rows.jsonl
    agentrl eval my_run.toml --endpoint http://127.0.0.1:30000/v1   # environment.name names DigitSumEnv

The task: the sum of the decimal digits of ``2**n`` (easy with Python, hard without). The model
gets the ``python`` tool: every call runs in a sandbox (bubblewrap by default: no network, a
read-only system, limits on time, memory and processes; see docs/sandbox.md).

Why a shared pool, and how. Starting sandbox workers costs time, so every episode should borrow
one warm pool rather than start its own (``PythonTool()`` without a sandbox starts and owns one per
episode; ``PythonTool(sandbox)`` borrows). A run (``agentrl train``, ``agentrl eval``) builds each
environment from a data row and ``environment.options`` (plain values from the config file), in the
process that plays the episodes (the rollout's Ray actor, or the driver with ``--no-ray``), so the
pool cannot be handed in: :func:`shared_sandbox` creates it when the first episode resets, in that
process, and every later episode there borrows it. There is one pool per process and event loop
(its pipes and locks belong to the loop that started it); the first episode's options create it,
and its ``pool_size`` bounds how many programs run at once across all episodes. An episode's
``close()`` leaves it running. Nothing closes it during a run: when the process ends its workers
exit with it (their pipes close). A script that plays episodes itself ends with
``await close_shared_sandbox()``, as :func:`main` does.

Fork it: change the task, the prompt and the reward; keep :func:`shared_sandbox` and ``reset()``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import weakref
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from agentrl import Episode
from agentrl.chat import ChatTemplate, Message, ToolCall
from agentrl.environments import Environment, EnvLimits
from agentrl.rewards import final_answer_text, math_answer_reward
from agentrl.rollout import SamplingParams
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.testing import build_tokenizer
from agentrl.testing.scripted import ScriptedClient
from agentrl.tools import PythonTool
from agentrl.tools.sandbox import Sandbox, create_sandbox
from agentrl.trajectory import Trajectory

# 1. One warm pool per process (and event loop), made by the first episode that asks.
_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Sandbox] = weakref.WeakKeyDictionary()


def shared_sandbox(backend: str = "bwrap", **options: Any) -> Sandbox:
    """This process's warm pool for the running event loop, created on the first call with these
    options (``create_sandbox``'s: ``pool_size``, ``timeout_s``, ``memory_mb``...); later calls get
    the same pool whatever their options. Call it from a coroutine, e.g. ``reset()``."""
    loop = asyncio.get_running_loop()
    sandbox = _POOLS.get(loop)
    if sandbox is None or sandbox.closed:
        sandbox = _POOLS[loop] = create_sandbox(backend, **options)
    return sandbox


async def close_shared_sandbox() -> None:
    """Closes the running loop's pool (a script's last step; a run's process exiting does it too)."""
    sandbox = _POOLS.pop(asyncio.get_running_loop(), None)
    if sandbox is not None:
        await sandbox.close()


# 2. A typed dataset row: a bad row fails at construction with the field named.
class DigitTask(BaseModel):
    n: int = Field(ge=1, le=5000)
    answer: str


def make_rows(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"n": n, "answer": str(sum(map(int, str(2 ** n))))} for n in rng.sample(range(100, 2000), count)]


# 3. The environment: options are plain values, so a config file can set them.
class DigitSumEnv(Environment):
    """What is the sum of the digits of 2**n? Reward 1 for the exact number in ``\\boxed{}``."""

    task_type = DigitTask
    reward_range = (0.0, 1.0)
    default_limits = EnvLimits(max_turns=4, max_tool_calls=3)

    def __init__(self, task: Any, *, backend: str = "bwrap", pool_size: int = 4, timeout_s: float = 10.0,
                 memory_mb: int = 512, limits: EnvLimits | None = None) -> None:
        super().__init__(task, limits=limits)
        self.backend = backend
        self.sandbox_options = {"pool_size": pool_size, "timeout_s": timeout_s, "memory_mb": memory_mb}

    async def reset(self) -> list[Message]:
        # Borrow the shared pool: the tool does not own it, so nothing closes it with the episode.
        # Registered here, not on the class: the pool belongs to the process that runs the episode.
        self.register_tool(PythonTool(shared_sandbox(self.backend, **self.sandbox_options), max_output_chars=1000))
        return [Message(role="system", content="Use the python tool to compute, then answer as \\boxed{N}."),
                Message(role="user", content=f"What is the sum of the decimal digits of 2**{self.task.n}?")]

    def reward(self, trajectory: Trajectory) -> float:
        # Only the model's final message counts: a program that prints \boxed{...} earns nothing.
        return math_answer_reward(final_answer_text(trajectory.messages), self.task.answer)

    def reference_reply(self, messages: Sequence[Message]) -> Message | None:
        # A scripted solver (optional): `agentrl env check` plays it and expects full marks.
        results = [m for m in messages if m.role == "tool"]
        if not results:
            code = f"print(sum(int(d) for d in str(2**{self.task.n})))"
            return Message(role="assistant", content="", tool_calls=[ToolCall("python", {"code": code}, id="call_0")])
        return Message(role="assistant", content=f"\\boxed{{{str(results[-1].content).strip()}}}")


# 4. Play episodes with a scripted policy (a stand-in for a model): run code, copy its output.
def scripted_policy(tokenizer: Any, row: dict[str, Any]) -> ScriptedClient:
    code = f"print(sum(int(d) for d in str(2**{row['n']})))"
    call = f'<tool_call>\n{json.dumps({"name": "python", "arguments": {"code": code}})}\n</tool_call><|im_end|>'

    def copy_the_output(prompt_ids: Any) -> str:
        seen = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        output = seen.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0].strip()
        return f"The digits add up to \\boxed{{{output}}}.<|im_end|>"

    return ScriptedClient(tokenizer, [call, copy_the_output])


async def main(count: int = 8, backend: str = "bwrap") -> list[Episode]:
    tokenizer = build_tokenizer()  # agentrl's small Qwen-style test tokenizer
    template = ChatTemplate.from_name("qwen3", tokenizer=tokenizer)
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=128))
    rows = make_rows(count)
    try:
        episodes = await asyncio.gather(*(
            run_episode(DigitSumEnv(row, backend=backend), template, scripted_policy(tokenizer, row), config)
            for row in rows))  # concurrent episodes, one pool
        pool = _POOLS[asyncio.get_running_loop()]
        print(f"{len(episodes)} concurrent episodes on one {pool.backend} pool "
              f"(limits enforced: {', '.join(sorted(pool.capabilities().enforced))})")
        for row, episode in zip(rows, episodes, strict=True):
            print(f"  2**{row['n']}: reward {episode.reward}, {episode.stop_reason.value if episode.stop_reason else '-'}")
        return list(episodes)
    finally:
        await close_shared_sandbox()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=8, help="how many rows (episodes) (default 8)")
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker", "local"])
    parser.add_argument("--write-rows", metavar="FILE", help="write the rows as JSONL (for a run) and exit")
    args = parser.parse_args()
    if args.write_rows:
        with open(args.write_rows, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in make_rows(args.count))
    else:
        asyncio.run(main(args.count, args.backend))
