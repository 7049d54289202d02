"""The health monitor's settings, :class:`HealthConfig`, apart from the monitor (:mod:`agentrl.rollout.health`),
whose HTTP client a run config that only validates them need not import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from annotated_types import Ge, Gt

from agentrl._limits import check_limits

__all__ = ["HealthConfig"]


@dataclass(frozen=True)
class HealthConfig:
    """Monitor settings. ``http_checks`` adds HTTP probes to the process check (needed to notice a hung
    or an attached engine): ``/health_generate`` (a one-token generation when the engine is idle), or
    ``/health`` with ``http_generate=False`` (no request that shows in the engine's load; SGLang's own
    watchdog ends a scheduler stuck in a batch, which the process check then sees). ``max_restarts``
    bounds restarts per engine. ``unavailable_wait_s``: how long a request of the group's clients keeps
    retrying while no engine can take it (``None``: whoever builds the client decides; a run uses the
    engines' start-up timeout plus a minute when restarts are on, so a restart loses no episode)."""

    check_interval_s: Annotated[float, Gt(0.0)] = 1.0
    http_checks: bool = True
    http_generate: bool = True
    http_timeout_s: Annotated[float, Gt(0.0)] = 30.0
    failure_threshold: Annotated[int, Ge(1)] = 3
    restart: bool = True
    max_restarts: Annotated[int, Ge(0)] = 3
    unavailable_wait_s: Annotated[float, Ge(0.0)] | None = None

    def __post_init__(self) -> None:
        check_limits(self)
