"""What the agent loop asks of an inference client (:class:`GenerateClient`), the sampling of one request
(:func:`request_sampling`) and request ids (:func:`new_id`); :mod:`agentrl.rollout.agent` re-exports them."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Protocol

from agentrl.rollout.types import GenerateResult, RoutingShape, SamplingParams

__all__ = ["GenerateClient", "new_id", "request_sampling"]


def new_id() -> str:
    """A random 128-bit hex id (request, rollout and session ids): ``uuid4().hex`` without the UUID object."""
    return os.urandom(16).hex()


def request_sampling(base: SamplingParams, budget: int, stops: tuple[int, ...]) -> SamplingParams:
    """``base`` with a turn's budget and stop ids; memoised, since every episode of a run asks the same."""
    try:
        return _request_sampling(base, budget, stops)
    except TypeError:  # a SamplingParams holding an unhashable value
        return base.replace(max_new_tokens=budget, stop_token_ids=stops)


@functools.lru_cache(maxsize=1024)
def _request_sampling(base: SamplingParams, budget: int, stops: tuple[int, ...]) -> SamplingParams:
    return base.replace(max_new_tokens=budget, stop_token_ids=stops)


class GenerateClient(Protocol):
    """What the agent loop needs of an inference client (:class:`agentrl.rollout.client.InferenceClient` fits).
    ``routed_experts`` and ``routed_experts_start`` are passed only when the loop asks for routing
    (``AgentConfig.routed_experts``), so a client that cannot return it need not take them."""

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str | None = None,
                       routing_key: str | None = None, routed_experts: RoutingShape | None = None,
                       routed_experts_start: int = 0) -> GenerateResult: ...
