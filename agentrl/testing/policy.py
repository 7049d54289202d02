"""An in-process fake engine with a policy: many concurrent episodes, token-by-token timing, aborts.

:class:`FakePolicyClient` has the inference client's ``generate`` / ``abort`` / ``abort_all``
methods. Each request asks ``policy(request)`` for the reply text, encodes it once (that is the
"sampling"; a policy may instead return the reply's token ids, e.g. ids no text encodes to) and
produces it at ``token_delay_s`` per token (a prompt that already ends with the first part of that
reply, a resumed turn, gets the rest), so aborts cut a turn part way and
return the tokens produced so far, as SGLang does. ``token_delay_s`` may be a function of the
request (some prompts slower than others). Stop ids and ``max_new_tokens`` are honoured;
every token gets logprob ``logprob``; every answer carries ``weight_version``. Asked for
mixture-of-experts routing (``routed_experts=``), it answers as the scripted client does
(:func:`agentrl.testing.scripted.scripted_routing`), an aborted turn included.

It is deterministic given the policy: a request's reply depends on what the policy returns for
its prompt, never on timing (only *where* an abort cuts depends on timing). Failures can be
injected per request (``fail``: return an exception to raise). Use in unit tests only; integration
tests run the same code against real SGLang.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.rollout.types import FinishKind, FinishReason, GenerateResult, RoutingShape, SamplingParams
from agentrl.testing.scripted import scripted_routing

__all__ = ["FakePolicyClient", "PolicyRequest"]


@dataclass
class PolicyRequest:
    """What the policy sees of one request."""

    input_ids: tuple[int, ...]
    sampling: SamplingParams
    rid: str
    routing_key: str | None
    tokenizer: Any
    _text: str | None = field(default=None, repr=False)
    routed_experts_start: int | None = None  # where the request asked the routing to start (None: not asked)

    @property
    def text(self) -> str:
        """The prompt decoded (special tokens kept)."""
        if self._text is None:
            self._text = self.tokenizer.decode(list(self.input_ids), skip_special_tokens=False)
        return self._text


Policy = Callable[[PolicyRequest], str | Sequence[int]]


def _continued(prompt: tuple[int, ...], reply: tuple[int, ...]) -> int:
    """How much of ``reply`` the prompt already ends with (a resumed turn continues from there)."""
    for k in range(min(len(reply) - 1, len(prompt)), 0, -1):
        if prompt[-k:] == reply[:k]:
            return k
    return 0


class FakePolicyClient:
    """See the module doc. ``running`` holds the rids being generated right now."""

    def __init__(self, tokenizer: Any, policy: Policy, *,
                 token_delay_s: float | Callable[[PolicyRequest], float] = 0.0, logprob: float = -0.5,
                 weight_version: str = "0", fail: Callable[[PolicyRequest], BaseException | None] | None = None,
                 ) -> None:
        self.tokenizer, self.policy = tokenizer, policy
        self.token_delay_s, self.logprob, self.weight_version = token_delay_s, logprob, weight_version
        self.fail = fail
        self.requests: list[PolicyRequest] = []
        self.running: set[str] = set()
        self.max_running = 0
        self.aborts: list[str] = []
        self._abort_events: dict[str, asyncio.Event] = {}
        self._encoded: dict[str, tuple[int, ...]] = {}

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str | None = None,
                       routing_key: str | None = None, routed_experts: RoutingShape | None = None,
                       routed_experts_start: int = 0, **_: Any) -> GenerateResult:
        rid = rid or uuid.uuid4().hex
        req = PolicyRequest(tuple(input_ids), sampling, rid, routing_key, self.tokenizer,
                            routed_experts_start=routed_experts_start if routed_experts is not None else None)
        self.requests.append(req)
        if self.fail is not None:
            exc = self.fail(req)
            if exc is not None:
                raise exc
        reply = self.policy(req)
        if isinstance(reply, str):
            ids = self._encoded.get(reply)
            if ids is None:
                ids = self._encoded[reply] = tuple(self.tokenizer.encode(reply, add_special_tokens=False))
        else:  # the reply's ids, verbatim
            ids = tuple(reply)
        ids = ids[_continued(req.input_ids, ids):]
        out, finish = self._cut(ids, sampling)
        delay = self.token_delay_s(req) if callable(self.token_delay_s) else self.token_delay_s
        produced, aborted = await self._produce(rid, len(out), delay)
        if aborted:
            out, finish = out[:produced], FinishReason(FinishKind.ABORT, message="aborted")
        routing = None
        if routed_experts is not None:
            routing = scripted_routing([*input_ids, *out][routed_experts_start: len(input_ids) + len(out) - 1],
                                       routed_experts)
        return GenerateResult(rid=rid, output_ids=tuple(out), output_logprobs=tuple(self.logprob for _ in out),
                              finish_reason=finish, weight_version=self.weight_version,
                              prompt_tokens=len(input_ids), cached_tokens=0, completion_tokens=len(out),
                              routed_experts=routing, routed_experts_start=routed_experts_start)

    @staticmethod
    def _cut(ids: tuple[int, ...], sampling: SamplingParams) -> tuple[list[int], FinishReason]:
        stops = set(sampling.stop_token_ids)
        for i, t in enumerate(ids[: sampling.max_new_tokens]):
            if t in stops:
                return list(ids[: i + 1]), FinishReason(FinishKind.STOP, matched=t)
        if len(ids) > sampling.max_new_tokens:
            return list(ids[: sampling.max_new_tokens]), FinishReason(FinishKind.LENGTH)
        return list(ids), FinishReason(FinishKind.STOP)

    async def _produce(self, rid: str, n: int, delay: float) -> tuple[int, bool]:
        """Waits ``n`` token times; returns (tokens produced, aborted)."""
        event = asyncio.Event()
        self._abort_events[rid] = event
        self.running.add(rid)
        self.max_running = max(self.max_running, len(self.running))
        started = time.perf_counter()
        try:
            total = n * delay
            if total > 0:
                try:
                    await asyncio.wait_for(event.wait(), timeout=total)
                except asyncio.TimeoutError:
                    return n, False
            else:
                await asyncio.sleep(0)
                if not event.is_set():
                    return n, False
            produced = int((time.perf_counter() - started) / delay) if delay else 0
            return min(produced, n), True
        finally:
            self.running.discard(rid)
            self._abort_events.pop(rid, None)

    async def abort(self, rid: str) -> int:
        self.aborts.append(rid)
        event = self._abort_events.get(rid)
        if event is not None:
            event.set()
        return 1

    async def abort_all(self) -> int:
        for event in list(self._abort_events.values()):
            event.set()
        return 1

    async def active_requests(self) -> int:
        return len(self.running)
