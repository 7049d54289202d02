"""Environments: the Environment base class and ready environments (installed as ``agentrl.environments``).

- :class:`Environment`, :class:`StepResult`, :class:`EnvLimits`, :class:`FailurePolicy`: the contract;
- :func:`make_group`: G independent environments for one row (a GRPO group);
- :class:`ToyArithmeticEnv`: a calculator task a tiny model can learn on CPU;
- :class:`RetoolMathEnv`: ReTool-style math with a sandboxed Python tool (Qwen3 JSON / Qwen3.5 XML);
- :func:`check_environment`: the conformance checker behind ``agentrl env check``.
"""

from agentrl.environments.arithmetic import ArithmeticTask, ToyArithmeticEnv, make_arithmetic_rows
from agentrl.environments.base import Environment, EpisodeDoneError, StepResult, ToolLike, tool_spec
from agentrl.environments.conformance import CheckReport, Violation, check_environment
from agentrl.environments.group import EnvGroup, make_group
from agentrl.environments.policy import EnvLimits, FailureAction, FailurePolicy
from agentrl.environments.retool import RETOOL_SYSTEM_PROMPT, RETOOL_TEMPLATES, MathTask, RetoolMathEnv

__all__ = [
    "RETOOL_SYSTEM_PROMPT",
    "RETOOL_TEMPLATES",
    "ArithmeticTask",
    "CheckReport",
    "EnvGroup",
    "EnvLimits",
    "Environment",
    "EpisodeDoneError",
    "FailureAction",
    "FailurePolicy",
    "MathTask",
    "RetoolMathEnv",
    "StepResult",
    "ToolLike",
    "ToyArithmeticEnv",
    "Violation",
    "check_environment",
    "make_arithmetic_rows",
    "make_group",
    "tool_spec",
]
