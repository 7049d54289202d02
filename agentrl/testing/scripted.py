"""A scripted policy: a fake inference client that "samples" pre-written replies, for unit tests.

:class:`ScriptedClient` has the ``generate`` signature of the real client
(:class:`agentrl.rollout.client.InferenceClient`) and answers with
:class:`~agentrl.rollout.types.GenerateResult` objects built the way an engine builds them:

- the reply text is encoded to ids once (this is the "sampling"); each id gets a logprob;
- generation stops *at and including* the first id in ``sampling.stop_token_ids`` (finish
  ``stop``, ``matched`` = that id), or after ``sampling.max_new_tokens`` ids (finish ``length``);
- a turn scripted with ``finish="abort"`` returns what it has with finish ``abort``.

Every request is recorded in :attr:`ScriptedClient.requests` so tests can check what the agent
sent (input ids, the budget it asked for, the routing key, where it asked the routing to start).
Asked for mixture-of-experts routing (``routed_experts=``), it answers as an engine does: rows for
positions ``[routed_experts_start, prompt + completion - 1)``, each a function of the token at that
position alone (:func:`scripted_routing`), so a test knows what every position should hold. Use only
in tests; the integration tests run the same agent loop against a real SGLang server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.rollout.types import FinishKind, FinishReason, GenerateResult, RoutingShape, SamplingParams

__all__ = ["ScriptedClient", "ScriptedRequest", "ScriptedTurn", "scripted_routing"]


def scripted_routing(tokens: Sequence[int], shape: RoutingShape) -> np.ndarray:
    """``[len(tokens), layers, top_k]``: the routing the scripted engine gives each token (distinct experts
    per layer, a function of the token id and the layer only)."""
    ids = np.asarray(tokens, dtype=np.int64)[:, None, None]
    layer = np.arange(shape.layers)[None, :, None]
    slot = np.arange(shape.top_k)[None, None, :]
    rows: np.ndarray = ((ids + 3 * layer + slot) % shape.experts).astype(shape.dtype)
    return rows


@dataclass(frozen=True)
class ScriptedTurn:
    """One scripted model turn: its text, how it ends, and optionally its own logprobs."""

    text: str
    finish: str = "stop"
    logprob: float = -0.25
    delay_s: float = 0.0
    weight_version: str | None = "0"
    drop_logprobs: bool = False  # simulate an engine answer that lacks output_token_logprobs


@dataclass(frozen=True)
class ScriptedRequest:
    input_ids: tuple[int, ...]
    sampling: SamplingParams
    rid: str | None
    routing_key: str | None
    routed_experts_start: int | None = None  # None: no routing asked for


Script = Sequence[str | ScriptedTurn | Callable[[Sequence[int]], str | ScriptedTurn]]


class ScriptedClient:
    """Answers ``generate`` calls with the next scripted turn; raises when the script runs out."""

    def __init__(self, tokenizer: Any, script: Script) -> None:
        self.tokenizer = tokenizer
        self.script = list(script)
        self.requests: list[ScriptedRequest] = []
        self.aborted: list[str] = []

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str | None = None,
                       routing_key: str | None = None, routed_experts: RoutingShape | None = None,
                       routed_experts_start: int = 0, **_: Any) -> GenerateResult:
        turn_no = len(self.requests)
        self.requests.append(ScriptedRequest(tuple(input_ids), sampling, rid, routing_key,
                                             routed_experts_start if routed_experts is not None else None))
        if turn_no >= len(self.script):
            raise RuntimeError(f"ScriptedClient: the script has {len(self.script)} turns; turn {turn_no + 1} was requested")
        entry = self.script[turn_no]
        if callable(entry) and not isinstance(entry, ScriptedTurn):
            entry = entry(input_ids)
        turn = entry if isinstance(entry, ScriptedTurn) else ScriptedTurn(entry)
        if turn.delay_s:
            await asyncio.sleep(turn.delay_s)
        ids = list(self.tokenizer.encode(turn.text, add_special_tokens=False))
        finish = FinishReason(FinishKind(turn.finish))
        if finish.kind is not FinishKind.ABORT:
            for i, t in enumerate(ids):
                if t in sampling.stop_token_ids:
                    ids, finish = ids[: i + 1], FinishReason(FinishKind.STOP, matched=t)
                    break
            if len(ids) > sampling.max_new_tokens:
                ids, finish = ids[: sampling.max_new_tokens], FinishReason(FinishKind.LENGTH)
        logprobs = () if turn.drop_logprobs else tuple(turn.logprob for _ in ids)
        routing = None
        if routed_experts is not None:  # every position up to the last sampled token's, from the start asked
            sequence = [*input_ids, *ids][routed_experts_start: len(input_ids) + len(ids) - 1]
            routing = scripted_routing(sequence, routed_experts)
        return GenerateResult(rid=rid or f"scripted-{turn_no}", output_ids=tuple(ids), output_logprobs=logprobs,
                              finish_reason=finish, weight_version=turn.weight_version,
                              prompt_tokens=len(input_ids), cached_tokens=0, completion_tokens=len(ids),
                              text=self.tokenizer.decode(ids, skip_special_tokens=False),
                              routed_experts=routing, routed_experts_start=routed_experts_start)

    async def abort(self, rid: str) -> None:
        self.aborted.append(rid)
