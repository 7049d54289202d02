"""What an episode keeps of its environment steps, for both loops that drive an environment: the token
loop (:mod:`agentrl.rollout.agent`) and the message loop against a chat-completions server
(:mod:`agentrl.rollout.endpoint`). One implementation, so both count the same things and end an
episode on a step the same way. Private to the rollout package.

- :func:`record_step`: counts a step's failures (``failures/<kind>``) and tolerated parse failures
  (``tolerated/<kind>``), sums its step-level reward parts, keeps its info, and says whether the
  step ends the episode;
- :func:`reward_total`: the episode's reward, the reward function's value plus the steps' parts;
- :func:`record_step_failure`: the error of a step that failed the episode;
- :func:`error_kind_of`: the kind of error an exception out of a step or a reward makes: the
  sandbox fleet's failures (:mod:`agentrl.tools.fleet`) are the machinery's, the rest the
  environment's (or the reward's).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Protocol

from agentrl.environments.base import StepResult
from agentrl.rewards.types import Reward
from agentrl.tools.fleet.errors import ExecutorLostError, ExecutorUnavailableError
from agentrl.trajectory import ErrorKind, StopReason, Trajectory

__all__ = ["StepBook", "error_kind_of", "record_step", "record_step_failure", "reward_total"]


class StepBook(Protocol):
    """Where a loop keeps what its steps report (the episode runner's own counters, saved with it)."""

    metrics: Counter[str]
    reward_parts: dict[str, float]
    env_info: list[dict[str, Any]]


def record_step(book: StepBook, traj: Trajectory, step: StepResult) -> StopReason | None:
    """Counts ``step`` into ``book``; returns the stop reason when it ends the episode, None when the
    episode goes on with ``step.messages``.

    A final step ends with its own stop reason (``env_done`` when it gives none); the messages it
    returned anyway are kept in ``traj.info["unsent_messages"]``, and a ``failed`` step's error is
    recorded on ``traj``. A step that goes on without messages fails the episode (the model would
    have no turn to answer).
    """
    for kind in step.failures:
        book.metrics[f"failures/{kind.value}"] += 1
    for kind in step.tolerated:
        book.metrics[f"tolerated/{kind.value}"] += 1
    for name, value in step.reward_parts.items():
        book.reward_parts[name] = book.reward_parts.get(name, 0.0) + value
    if step.info:
        book.env_info.append(dict(step.info))
    if step.done:
        if step.messages:
            traj.info["unsent_messages"] = [m.to_dict() for m in step.messages]
        if step.stop_reason is StopReason.FAILED:
            record_step_failure(traj, step)
        return step.stop_reason or StopReason.ENV_DONE
    if not step.messages:
        traj.add_error(ErrorKind.ENV, "step() returned done=False without messages; the model would have no turn "
                       "to answer", component="step")
        return StopReason.FAILED
    return None


def record_step_failure(traj: Trajectory, step: StepResult) -> None:
    """A step ended the episode as failed: records its error, or one saying the environment gave none."""
    if step.error is not None:
        turn = step.error.turn if step.error.turn is not None else traj.num_model_turns
        traj.errors.append(dataclasses.replace(step.error, turn=turn))
        return
    kinds = ", ".join(k.value for k in step.failures) or "none"
    traj.add_error(ErrorKind.ENV, f"step() ended the episode as failed without an error (failures: {kinds})",
                   component="step")


def reward_total(book: StepBook, reward: Reward) -> tuple[float, dict[str, float]]:
    """The episode's reward and its parts: the reward function's (``{"reward": value}`` when it names
    none) with the steps' shaping parts added by name."""
    parts = dict(reward.parts) or {"reward": reward.value}
    for name, value in book.reward_parts.items():
        parts[name] = parts.get(name, 0.0) + value
    return reward.value + sum(book.reward_parts.values()), parts


def error_kind_of(exc: BaseException, otherwise: ErrorKind) -> ErrorKind:
    """``executor_lost`` / ``sandbox_unavailable`` for a sandbox fleet's failure (the scheduler regenerates
    the episode), else ``otherwise`` (``env`` for a step, ``reward`` for a reward)."""
    if isinstance(exc, ExecutorLostError):
        return ErrorKind.EXECUTOR_LOST
    if isinstance(exc, ExecutorUnavailableError):
        return ErrorKind.SANDBOX_UNAVAILABLE
    return otherwise
