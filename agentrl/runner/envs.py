"""The ``row -> environment`` factory of a run: the config's environment (a built-in or an installed
package's by name, see :mod:`agentrl.environments.registry`, or the class the caller passes) with
``environment.options`` and an optional reward override."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from agentrl.environments.base import Environment
    from agentrl.proxy.adapter import AgentEpisode
    from agentrl.rewards.types import RewardValue
    from agentrl.rollout.context import ContextPolicy
    from agentrl.runner.config import RunConfig
    from agentrl.trajectory import Trajectory

__all__ = ["BUILTIN_ENVIRONMENTS", "EnvFactory", "EnvironmentClass", "RowFactory", "environment_factory"]

EnvironmentClass = Callable[..., "Environment | AgentEpisode"]
"""What a run builds its episodes with: an :class:`~agentrl.environments.Environment` subclass or any
callable ``(row, **options) -> environment`` (an :class:`~agentrl.proxy.Agent` goes where an environment
goes: its :class:`~agentrl.proxy.AgentEpisode` brings its own runner)."""

RowFactory = Callable[[dict[str, Any]], "Environment"]
"""``row -> environment``: one episode's environment from one dataset row (:class:`EnvFactory`), as the
rollout layer (scheduler, evaluation) takes it."""

RewardOverride = Callable[["Trajectory", Any], "RewardValue | Awaitable[RewardValue]"]
"""``reward(trajectory, task)``, replacing the environment's own reward."""

BUILTIN_ENVIRONMENTS: tuple[str, ...] = ("toy_arithmetic", "retool_math", "long_recall", "long_key")
"""Environment names a config can use without passing ``environment=``."""


class EnvFactory:
    """``row -> environment`` with the config's options and an optional ``reward(trajectory, task)``
    replacing the environment's own. Picklable (it crosses into the rollout actor) when its parts are;
    ``task_type`` is the environment's, so the data source checks rows against it."""

    def __init__(self, cls: EnvironmentClass, options: dict[str, Any], reward: RewardOverride | None = None, *,
                 limits: Mapping[str, Any] | None = None, context: tuple[bool, ContextPolicy | None] = (False, None),
                 ) -> None:
        self.cls, self.options, self.reward = cls, options, reward
        self.task_type = getattr(cls, "task_type", None)
        self.limits = dict(limits or {})
        self.context = context  # (whether the config names a policy, the policy: None is "none")

    def __call__(self, row: dict[str, Any]) -> Environment:
        env = self.cls(row, **self.options)
        if self.reward is not None:  # on this instance only: the class keeps its own
            env.reward = _Reward(self.reward, env.task)  # type: ignore[method-assign]
        if self.limits and hasattr(env, "limits"):  # an agent's episode has none: its proxy session is its context
            env.limits = dataclasses.replace(env.limits, **self.limits)
        if self.context[0]:
            env.context_policy = self.context[1]  # type: ignore[union-attr]  # an agent's episode passes it on
        # an agent's episode is driven where an environment is (it brings its own runner: runner_for)
        return cast("Environment", env)


class _Reward:
    def __init__(self, fn: RewardOverride, task: object) -> None:
        self.fn, self.task = fn, task
        self.__wrapped__ = fn  # what a failure's origin names (agentrl._tracebacks.function_origin)

    def __call__(self, trajectory: Trajectory) -> RewardValue | Awaitable[RewardValue]:
        return self.fn(trajectory, self.task)


def environment_factory(config: RunConfig, environment: EnvironmentClass | None = None,
                        reward: RewardOverride | None = None) -> EnvFactory:
    """The factory for ``config`` (``environment`` ``None``: the one ``config.environment.name`` names
    in the registry: a built-in or an installed package's)."""
    cls = environment
    if cls is None:
        from agentrl.environments.registry import RegistryError, resolve

        try:
            cls = resolve("environment", config.environment.name)
        except RegistryError as exc:
            raise ValueError(f"environment.name: {exc}; or pass your environment class as environment=") from None
    if not callable(cls):
        raise TypeError(f"environment: expected an Environment subclass or a callable row -> environment, "
                        f"got {type(cls).__name__}")
    section = config.environment
    return EnvFactory(cls, dict(section.options), reward, limits=section.limits,
                      context=(bool(section.context), section.context_policy()))
