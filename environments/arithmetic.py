"""A toy arithmetic task that a tiny model can learn on CPU, and that needs the calculator to solve.

Each row asks for the product of two random ``digits``-digit numbers (``"What is 487 * 925?"``),
with the exact answer as label. The product of two 3-digit numbers has about 900,000 possible
values and a tiny model cannot multiply, so guessing earns (almost) nothing; the winning policy is
short and learnable: call ``calculator`` with the expression, then copy the result into
``\\boxed{}``. Scored on the final assistant message only, so echoing the tool output inside the
tool turn is worth nothing — the model has to write the answer itself.

Rows are generated deterministically from a seed (:func:`make_arithmetic_rows`), so train and
eval splits are reproducible without shipping data.

Example::

    rows = make_arithmetic_rows(64, seed=0)
    env = ToyArithmeticEnv(rows[0])
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from agentrl.chat.types import Message, ToolCall
from agentrl.environments.base import Environment
from agentrl.environments.policy import EnvLimits
from agentrl.rewards.math import final_answer_text, math_answer_reward
from agentrl.tools import Tool, calculator
from agentrl.trajectory import Trajectory

__all__ = ["SYSTEM_PROMPT", "ArithmeticTask", "ToyArithmeticEnv", "make_arithmetic_rows"]

# Short on purpose: on CPU the prompt (system text plus the tool schema the template lists) is most of
# every sequence, so each token here is paid once per rollout and once per training forward.
SYSTEM_PROMPT = "Use the calculator, then give the answer as \\boxed{N}."


class ArithmeticTask(BaseModel):
    """One row: the question shown to the model and the exact integer answer."""

    question: str = Field(min_length=1)
    answer: str = Field(pattern=r"^-?\d+$")


def make_arithmetic_rows(n: int, *, seed: int = 0, digits: int = 3) -> list[dict[str, Any]]:
    """``n`` distinct multiplication rows ``{"question", "answer"}`` from ``seed`` (deterministic)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"make_arithmetic_rows: n={n!r}; expected an integer >= 1")
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 9:
        raise ValueError(f"make_arithmetic_rows: digits={digits!r}; expected an integer in [1, 9]")
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    if n > (hi - lo + 1) ** 2:
        raise ValueError(f"make_arithmetic_rows: n={n} exceeds the {(hi - lo + 1) ** 2} distinct {digits}-digit products")
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    rows: list[dict[str, Any]] = []
    while len(rows) < n:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rows.append({"question": f"What is {a} * {b}?", "answer": str(a * b)})
    return rows


class ToyArithmeticEnv(Environment):
    """Multiply two numbers with the ``calculator`` tool; reward 1 for the exact boxed product.

    ``system_prompt``: the system message (default :data:`SYSTEM_PROMPT`); ``None`` or ``""`` opens
    with the user question alone (the template still lists the tool).
    """

    task_type = ArithmeticTask
    tools: ClassVar[tuple[Tool, ...]] = (calculator,)
    reward_range = (0.0, 1.0)
    default_limits = EnvLimits(max_turns=3, max_tool_calls=2)

    def __init__(self, task: Any, *, system_prompt: str | None = SYSTEM_PROMPT, **kwargs: Any) -> None:
        super().__init__(task, **kwargs)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise TypeError(f"ToyArithmeticEnv(system_prompt=...): expected a string or None, got "
                            f"{type(system_prompt).__name__}")
        self.system_prompt = system_prompt

    async def reset(self) -> list[Message]:
        opening = [Message(role="user", content=self.task.question)]
        if self.system_prompt:
            opening.insert(0, Message(role="system", content=self.system_prompt))
        return opening

    def reward(self, trajectory: Trajectory) -> float:
        return math_answer_reward(final_answer_text(trajectory.messages), self.task.answer)

    def reference_reply(self, messages: Sequence[Message]) -> Message | None:
        """The winning policy: call the calculator on the question, then box what it answered."""
        results = [m for m in messages if m.role == "tool"]
        if not results:
            expression = self.task.question.removeprefix("What is ").removesuffix("?")
            return Message(role="assistant", content="",
                           tool_calls=[ToolCall("calculator", {"expression": expression}, id="call_0")])
        return Message(role="assistant", content=f"The answer is \\boxed{{{results[-1].content}}}.")
