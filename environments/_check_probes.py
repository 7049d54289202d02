"""Probes of ``agentrl env check`` (:mod:`agentrl.environments.conformance`), kept apart from the
episode driver: what a tool's function returned, whether a reward function gives a number, whether a
built episode would train, and the text of transcripts.

- :class:`ReturnWatch` stands in for one of an episode's tools and notes each call whose function
  returned ``None``: the model is shown ``""`` (``@tool``) or ``"None"`` (a hand-written tool), which
  is almost always a forgotten ``return``.
- :func:`reward_problem` calls a reward function ``(trajectory, task) -> float`` once and says what
  is wrong with the outcome (raised, too slow, ``None``, not a number, not finite), or ``None``.
- :func:`training_problem` says why an episode (token trajectories, as an agent's proxy builds them)
  would not enter a training batch, or ``None``: the one place the checks reach the trainer's batching.
- transcript and report text: :func:`message_text` / :func:`conversation_text` (a message, messages,
  as lines), :func:`at` (where the user's code raised an exception), :func:`describe_process`;
  :func:`is_reaper` tells agentrl's own reaper process from an episode's.

Example::

    problem = await reward_problem(my_reward, trajectory, env.task)   # "returned None (...)" or None
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from agentrl._tracebacks import exception_origin
from agentrl.chat.types import Message
from agentrl.rewards.types import Reward
from agentrl.tools.base import Tool, ToolResult

__all__ = ["ReturnWatch", "at", "conversation_text", "describe_process", "is_reaper", "message_text", "reward_problem", "training_problem"]


class ReturnWatch:
    """A :class:`~agentrl.tools.Tool` that calls ``tool`` and appends ``(name, arguments)`` to ``seen``
    for each call whose function returned ``None``; the result passes through unchanged."""

    def __init__(self, tool: Tool, seen: list[tuple[str, dict[str, Any]]]) -> None:
        self.tool, self.seen = tool, seen
        self.name, self.description, self.parameters = tool.name, tool.description, tool.parameters

    async def __call__(self, **arguments: Any) -> ToolResult:
        result: Any = await self.tool(**arguments)
        if result is None or (isinstance(result, ToolResult) and result.metrics.get("returned_none")):
            self.seen.append((self.name, dict(arguments)))
        return result  # type: ignore[no-any-return]  # whatever the tool gave, as the environment would see it


def at(exc: BaseException) -> str:
    """`` (at path:line in function)`` where the user's code raised ``exc``, or ``""`` (agentrl._tracebacks)."""
    origin = exception_origin(exc)
    return f" (at {origin})" if origin else ""


def message_text(message: Message, limit: int = 300) -> str:
    """One message as a transcript line: ``role: content [calls: name(arguments)...]``."""
    text = str(message.content or "").replace("\n", "\\n")
    line = f"{message.role}: {text[:limit]}{'...' if len(text) > limit else ''}"
    if message.tool_calls:
        line += " [calls: " + ", ".join(f"{c.name}({json.dumps(c.arguments, ensure_ascii=False, default=str)[:120]})"
                                        for c in message.tool_calls) + "]"
    return line


def conversation_text(messages: Sequence[Message], indent: str = "    ") -> str:
    """Messages as transcript lines, one per message."""
    return "\n".join(indent + message_text(m) for m in messages) or f"{indent}(no messages)"


async def _call(fn: Callable[..., Any], trajectory: Any, task: Any) -> Any:
    value = await asyncio.to_thread(fn, trajectory, task)  # a sync reward never runs on the loop
    return await value if inspect.isawaitable(value) else value  # an async one returns its coroutine


async def reward_problem(fn: Callable[..., Any], trajectory: Any, task: Any, *, timeout_s: float = 60.0) -> str | None:
    """What is wrong with ``fn(trajectory, task)`` as a reward, in words, or ``None`` when it returned
    a finite number or a :class:`~agentrl.rewards.Reward` with one within ``timeout_s``."""
    try:
        value = await asyncio.wait_for(_call(fn, trajectory, task), timeout_s)
    except TimeoutError:
        return f"ran past {timeout_s:g} s"
    except Exception as exc:
        return f"raised {type(exc).__name__}: {str(exc)[:200]}{at(exc)}"
    if value is None:
        return "returned None; expected a number (score an answer it cannot read too, e.g. 0.0)"
    number = value.value if isinstance(value, Reward) else value
    if isinstance(number, bool) or not isinstance(number, int | float):
        return f"returned {type(value).__name__} {value!r:.80}; expected a float or Reward"
    if not math.isfinite(number):
        return f"returned {number!r}; expected a finite number"
    return None


def training_problem(episode: Any) -> str | None:
    """Why ``episode`` (an :class:`~agentrl.episode.Episode`) would not enter a training batch, in
    words (it does not validate, or :func:`~agentrl.train.build_training_batch` refuses it), or ``None``."""
    from agentrl.train.batching import build_training_batch  # the trainer's own rule; torch on first use

    try:
        episode.validate()
        build_training_batch([episode])
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def is_reaper(pid: int) -> bool:
    """Whether ``pid`` is agentrl's own reaper process (:mod:`agentrl._reaper`): a process's, never an episode's."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"agentrl._reaper" in f.read()
    except OSError:
        return False


def describe_process(pid: int) -> str:
    """``pid N (its command line)``, for a report."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"pid {pid} ({cmd[:60]})"
