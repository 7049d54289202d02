"""Deliberately broken environments: each breaks exactly one contract that ``agentrl env check`` verifies.

Also used by the CLI test as ``module:Class`` targets.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel

from agentrl.chat.types import Message, ToolCallFailure
from agentrl.environments.base import Environment, StepResult
from agentrl.rewards import final_answer_text, math_answer_reward
from agentrl.tools import tool
from agentrl.trajectory import StopReason, Trajectory


class EchoTool:
    name = "echo"
    description = "Echo the text back."
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {"text": {"type": "string"}},
                                            "required": ["text"]}

    async def __call__(self, **arguments: Any) -> str:
        return str(arguments["text"])


class GoodEnv(Environment):
    """A correct environment: the baseline every check passes on."""

    tools = (EchoTool(),)

    async def reset(self) -> list[Message]:
        return [Message(role="user", content=f"Say {self.task['answer']}.")]

    def reward(self, trajectory: Trajectory) -> float:
        return math_answer_reward(final_answer_text(trajectory.messages), str(self.task["answer"]))

    def reference_reply(self, messages: Sequence[Message]) -> Message | None:
        answer = self.task["answer"] if isinstance(self.task, dict) else self.task.answer
        return Message(role="assistant", content=f"\\boxed{{{answer}}}")  # the winning answer


class SharedStateEnv(GoodEnv):
    history: ClassVar[list[str]] = []  # class-level and mutated: leaks from one episode into the next

    async def reset(self) -> list[Message]:
        self.history.append("episode")
        return [Message(role="user", content=f"Episode number {len(self.history)}.")]


class RowMutatingEnv(GoodEnv):
    def __init__(self, task: Any, **kw: Any) -> None:
        super().__init__(task, **kw)
        self.raw = task  # keeps the caller's row instead of the copy

    async def reset(self) -> list[Message]:
        self.raw["seen"] = True
        return await super().reset()


class StepAfterDoneEnv(GoodEnv):
    async def step(self, reply: Message, failures: Any = ()) -> StepResult:
        self.turns += 1  # overrides step without the done guard
        return StepResult(done=True, stop_reason=StopReason.NO_TOOL_CALLS)


class UnpicklableEnv(GoodEnv):
    def __init__(self, task: Any, **kw: Any) -> None:
        super().__init__(task, **kw)
        self.lock = threading.Lock()


LEAKED: list[subprocess.Popen[bytes]] = []  # for the test's cleanup only


class LeakyEnv(GoodEnv):
    async def reset(self) -> list[Message]:
        LEAKED.append(subprocess.Popen(["sleep", "10"]))  # never stopped in close()
        return await super().reset()


class OutOfRangeEnv(GoodEnv):
    def reward(self, trajectory: Trajectory) -> float:
        return 5.0


class RaisingEnv(GoodEnv):
    async def step(self, reply: Message, failures: Any = ()) -> StepResult:
        if reply.tool_calls or failures:
            raise KeyError("tool output missing")
        return await super().step(reply, failures)


class EndlessEnv(GoodEnv):
    async def step(self, reply: Message, failures: Any = ()) -> StepResult:
        self._begin_step()
        return StepResult(messages=[Message(role="user", content="keep going")])


class NotMessagesEnv(GoodEnv):
    async def reset(self) -> list[Message]:
        return ["just a string"]  # type: ignore[list-item]


class SyncResetEnv(GoodEnv):
    def reset(self) -> list[Message]:  # type: ignore[override]  # the mistake under test: not async
        return [Message(role="user", content="Say 3.")]


class AssistantOpeningEnv(GoodEnv):
    async def reset(self) -> list[Message]:
        return [Message(role="user", content="Say 3."), Message(role="assistant", content="3")]


class BrokenTool(EchoTool):
    name = "broken"

    async def __call__(self, **arguments: Any) -> str:
        raise RuntimeError("the backing service is down")


class AlwaysRaisingToolEnv(GoodEnv):
    tools = (EchoTool(), BrokenTool())


class Answer(BaseModel):
    answer: int


class TypedRowEnv(GoodEnv):
    task_type = Answer

    async def reset(self) -> list[Message]:
        return [Message(role="user", content=f"Say {self.task.answer}.")]

    def reward(self, trajectory: Trajectory) -> float:
        return math_answer_reward(final_answer_text(trajectory.messages), str(self.task.answer))


@tool
def lookup(key: str) -> str:
    """Looks a key up, and forgets to return what it found.

    Args:
        key: What to look up.
    """
    _ = key.upper()  # the mistake under test: no `return`


class NoneToolEnv(GoodEnv):
    tools = (EchoTool(), lookup)


# reward functions ``(trajectory, task) -> float`` for ``--reward``: one correct, three broken
def reward_ok(trajectory: Trajectory, task: Any) -> float:
    return math_answer_reward(final_answer_text(trajectory.messages), str(task["answer"]))


def reward_none_without_answer(trajectory: Trajectory, task: Any) -> float | None:
    text = final_answer_text(trajectory.messages)
    return None if "\\boxed" not in text else math_answer_reward(text, str(task["answer"]))


def reward_raises(trajectory: Trajectory, task: Any) -> float:
    return float(task["label"])  # KeyError: the rows have no 'label'


async def reward_nan(trajectory: Trajectory, task: Any) -> float:
    return float("nan")


__all__ = ["EchoTool", "GoodEnv", "ToolCallFailure"]
