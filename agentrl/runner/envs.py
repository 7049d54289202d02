"""The ``row -> environment`` factory of a run: the config's environment (a built-in or an installed
package's by name, see :mod:`agentrl.environments.registry`, or the class the caller passes) with
``environment.options`` and an optional reward override."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.runner.config import RunConfig

__all__ = ["BUILTIN_ENVIRONMENTS", "EnvFactory", "environment_factory"]

BUILTIN_ENVIRONMENTS: tuple[str, ...] = ("toy_arithmetic", "retool_math")
"""Environment names a config can use without passing ``environment=``."""


class EnvFactory:
    """``row -> environment`` with the config's options and an optional ``reward(trajectory, task)``
    replacing the environment's own. Picklable (it crosses into the rollout actor) when its parts are;
    ``task_type`` is the environment's, so the data source checks rows against it."""

    def __init__(self, cls: Any, options: dict[str, Any], reward: Callable[..., Any] | None = None) -> None:
        self.cls, self.options, self.reward = cls, options, reward
        self.task_type = getattr(cls, "task_type", None)

    def __call__(self, row: dict[str, Any]) -> Any:
        env = self.cls(row, **self.options)
        if self.reward is not None:
            env.reward = _Reward(self.reward, env.task)
        return env


class _Reward:
    def __init__(self, fn: Callable[..., Any], task: Any) -> None:
        self.fn, self.task = fn, task

    def __call__(self, trajectory: Any) -> Any:
        return self.fn(trajectory, self.task)


def environment_factory(config: RunConfig, environment: Any = None,
                        reward: Callable[..., Any] | None = None) -> EnvFactory:
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
    return EnvFactory(cls, dict(config.environment.options), reward)
