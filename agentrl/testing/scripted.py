"""A scripted policy: a fake inference client that "samples" pre-written replies, for unit tests.

:class:`ScriptedClient` has the ``generate`` signature of the real client
(:class:`agentrl.rollout.client.InferenceClient`) and answers with
:class:`~agentrl.rollout.types.GenerateResult` objects built the way an engine builds them:

- the reply text is encoded to ids once (this is the "sampling"); each id gets a logprob;
- generation stops *at and including* the first id in ``sampling.stop_token_ids`` (finish
  ``stop``, ``matched`` = that id), or after ``sampling.max_new_tokens`` ids (finish ``length``);
- a turn scripted with ``finish="abort"`` returns what it has with finish ``abort``.

Every request is recorded in :attr:`ScriptedClient.requests` so tests can check what the agent
sent (input ids, the budget it asked for, the routing key). Use only in tests; the integration
tests run the same agent loop against a real SGLang server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.rollout.types import FinishKind, FinishReason, GenerateResult, SamplingParams

__all__ = ["ScriptedClient", "ScriptedRequest", "ScriptedTurn"]


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


Script = Sequence[str | ScriptedTurn | Callable[[Sequence[int]], str | ScriptedTurn]]


class ScriptedClient:
    """Answers ``generate`` calls with the next scripted turn; raises when the script runs out."""

    def __init__(self, tokenizer: Any, script: Script) -> None:
        self.tokenizer = tokenizer
        self.script = list(script)
        self.requests: list[ScriptedRequest] = []
        self.aborted: list[str] = []

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str | None = None,
                       routing_key: str | None = None, **_: Any) -> GenerateResult:
        turn_no = len(self.requests)
        self.requests.append(ScriptedRequest(tuple(input_ids), sampling, rid, routing_key))
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
        return GenerateResult(rid=rid or f"scripted-{turn_no}", output_ids=tuple(ids), output_logprobs=logprobs,
                              finish_reason=finish, weight_version=turn.weight_version,
                              prompt_tokens=len(input_ids), cached_tokens=0, completion_tokens=len(ids),
                              text=self.tokenizer.decode(ids, skip_special_tokens=False))

    async def abort(self, rid: str) -> None:
        self.aborted.append(rid)
