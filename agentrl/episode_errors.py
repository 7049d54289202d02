"""What went wrong in an episode, as values: :class:`ErrorKind`, :class:`EpisodeError`, and the
:class:`TrajectoryError` a broken trajectory or record raises. :mod:`agentrl.trajectory` re-exports all three
(the trajectory holds its episode's errors in :attr:`~agentrl.trajectory.Trajectory.errors`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrl._enum import NamedEnum

__all__ = ["EpisodeError", "ErrorKind", "TrajectoryError"]


class TrajectoryError(ValueError):
    """An append or a loaded record would break a trajectory invariant."""


class ErrorKind(NamedEnum):
    """What failed, for an :class:`EpisodeError`; the step report counts them as ``errors/<kind>``."""

    ENGINE = "engine"  # unreachable, a server error, past the deadline, or a request the engine aborted as a failure
    ENGINE_OUTPUT = "engine_output"  # an answer that breaks an invariant (no logprobs, an id outside the vocabulary)
    PROMPT_TOO_LONG = "prompt_too_long"  # the engine refused the prompt as too long (the episode is truncated)
    ENV = "env"  # the environment raised in step() or broke its contract
    PARSE = "parse"  # failure policy ``end`` on a malformed tool call
    TOOL = "tool"  # failure policy ``end`` on a tool that raised or timed out
    SANDBOX = "sandbox"  # failure policy ``end`` on a sandbox failure
    BRIDGE = "bridge"  # the chat template rejected the conversation
    CONTEXT = "context"  # a context policy raised or returned a conversation that cannot start a sequence
    REWARD = "reward"  # the reward function raised or returned no number
    REWARD_TIMEOUT = "reward_timeout"  # the reward function ran past its deadline
    # an agent harness behind the proxy (agentrl.proxy): its run() raised, ran past its deadline, sent a
    # request the proxy refused, or called its session after the episode closed
    AGENT = "agent"
    AGENT_TIMEOUT = "agent_timeout"
    AGENT_REQUEST = "agent_request"
    AGENT_LATE_CALL = "agent_late_call"
    # a sandbox fleet (agentrl.tools.fleet) could not serve a tool call or a reward's command: no executor had
    # room before the deadline, or none could start; or the executor holding the episode's workspace (or its
    # node) was lost. The machinery's failures, not the environment's: the scheduler regenerates the episode
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    EXECUTOR_LOST = "executor_lost"

    @property
    def infrastructure(self) -> bool:
        """A failure of the machinery an episode runs on (the engine; a sandbox fleet without room, or
        with a lost executor or node), not of the code under training (environment, agent harness,
        reward): the scheduler regenerates such an episode, and it never counts toward
        ``SchedulerConfig.max_consecutive_failed_groups``. A kind added for another part of the
        machinery belongs in this set too."""
        return self in _INFRASTRUCTURE


_INFRASTRUCTURE = frozenset({ErrorKind.ENGINE, ErrorKind.ENGINE_OUTPUT, ErrorKind.SANDBOX_UNAVAILABLE,
                             ErrorKind.EXECUTOR_LOST})


@dataclass(frozen=True)
class EpisodeError:
    """One thing that went wrong in an episode, as a value (never raised): picklable, JSON round-tripped.

    ``turn`` is the number of model turns its sequence held when it happened (0: before the first answer);
    ``component`` names the part that failed (``generate``, ``step``, ``bridge``, ``reward``,
    ``endpoint``, ``scheduler``, or the tool's name); ``tool_call_id`` the call, when one did;
    ``origin`` where the user's code raised it, ``path:line in function`` (for a reward that returned
    no number, where the reward function is defined; :mod:`agentrl._tracebacks`), when known.
    """

    kind: ErrorKind
    message: str
    turn: int | None = None
    component: str | None = None
    tool_call_id: str | None = None
    origin: str | None = field(default=None, compare=False)  # diagnostic: errors are equal wherever raised

    @property
    def where(self) -> str:
        """``turn 2 · step · call c1``: the known parts of where it happened ("-" when none is)."""
        parts = [f"turn {self.turn}" if self.turn is not None else None, self.component,
                 f"call {self.tool_call_id}" if self.tool_call_id is not None else None]
        return " · ".join(p for p in parts if p) or "-"

    def __str__(self) -> str:
        return f"{self.kind.value} error ({self.where}): {self.message}"

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind.value, "message": self.message, "turn": self.turn, "component": self.component,
               "tool_call_id": self.tool_call_id}
        if self.origin is not None:
            out["origin"] = self.origin
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeError:
        try:
            turn = data.get("turn")
            return cls(kind=ErrorKind(data["kind"]), message=str(data["message"]),
                       turn=int(turn) if turn is not None else None, component=data.get("component"),
                       tool_call_id=data.get("tool_call_id"), origin=data.get("origin"))
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise TrajectoryError(f"errors entry: expected kind/message, got {data!r:.200} ({exc})") from exc
