"""The typed failures of a sandbox fleet: the machinery an episode's tools run on, not the model.

A call that cannot be served — no executor has room before its deadline, the executor (or its whole
node) was lost, an executor could not start — raises :class:`ExecutorUnavailableError` (a
:class:`~agentrl.tools.sandbox.SandboxUnavailableError`). The tools let it through instead of
turning it into an error message for the model (the model did nothing wrong), the agent loop
records it as the episode's error of kind ``sandbox_unavailable`` (``executor_lost`` for
:class:`ExecutorLostError`), and the scheduler regenerates the episode as it does for an engine
failure; it never counts as a failure of the environment under training. Both survive pickling (a
Ray actor hands them back as values).
"""

from __future__ import annotations

from typing import Literal

from agentrl.tools.sandbox.base import SandboxUnavailableError

__all__ = ["REASONS", "ExecutorLostError", "ExecutorUnavailableError", "UnavailableReason"]

UnavailableReason = Literal["queue_full", "admission_timeout", "no_executor", "start_failed", "call_deadline",
                            "executor_lost"]
REASONS: tuple[str, ...] = ("queue_full", "admission_timeout", "no_executor", "start_failed", "call_deadline",
                            "executor_lost")
"""Why a call was not served: every executor's queue was full; it waited past its admission deadline;
no executor runs (none of the labelled nodes is alive); the executors could not start; the call ran
past its own time limit plus the fleet's grace (the executor stopped answering); the executor that held
it (or the workspace it needs) is gone."""


class ExecutorUnavailableError(SandboxUnavailableError):
    """A fleet could not serve a call (``reason``: one of :data:`REASONS`; ``node``: the node, when one
    is known). The episode that made it is regenerated, not penalised."""

    def __init__(self, message: str, *, reason: UnavailableReason, node: str | None = None) -> None:
        super().__init__(message)
        self.reason: UnavailableReason = reason
        self.node = node

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), str(self), self.reason, self.node))


class ExecutorLostError(ExecutorUnavailableError):
    """The executor that held the call or the episode's workspace died (its process, or its node)."""

    def __init__(self, message: str, *, node: str | None = None, reason: UnavailableReason = "executor_lost") -> None:
        super().__init__(message, reason=reason, node=node)


def _rebuild(cls: type[ExecutorUnavailableError], message: str, reason: UnavailableReason,
             node: str | None) -> ExecutorUnavailableError:
    return cls(message, reason=reason, node=node)
