"""GRPO groups: G independent environments for one dataset row.

Each member is a fresh instance built from its own deep copy of the row, so members share no
mutable state (a tool's per-episode state, the task object, counters). The row itself is never
modified. Tools registered as class attributes are shared objects by design (e.g. one warm
sandbox pool); they must not keep per-episode state.

Example::

    envs = make_group(ToyArithmeticEnv, row, size=8)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from agentrl.environments.base import Environment

__all__ = ["EnvGroup", "make_group"]

EnvFactory = Callable[[Any], Environment]


@dataclass
class EnvGroup:
    """The environments of one prompt group, with the group id their trajectories carry."""

    envs: list[Environment]
    group_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __len__(self) -> int:
        return len(self.envs)


def make_group(factory: EnvFactory, row: Mapping[str, Any] | BaseModel, size: int,
               *, group_id: str | None = None) -> EnvGroup:
    """Builds ``size`` independent environments for ``row`` with ``factory`` (a class or callable)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"make_group: size={size!r}; expected an integer >= 1")
    envs = [factory(row) for _ in range(size)]
    for i, env in enumerate(envs):
        if not isinstance(env, Environment):
            raise TypeError(f"make_group: factory returned {type(env).__name__} for member {i}; expected an Environment")
    if len({id(e) for e in envs}) != size or len({id(e.task) for e in envs}) != size:
        raise ValueError("make_group: the factory returned shared instances or a shared task object; "
                         "expected a fresh environment with its own copy of the row per member")
    return EnvGroup(envs=envs, group_id=group_id or uuid.uuid4().hex)
