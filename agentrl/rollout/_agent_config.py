"""The agent loop's settings (:class:`AgentConfig`) and the soft deadline of environment hooks.

Re-exported by :mod:`agentrl.rollout.agent`, where the loop that reads them lives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentrl.rollout.types import RoutingShape, SamplingParams

__all__ = ["REWARD_FAILURE_POLICIES", "AgentConfig", "EnvTimeout", "env_hook"]

REWARD_FAILURE_POLICIES = ("zero", "drop_group")
_T = TypeVar("_T")


class EnvTimeout(TimeoutError):
    """An environment hook (``reset``, ``step``, ``close``) ran past ``AgentConfig.env_timeout_s``."""


async def env_hook(name: str, call: Awaitable[_T], timeout_s: float | None) -> _T:
    """Awaits an environment hook within its soft deadline: the wait ends (the episode with an ``env``
    error), but a hook blocked in synchronous code can only be abandoned, not stopped."""
    try:
        return await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        raise EnvTimeout(f"{name}() ran past its deadline of {timeout_s:g} s (rollout.agent.env_timeout_s)") from None


@dataclass(frozen=True)
class AgentConfig:
    """Settings of the agent loop.

    - ``sampling``: per-request sampling; its ``max_new_tokens`` is the per-turn cap. The loop
      sets ``max_new_tokens`` (the budget) on each request and adds the template's stop ids to
      ``stop_token_ids``.
    - ``context_length``: the engine's context window (None: only the environment's budget).
    - ``one_call_per_turn``: also stop on ``</tool_call>`` (the bridge then adds a synthetic turn close).
    - ``strict_parsing`` / ``max_calls_per_turn``: passed to the tool-call parser.
    - ``template_kwargs``: extra template variables (``enable_thinking``...), used for every render.
    - ``routing``: ``"episode"`` (default) or ``"group"``: the routing key's scope.
    - ``reward_timeout_s``: the reward's deadline (``None``: none). A reward runs off the event loop:
      an async one on it within the deadline, a sync one that pickles in the reward pool's worker
      processes (killed at the deadline) when ``reward_pool``, any other in a reward thread
      (:func:`agentrl.rewards.score`).
    - ``env_timeout_s``: the soft deadline of each environment hook (``reset``, ``step``, ``close``):
      past it the episode ends failed with an ``env`` error. Soft: hooks run in this process, and a
      hook stuck in synchronous code holds the loop until it returns (tools have hard deadlines of
      their own; the sandbox kills what runs past them).
    - ``reward_failure``: what a reward that raised, returned no number or ran past its deadline
      means for the episode. ``"zero"``: it scores 0.0 (its error is on record, counted as
      ``errors/reward`` or ``errors/reward_timeout``); ``"drop_group"``: its whole group is dropped and
      counted as failed with that reason. Never resampled: regenerating until the reward returns a
      number would select episodes by their answers.
    - ``audit``: after a ``sampled_text_differs`` turn, keep comparing the sampled history with a full
      render each turn (slower; the bridge session does this for free until then).
    - ``vocab_size``: the model's vocabulary (its embedding rows, ``config.json``'s ``vocab_size``;
      see :func:`agentrl.rollout.model_vocab_size`): the bound every sampled id is checked against
      and each trajectory's ``vocab_size``. ``None``: unknown, ids are only checked to be >= 0.
    - ``routed_experts``: the routing shape of a mixture-of-experts model
      (:meth:`RoutingShape.from_model_config`): every request asks the engine for the routing of the
      positions the sequence does not hold yet and stores it in the trajectory's ``routed_experts``
      channel (:mod:`agentrl.rollout.routing`). ``None``: no routing asked for.
    """

    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=1024))
    context_length: int | None = None
    one_call_per_turn: bool = False
    strict_parsing: bool = False
    max_calls_per_turn: int | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    routing: str = "episode"
    reward_timeout_s: float | None = 300.0
    env_timeout_s: float | None = 600.0
    reward_pool: bool = True
    reward_failure: str = "zero"
    audit: bool = False
    vocab_size: int | None = None
    routed_experts: RoutingShape | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sampling, SamplingParams):
            raise TypeError(f"AgentConfig.sampling: expected SamplingParams, got {type(self.sampling).__name__}")
        if self.sampling.max_new_tokens < 1:
            raise ValueError(f"AgentConfig.sampling.max_new_tokens: got {self.sampling.max_new_tokens}; expected >= 1")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"AgentConfig.context_length: got {self.context_length!r}; expected None or >= 2")
        if self.routing not in ("episode", "group"):
            raise ValueError(f"AgentConfig.routing: got {self.routing!r}; expected 'episode' or 'group'")
        if self.reward_failure not in REWARD_FAILURE_POLICIES:
            raise ValueError(f"AgentConfig.reward_failure: got {self.reward_failure!r}; expected one of "
                             f"{', '.join(map(repr, REWARD_FAILURE_POLICIES))}")
        if self.routed_experts is not None and not isinstance(self.routed_experts, RoutingShape):
            raise TypeError(f"AgentConfig.routed_experts: expected a RoutingShape or None, got "
                            f"{type(self.routed_experts).__name__}")
        if self.vocab_size is not None and (isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int)
                                            or self.vocab_size < 1):
            raise ValueError(f"AgentConfig.vocab_size: got {self.vocab_size!r}; expected None or an int >= 1")
