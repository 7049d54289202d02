"""Episode limits and the per-kind tool-failure policy of an environment.

Every way a model's tool use can fail has a :class:`~agentrl.chat.types.FailureKind` (parse
failures from the chat core, tool errors, timeouts and sandbox crashes from the tools). A
:class:`FailurePolicy` maps each kind to an action:

- ``feedback`` (default): an ``Error: <kind>: <detail>`` tool message goes back to the model, which
  may recover on its next turn;
- ``penalize``: the same feedback, plus ``penalty`` added to the episode's reward parts
  (``failure_penalty``). Keep it small next to the outcome reward: GRPO rescales differences;
- ``end``: the episode ends with status ``failed`` (stop reason ``failed``);
- ``record``: counted, nothing else (no message to the model, no penalty).

A *tolerated* parse failure (``ToolCallFailure.tolerated``: a defect SGLang's parser lets
through, such as text after a call or a missing ``arguments`` key, whose call still runs) is
recorded only, whatever ``default`` says: by default it changes neither the conversation nor the
reward, so training sees what serving would. Naming its kind in ``overrides`` acts on it like on
any failure of that kind.

Example::

    FailurePolicy(overrides={"malformed_json": "penalize", "sandbox_error": "end"}, penalty=-0.1)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from agentrl._enum import NamedEnum
from agentrl.chat.types import FailureKind

__all__ = ["EnvLimits", "FailureAction", "FailurePolicy"]


class FailureAction(NamedEnum):
    """What an environment does when a tool call fails."""

    FEEDBACK = "feedback"
    PENALIZE = "penalize"
    END = "end"
    RECORD = "record"


def _coerce(enum: type[Enum], value: Any, where: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        valid = ", ".join(repr(m.value) for m in enum)  # type: ignore[var-annotated]
        raise ValueError(f"{where}: got {value!r}; expected one of {valid}") from None


@dataclass(frozen=True)
class FailurePolicy:
    """Action per failure kind: ``overrides`` first, then ``default``. Strings are accepted and validated."""

    default: FailureAction | str = FailureAction.FEEDBACK
    overrides: Mapping[FailureKind | str, FailureAction | str] = field(default_factory=dict)
    penalty: float = -0.1

    def __post_init__(self) -> None:
        object.__setattr__(self, "default", _coerce(FailureAction, self.default, "FailurePolicy.default"))
        clean: dict[FailureKind, FailureAction] = {}
        for kind, action in dict(self.overrides).items():
            k = _coerce(FailureKind, kind, "FailurePolicy.overrides key")
            clean[k] = _coerce(FailureAction, action, f"FailurePolicy.overrides[{k.value!r}]")
        object.__setattr__(self, "overrides", clean)
        if self.penalty > 0:
            raise ValueError(f"FailurePolicy.penalty: got {self.penalty}; expected a value <= 0")

    def action_for(self, kind: FailureKind, *, tolerated: bool = False) -> FailureAction:
        """The action for a failure of ``kind``; a tolerated one is recorded unless ``overrides`` names its kind."""
        fallback = FailureAction.RECORD if tolerated else self.default
        return FailureAction(self.overrides.get(kind, fallback))


@dataclass(frozen=True)
class EnvLimits:
    """Per-episode limits: the budgets of a rollout, each ending it with its own stop reason.

    - ``max_turns``: model turns the environment answers (assistant replies passed to ``step``; a
      summary a context policy asks for is not one), over all of the rollout's sequences; the episode
      ends after that many (``max_turns``).
    - ``max_tool_calls``: tool calls *executed* per episode. A turn that asks for more than what is
      left runs the calls that fit and ends the episode (``max_tool_calls``); reaching the cap
      exactly still lets the model answer on its next turn.
    - ``max_context_tokens``: the context of one request: its prompt plus the reply it asks for. The
      agent loop never asks the engine for more new tokens than it leaves (the engine's own
      ``context_length`` bounds it too: the smaller wins). Without a context policy an episode is one
      sequence, so this bounds the whole episode (``context_budget`` when spent); with one
      (:mod:`agentrl.rollout.context`) each sequence of the rollout gets it anew.
    - ``max_sampled_tokens``: the tokens the model may sample in the whole rollout, summed over all
      its sequences and turns (``max_sampled_tokens`` when spent; ``None``: no cap). The per-turn
      cap is the agent's sampling ``max_new_tokens``, not an environment limit.
    """

    max_turns: int = 16
    max_tool_calls: int = 16
    max_context_tokens: int | None = None
    max_sampled_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tool_calls"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EnvLimits.{name}: got {value!r}; expected an integer >= 1")
        ctx = self.max_context_tokens
        if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 2):
            raise ValueError(f"EnvLimits.max_context_tokens: got {ctx!r}; expected None or an integer >= 2")
        sampled = self.max_sampled_tokens
        if sampled is not None and (isinstance(sampled, bool) or not isinstance(sampled, int) or sampled < 1):
            raise ValueError(f"EnvLimits.max_sampled_tokens: got {sampled!r}; expected None or an integer >= 1")
