"""Reward values and the reward-function protocols, sync or async, per trajectory or per group.

A reward function takes what it scores and returns a ``float`` or a :class:`Reward` (a value with
named parts), either directly or as an awaitable. :func:`score` and :func:`score_group` call any
of these shapes the same way, with a deadline, and always return :class:`Reward` objects:

- per trajectory: ``fn(trajectory) -> float | Reward | Awaitable[float | Reward]``;
- per group: ``fn(trajectories) -> Sequence[float | Reward] | Awaitable[...]`` — one value per
  member, in order (a shortfall or surplus is an error, never padded).

Example::

    async def judge(traj): return 1.0 if "42" in traj.messages[-1].content else 0.0
    reward = await score(judge, traj, timeout_s=30)        # Reward(value=1.0, parts={})
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["GroupRewardFn", "Reward", "RewardFn", "RewardValue", "as_reward", "score", "score_group"]

T = TypeVar("T")


@dataclass(frozen=True)
class Reward:
    """A scalar reward with optional named parts (e.g. ``{"correct": 1.0, "tool_bonus": 0.1}``).

    ``value`` is what training uses; ``parts`` explain it and are logged. They need not sum to
    ``value`` (a part may be informational), but shaping helpers in this package keep them summing.
    """

    value: float
    parts: Mapping[str, float] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float) or not math.isfinite(self.value):
            raise ValueError(f"Reward.value: expected a finite number, got {self.value!r}")
        for name, part in self.parts.items():
            if isinstance(part, bool) or not isinstance(part, int | float) or not math.isfinite(part):
                raise ValueError(f"Reward.parts[{name!r}]: expected a finite number, got {part!r}")


RewardValue = float | Reward
RewardFn = Callable[[Any], RewardValue | Awaitable[RewardValue]]
GroupRewardFn = Callable[[Sequence[Any]], Sequence[RewardValue] | Awaitable[Sequence[RewardValue]]]


def as_reward(value: object, *, where: str = "reward") -> Reward:
    """Normalises a reward function's return value; anything but a finite number or Reward is an error."""
    if isinstance(value, Reward):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{where}: expected a float or Reward, got {type(value).__name__}: {value!r:.200}")
    return Reward(float(value))


async def _resolve(result: T | Awaitable[T], timeout_s: float | None) -> T:
    if inspect.isawaitable(result):
        return await asyncio.wait_for(result, timeout_s)
    return result


async def score(fn: RewardFn, item: Any, *, timeout_s: float | None = None) -> Reward:
    """Calls a per-trajectory reward function (sync or async) and normalises its result.

    ``timeout_s`` bounds an async function; a sync function runs inline (keep it fast, or make
    it async and offload heavy work to a thread).
    """
    return as_reward(await _resolve(fn(item), timeout_s), where=f"{_name(fn)} result")


async def score_group(fn: GroupRewardFn, items: Sequence[Any], *, timeout_s: float | None = None) -> list[Reward]:
    """Calls a per-group reward function and checks it returned exactly one value per member."""
    values = await _resolve(fn(items), timeout_s)
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TypeError(f"{_name(fn)} result: expected a sequence of {len(items)} rewards, got {type(values).__name__}")
    if len(values) != len(items):
        raise ValueError(f"{_name(fn)} result: expected {len(items)} rewards (one per group member), got {len(values)}")
    return [as_reward(v, where=f"{_name(fn)} result[{i}]") for i, v in enumerate(values)]


def _name(fn: Callable[..., object]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
