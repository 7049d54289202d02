"""Environments: the Environment base class and ready environments (installed as ``agentrl.environments``)."""

from agentrl.environments.base import Environment, EpisodeDoneError, StepResult, ToolLike, tool_spec
from agentrl.environments.group import EnvGroup, make_group
from agentrl.environments.policy import EnvLimits, FailureAction, FailurePolicy

__all__ = [
    "EnvGroup",
    "EnvLimits",
    "Environment",
    "EpisodeDoneError",
    "FailureAction",
    "FailurePolicy",
    "StepResult",
    "ToolLike",
    "make_group",
    "tool_spec",
]
