"""ReTool-style math with a sandboxed Python interpreter, on DAPO-Math style rows ``{prompt, label}``.

The model reasons, runs Python through the ``python`` tool (a real sandbox: bubblewrap by default)
as often as it needs, and ends with its answer in ``\\boxed{}`` (or a last ``Answer: ...`` line,
the form the DAPO-Math prompts ask for). The reward is :class:`~agentrl.rewards.MathReward` on the
**final assistant message only**: a program that prints ``\\boxed{42}`` earns nothing, and the
optional tool bonus counts successful executions only.

The environment speaks messages; the chat format is the template's business. Run it with
``ChatTemplate.from_name("qwen3")`` (JSON ``<tool_call>`` bodies) or ``"qwen3_5"`` (XML
``<function=python>`` calls) — :data:`RETOOL_TEMPLATES` — and the agent loop parses each format.

Sandboxes: by default each episode creates its own Python tool and a one-worker sandbox in
``reset()`` and closes them in ``close()`` (nothing outlives the episode; ``sandbox_options`` such
as ``pool_size`` or limits are passed to it). For throughput, share one warm pool
across episodes: ``RetoolMathEnv(row, sandbox=shared)`` — the caller then owns and closes it.

Rows: ``prompt`` is a string or a chat list (``[{"role": "user", "content": ...}]``, as in
DAPO-Math-17k); ``label`` is the reference answer (numbers are accepted and stored as text).

Example::

    env = RetoolMathEnv({"prompt": "What is 2**100 mod 7?", "label": "2"})
    episode = await run_episode(env, ChatTemplate.from_name("qwen3", tokenizer=tok), client)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, field_validator

from agentrl.chat.types import Message, ToolCall
from agentrl.environments.base import Environment
from agentrl.environments.policy import EnvLimits, FailurePolicy
from agentrl.rewards.math import MathReward, final_answer_text
from agentrl.rewards.types import Reward
from agentrl.tools import PythonTool
from agentrl.tools.sandbox import Sandbox
from agentrl.trajectory import Trajectory

__all__ = ["RETOOL_SYSTEM_PROMPT", "RETOOL_TEMPLATES", "MathTask", "RetoolMathEnv"]

RETOOL_TEMPLATES: tuple[str, ...] = ("qwen3", "qwen3_5")
RETOOL_SYSTEM_PROMPT = (
    "Solve the problem step by step. You can call the python tool to run code for any computation or "
    "check; each call starts a fresh interpreter, so print what you need. When you are done, give the "
    "final answer as \\boxed{answer}."
)


class MathTask(BaseModel):
    """A DAPO-Math style row."""

    prompt: str | list[dict[str, Any]]
    label: str

    @field_validator("label", mode="before")
    @classmethod
    def _label_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("prompt")
    @classmethod
    def _prompt_messages(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("expected a non-empty problem statement")
            return value
        msgs = [Message.from_dict(m) for m in value]
        if not any(m.role == "user" for m in msgs):
            raise ValueError("expected a chat list with at least one user message")
        return value


class RetoolMathEnv(Environment):
    """Math problems solved with a sandboxed Python tool; see the module doc."""

    task_type = MathTask
    default_limits = EnvLimits(max_turns=16, max_tool_calls=16)

    def __init__(self, task: Any, *, sandbox: Sandbox | None = None, backend: str = "bwrap",
                 sandbox_options: dict[str, Any] | None = None, reward: MathReward | None = None,
                 system_prompt: str | None = RETOOL_SYSTEM_PROMPT, max_output_chars: int = 2000,
                 limits: EnvLimits | None = None, failure_policy: FailurePolicy | None = None) -> None:
        super().__init__(task, limits=limits, failure_policy=failure_policy)
        self.sandbox = sandbox
        self.backend = backend
        self.sandbox_options = dict(sandbox_options or {})
        self.max_output_chars = max_output_chars
        self.math_reward = reward if reward is not None else MathReward(answer_line=True)
        self.reward_range = self.math_reward.range
        self.system_prompt = system_prompt
        self.python: PythonTool | None = None

    async def reset(self) -> list[Message]:
        if self.python is not None:
            raise RuntimeError("RetoolMathEnv.reset: called twice; environments are single-use")
        # an episode runs one call at a time: its own sandbox needs one warm worker, not a host-sized pool
        options = self.sandbox_options if self.sandbox is not None else {"pool_size": 1, **self.sandbox_options}
        self.python = PythonTool(self.sandbox, backend=self.backend, max_output_chars=self.max_output_chars,
                                 **options)
        self.register_tool(self.python)
        prompt = self.task.prompt
        opening = ([Message(role="user", content=prompt)] if isinstance(prompt, str)
                   else [Message.from_dict(m) for m in prompt])
        if self.system_prompt and opening[0].role != "system":
            opening.insert(0, Message(role="system", content=self.system_prompt))
        return opening

    def reward(self, trajectory: Trajectory) -> Reward:
        return self.math_reward(final_answer_text(trajectory.messages), self.task.label,
                                successful_tool_calls=self.successful_tool_calls)

    def reference_reply(self, messages: Sequence[Message]) -> Message | None:
        """A scripted solver that knows the label: print it with the ``python`` tool (as many calls as
        the reward's tool bonus needs to reach its cap), then box what the tool printed."""
        results = [m for m in messages if m.role == "tool"]
        if not results:
            bonus = self.math_reward
            calls = math.ceil(bonus.max_tool_bonus / bonus.tool_bonus) if bonus.tool_bonus > 0 else 1
            code = f"print({self.task.label!r})"
            return Message(role="assistant", content="", tool_calls=[
                ToolCall("python", {"code": code}, id=f"call_{i}") for i in range(max(calls, 1))])
        return Message(role="assistant", content=f"\\boxed{{{str(results[-1].content).strip()}}}")

    async def close(self) -> None:
        """Closes the tool's own sandbox (a shared ``sandbox=`` stays open for its owner)."""
        if self.python is not None:
            await self.python.close()
