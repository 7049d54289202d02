"""Prompt groups as the scheduler hands them out, and dynamic-sampling filters.

A :class:`RolloutGroup` is the G episodes of one prompt (one :class:`~agentrl.rollout.agent.Episode`
per rollout; an episode that forked has several sequences that share its rollout id). Group
statistics count each rollout once: :attr:`RolloutGroup.rewards` has one entry per episode, never
one per sequence, so fan-out never changes a filter's decision or GRPO's centring.

A filter is any callable ``group -> FilterResult`` (or a plain bool); :func:`drop_uniform_rewards`
is the built-in one (a group whose rewards are all equal has zero advantage everywhere). Both live in
:mod:`agentrl.rewards.filters` (import them from :mod:`agentrl.rewards`), below both this package and the
name registry of environments; ``agentrl.rollout.groups.FilterResult`` and ``.drop_uniform_rewards``
(and the same names of :mod:`agentrl.rollout`) are deprecated aliases, kept for one release.

Example::

    from agentrl.rewards import FilterResult

    def at_least_one_tool_call(group: RolloutGroup) -> FilterResult:
        ok = any(ep.trajectory.metrics.get("tool_calls", 0) for ep in group.episodes)
        return FilterResult.accept() if ok else FilterResult.reject("no_tool_calls")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl._deprecated import moved_names
from agentrl.rewards.filters import FilterResult as _FilterResult
from agentrl.rollout.agent import Episode
from agentrl.trajectory import SegmentKind, Trajectory

if TYPE_CHECKING:  # the moved names, for type checkers; at runtime __getattr__ serves them with a warning
    from agentrl.rewards.filters import FilterResult as FilterResult
    from agentrl.rewards.filters import drop_uniform_rewards as drop_uniform_rewards

__all__ = ["GroupFilter", "RolloutGroup", "version_number"]

__getattr__ = moved_names(__name__, {"FilterResult": "agentrl.rewards", "drop_uniform_rewards": "agentrl.rewards"})


def version_number(version: str | None) -> int | None:
    """A weight version as an integer (the runner stamps ``"0"``, ``"1"``, ...); None when not a number."""
    if version is None:
        return None
    text = version.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    return None


@dataclass
class RolloutGroup:
    """The episodes of one prompt, as gathered for a training step.

    ``prompt_id`` names the dataset row (stable across runs), ``row`` is its data, ``lost`` counts
    members that failed for infrastructure reasons even after regeneration (the group is then
    normalised over the members that finished), ``regenerated`` counts the retries it took.
    """

    group_id: str
    prompt_id: str
    row: dict[str, Any]
    episodes: list[Episode]
    epoch: int = 0
    lost: int = 0
    regenerated: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def rewards(self) -> list[float]:
        """One reward per rollout (episodes without a reward count as 0.0)."""
        return [float(ep.reward) if ep.reward is not None else 0.0 for ep in self.episodes]

    def trajectories(self) -> list[Trajectory]:
        """Every training sequence of the group (forks included)."""
        return [seq for ep in self.episodes for seq in ep.sequences]

    def weight_versions(self) -> list[int]:
        """The numeric weight versions of the group's trainable model spans."""
        out: list[int] = []
        for traj in self.trajectories():
            for seg in traj.segments:
                if seg.kind is SegmentKind.MODEL and seg.trainable:
                    v = version_number(seg.weight_version)
                    if v is not None:
                        out.append(v)
        return out

    def response_tokens(self) -> int:
        return sum(t.response_length for t in self.trajectories())


GroupFilter = Callable[[RolloutGroup], "_FilterResult | bool"]
"""A dynamic-sampling filter: ``group -> FilterResult`` (:class:`agentrl.rewards.FilterResult`) or a bool."""


def apply_filter(fn: GroupFilter | None, group: RolloutGroup) -> _FilterResult:
    """Runs ``fn`` on ``group``; a bool is a verdict too, an exception is a rejection that names it."""
    if fn is None:
        return _FilterResult.accept()
    try:
        verdict = fn(group)
    except Exception as exc:
        return _FilterResult.reject(f"filter_error: {type(exc).__name__}: {exc}")
    if isinstance(verdict, _FilterResult):
        return verdict
    if isinstance(verdict, bool):
        return _FilterResult.accept() if verdict else _FilterResult.reject(getattr(fn, "__name__", "filter"))
    return _FilterResult.reject(f"filter_error: the filter returned {type(verdict).__name__}; expected a "
                                "FilterResult or a bool")
