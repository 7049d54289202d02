"""Reward values and the reward-function protocols, sync or async, per trajectory or per group.

A reward function takes what it scores and returns a ``float`` or a :class:`Reward` (a value with
named parts), either directly or as an awaitable. :func:`score` and :func:`score_group` call any
of these shapes the same way, with a deadline, and always return :class:`Reward` objects. A reward
never runs on the caller's event loop (one pathological answer must not stall every rollout):

- an ``async`` function is awaited within the deadline;
- a sync function that pickles (a module-level function, a ``functools.partial`` of one, a
  picklable callable object) runs in a :class:`~agentrl.rewards.pool.RewardPool` worker process
  when :func:`score` is given one: past the deadline the worker is killed (a hard deadline);
- any other sync function (a method of an environment, a closure) runs in a reward thread: past the
  deadline the wait ends, while the thread finishes on its own (a thread cannot be killed; put the
  CPU-heavy part in the pool, as :class:`~agentrl.rewards.math.MathReward`'s comparisons are).

Past its deadline a call raises :class:`~agentrl.rewards.pool.RewardTimeout`.

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
import pickle
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from agentrl._tracebacks import function_origin
from agentrl.rewards.pool import RewardTimeout

if TYPE_CHECKING:
    from agentrl.rewards.pool import RewardPool

__all__ = ["GroupRewardFn", "Reward", "RewardFn", "RewardTimeout", "RewardValue", "RewardValueError", "as_reward", "score",
           "score_group"]

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


class RewardValueError(TypeError, ValueError):
    """A reward function returned something that is not a number or :class:`Reward`. ``origin``: where
    that function is defined (``path:line in name``), when known: no traceback points at a return value."""

    def __init__(self, message: str, *, origin: str | None = None) -> None:
        super().__init__(message)
        self.origin = origin


def as_reward(value: object, *, where: str = "reward", origin: str | None = None) -> Reward:
    """Normalises a reward function's return value; anything but a finite number or Reward raises
    :class:`RewardValueError` (a ``TypeError``) naming the value and its type (``origin``: see there)."""
    if isinstance(value, Reward):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardValueError(f"{where}: expected a float or Reward, got {type(value).__name__}: {value!r:.200}",
                               origin=origin)
    try:
        return Reward(float(value))
    except ValueError as exc:  # not finite
        raise RewardValueError(f"{where}: {exc}", origin=origin) from None


# sync reward functions that cannot go to a worker process: their own threads, so one that never
# returns holds a reward thread, never the loop's default executor
_THREADS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="agentrl-reward")


def _is_async(fn: Callable[..., Any]) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    call = None if inspect.isfunction(fn) or inspect.ismethod(fn) else vars(type(fn)).get("__call__")
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))


def _pickles(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can run in a worker process: not a bound method (an environment's state stays
    with the environment), and it pickles."""
    if inspect.ismethod(fn):
        return False
    try:
        pickle.dumps(fn)
    except Exception:  # any object can refuse to pickle in its own way
        return False
    return True


async def _call(fn: Callable[..., Any], item: Any, timeout_s: float | None, pool: RewardPool | None) -> Any:
    """``fn(item)`` off the event loop, within ``timeout_s`` (see the module doc)."""
    loop = asyncio.get_running_loop()
    if _is_async(fn):
        work: Awaitable[Any] = fn(item)
    elif pool is not None and _pickles(fn):
        return await pool.run(fn, item, timeout_s=timeout_s)
    else:
        work = loop.run_in_executor(_THREADS, fn, item)
    started = loop.time()
    try:
        result = await asyncio.wait_for(work, timeout_s)
        if inspect.isawaitable(result):  # a sync callable that returned an awaitable
            left = None if timeout_s is None else max(0.0, timeout_s - (loop.time() - started))
            result = await asyncio.wait_for(result, left)
    except TimeoutError:
        raise RewardTimeout(f"{_name(fn)} ran past its deadline of {timeout_s:g} s") from None
    return result


async def score(fn: RewardFn, item: Any, *, timeout_s: float | None = None, pool: RewardPool | None = None) -> Reward:
    """Calls a per-trajectory reward function (sync or async) off the event loop and normalises its
    result; raises :class:`~agentrl.rewards.pool.RewardTimeout` past ``timeout_s`` (module doc)."""
    value = await _call(fn, item, timeout_s, pool)
    if isinstance(value, Reward) or (isinstance(value, int | float) and not isinstance(value, bool)
                                     and math.isfinite(value)):
        return as_reward(value)
    return as_reward(value, where=f"{_name(fn)} result", origin=function_origin(fn))


async def score_group(fn: GroupRewardFn, items: Sequence[Any], *, timeout_s: float | None = None,
                      pool: RewardPool | None = None) -> list[Reward]:
    """Calls a per-group reward function and checks it returned exactly one value per member."""
    values = await _call(fn, items, timeout_s, pool)
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TypeError(f"{_name(fn)} result: expected a sequence of {len(items)} rewards, got {type(values).__name__}")
    if len(values) != len(items):
        raise ValueError(f"{_name(fn)} result: expected {len(items)} rewards (one per group member), got {len(values)}")
    return [as_reward(v, where=f"{_name(fn)} result[{i}]", origin=function_origin(fn)) for i, v in enumerate(values)]


def _name(fn: Callable[..., object]) -> str:
    fn = getattr(fn, "__wrapped__", None) or fn  # an adapter that names the function it calls
    return getattr(fn, "__qualname__", None) or type(fn).__name__
