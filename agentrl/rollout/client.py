"""Async client for SGLang's native ``/generate``, used directly or through sglang-router.

Token ids in, token ids and per-token logprobs out: the client never sends or re-encodes text. One
:class:`InferenceClient` serves one engine group (a router URL, or one engine): it owns one aiohttp
connection pool and one concurrency limit, sized together (``ClientConfig.max_concurrency``).

Failure contract:

- HTTP 4xx is a deterministic client error: :class:`RequestRejectedError` (or
  :class:`PromptTooLongError` when the prompt does not fit the context) is raised at once, never retried.
- Transport errors, 429 and 5xx are retried with exponential backoff and jitter, within the request's
  deadline. When retries or the deadline run out the call *returns* a result whose finish reason is
  ``ABORT`` (with the tokens produced so far when the engine could still be asked to abort, none
  otherwise). A call never hangs. ``finish_reason.cause`` (:class:`~agentrl.rollout.types.AbortCause`)
  tells such an engine failure (``unavailable``, ``deadline``) from a deliberate abort (``engine``,
  ``client``), with the reason in ``finish_reason.message``.

Every call gets a request id (``rid``); :meth:`InferenceClient.abort` aborts it on the engines of the
group (the router does not forward ``/abort_request``, so the client broadcasts it to the engine URLs
its ``control_urls`` callable returns). A routing key (``X-SMG-Routing-Key``) keeps one episode on
one engine under consistent hashing, so its prefix stays cached. A request for a mixture-of-experts
engine's routing (``routed_experts=``) bypasses the router, which drops the fields that ask for it:
it goes to one of ``control_urls``' engines, the same for the same routing key.

Example::

    async with InferenceClient(ClientConfig(base_url=router.url), control_urls=group.engine_urls) as client:
        result = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=32), routing_key="episode-7")
        result.output_ids, result.output_logprobs, result.finish_reason.kind
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import hashlib
import operator
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import orjson

from agentrl.rollout._http import HttpPool
from agentrl.rollout.pacing import Pacer
from agentrl.rollout.types import (
    AbortCause,
    FinishKind,
    FinishReason,
    GenerateResult,
    PromptTooLongError,
    ProtocolError,
    RequestRejectedError,
    RoutingShape,
    SamplingParams,
)

__all__ = ["ClientConfig", "InferenceClient", "parse_generate_response"]

ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
# sglang-router 0.3.2 re-serialises request bodies and drops these sampling keys (measured by the unit
# tests). spaces_between_special_tokens only changes the detokenised `text`, never the token ids;
# logit_bias changes what is sampled, so a client bound to a router refuses it rather than lose it.
ROUTER_DROPPED_SAMPLING_KEYS = frozenset({"spaces_between_special_tokens", "logit_bias"})
ROUTER_REFUSED_SAMPLING_KEYS = frozenset({"logit_bias"})
_JSON_HEADERS = {"Content-Type": "application/json"}

@dataclass(frozen=True)
class ClientConfig:
    """Settings of one engine group's client.

    ``max_concurrency`` bounds both the number of requests in flight and the connection pool.
    ``lean_transport`` sends ``/generate`` over the lean keep-alive pool (:mod:`agentrl.rollout._http`,
    plain ``http://`` only) instead of aiohttp, at a fraction of the driver's CPU per request.
    ``deadline_s`` is the default total time of one :meth:`InferenceClient.generate` call including
    retries (``None``: no deadline). Backoff before retry ``n`` is
    ``min(backoff_max_s, backoff_initial_s * backoff_multiplier**n)`` times a random factor in
    ``[1 - jitter, 1 + jitter]``. ``unavailable_wait_s``: after ``max_retries``, keep retrying an
    unavailable engine (transport errors, 5xx) until that many seconds have passed since the first
    failure (within the deadline): what a request does while the health monitor restarts the only
    engine, instead of failing its episode. ``via_router``: ``base_url`` is an sglang-router (set by
    :meth:`EngineGroup.client`); sampling options the router would silently drop are then refused.
    """

    base_url: str
    max_concurrency: int = 256
    deadline_s: float | None = 1800.0
    connect_timeout_s: float = 10.0
    max_retries: int = 5
    backoff_initial_s: float = 0.1
    backoff_multiplier: float = 2.0
    backoff_max_s: float = 5.0
    jitter: float = 0.2
    unavailable_wait_s: float = 0.0
    abort_grace_s: float = 5.0
    control_timeout_s: float = 10.0
    via_router: bool = False
    lean_transport: bool = True

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"ClientConfig.base_url={self.base_url!r}: expected an http(s):// URL")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        if self.max_concurrency < 1:
            raise ValueError(f"ClientConfig.max_concurrency={self.max_concurrency!r}: expected an int >= 1")
        if self.max_retries < 0:
            raise ValueError(f"ClientConfig.max_retries={self.max_retries!r}: expected an int >= 0")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"ClientConfig.deadline_s={self.deadline_s!r}: expected > 0 or None")
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"ClientConfig.jitter={self.jitter!r}: expected a value in [0, 1)")
        if self.unavailable_wait_s < 0:
            raise ValueError(f"ClientConfig.unavailable_wait_s={self.unavailable_wait_s!r}: expected >= 0")


class _DeadlineState:
    __slots__ = ("cancelled", "expired", "grace_handle")

    def __init__(self) -> None:
        self.expired = False
        self.cancelled = False
        self.grace_handle: asyncio.TimerHandle | None = None


class _Retryable(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _payload(sampling: SamplingParams) -> dict[str, Any]:
    """``sampling.to_payload()``, memoised for hashable params (the same few serve every request; the
    dict is only ever serialised, never changed)."""
    try:
        return _cached_payload(sampling)
    except TypeError:
        return sampling.to_payload()


@functools.lru_cache(maxsize=1024)
def _cached_payload(sampling: SamplingParams) -> dict[str, Any]:
    return sampling.to_payload()


def _triples(raw: Any, where: str) -> list[list[Any]]:
    if not isinstance(raw, list):
        raise ProtocolError(f"meta_info.{where}: expected a list of [logprob, token_id, text], got {type(raw).__name__}")
    return raw


_first = operator.itemgetter(0)
_second = operator.itemgetter(1)


def _routed_experts(meta: dict[str, Any], rid: str, shape: RoutingShape, start: int, expected: int) -> Any:
    """The ``[positions, layers, top_k]`` routing of an answer (SGLang: base64 of little-endian int32),
    checked against ``shape`` and the positions asked for; None when the answer has none."""
    raw = meta.get("routed_experts")
    if raw is None:
        return None
    try:
        flat = np.frombuffer(base64.b64decode(raw, validate=True), dtype="<i4")
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"rid {rid!r}: meta_info.routed_experts is not base64 int32 data: {err}") from err
    per_row = shape.layers * shape.top_k
    if flat.size != expected * per_row:
        raise ProtocolError(f"rid {rid!r}: meta_info.routed_experts holds {flat.size} ids; expected {expected} "
                            f"positions [{start}, {start + expected}) x {shape.layers} layers x top-{shape.top_k}")
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= shape.experts):
        raise ProtocolError(f"rid {rid!r}: meta_info.routed_experts has expert ids in [{int(flat.min())}, "
                            f"{int(flat.max())}]; expected ids in [0, {shape.experts})")
    return flat.reshape(expected, shape.layers, shape.top_k).astype(shape.dtype)


def parse_generate_response(body: Any, rid: str, *, attempts: int = 1, routed_experts: RoutingShape | None = None,
                            routed_experts_start: int = 0) -> GenerateResult:
    """Builds a :class:`GenerateResult` from one ``/generate`` JSON answer, checking its consistency.

    ``output_ids`` and the ids inside ``output_token_logprobs`` must agree entry by entry; a mismatch
    or a missing field raises :class:`ProtocolError` instead of being patched over. With
    ``routed_experts`` (the request asked for the routing from position ``routed_experts_start``)
    the answer's routing must cover exactly the positions up to the last sampled token's.
    """
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise ProtocolError(f"/generate answer for rid {rid!r}: expected an object with 'meta_info', got {body!r:.200}")
    meta = body["meta_info"]
    finish = FinishReason.from_meta(meta.get("finish_reason"))
    lp_triples = _triples(meta.get("output_token_logprobs", []), "output_token_logprobs")
    ids_from_lp = list(map(int, map(_second, lp_triples)))  # map() in C: thousands of answers a second
    raw_ids = body.get("output_ids")
    output_ids = list(map(int, raw_ids)) if isinstance(raw_ids, list) else ids_from_lp
    if lp_triples and ids_from_lp != output_ids:
        raise ProtocolError(
            f"rid {rid!r}: output_ids ({len(output_ids)}) and output_token_logprobs ids ({len(ids_from_lp)}) differ"
        )
    completion = int(meta.get("completion_tokens", len(output_ids)))
    if completion != len(output_ids):
        raise ProtocolError(f"rid {rid!r}: completion_tokens={completion} but {len(output_ids)} output ids")
    input_triples = _triples(meta.get("input_token_logprobs", []), "input_token_logprobs")
    top = meta.get("output_top_logprobs") or []
    version = meta.get("weight_version")
    prompt_tokens = int(meta.get("prompt_tokens", 0))
    routing = None
    if routed_experts is not None:
        expected = max(0, prompt_tokens + completion - 1 - routed_experts_start)
        routing = _routed_experts(meta, rid, routed_experts, routed_experts_start, expected)
    spans = tuple((str(x["version"]), int(x["start"]), int(x["end"])) for x in meta.get("weight_versions") or ())
    return GenerateResult(
        rid=rid,
        output_ids=tuple(output_ids),
        output_logprobs=tuple(map(float, map(_first, lp_triples))),
        finish_reason=finish,
        weight_version=None if version is None else str(version),
        prompt_tokens=prompt_tokens,
        cached_tokens=int(meta.get("cached_tokens", 0)),
        completion_tokens=completion,
        text=str(body.get("text", "")),
        input_logprobs=tuple(None if t[0] is None else float(t[0]) for t in input_triples),
        input_ids_scored=tuple(int(t[1]) for t in input_triples),
        top_logprobs=tuple(tuple((float(e[0]), int(e[1])) for e in (pos or [])) for pos in top),
        weight_version_spans=spans,
        e2e_latency_s=meta.get("e2e_latency"),
        attempts=attempts,
        meta=meta,
        routed_experts=routing,
        routed_experts_start=routed_experts_start,
    )


def _error_message(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:2000]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err)
    return str(body)


class InferenceClient:
    """Client of one engine group. Use as ``async with``, or call :meth:`close` when done.

    Not thread-safe: one instance per event loop. ``control_urls`` returns the engine URLs that
    :meth:`abort` and :meth:`abort_all` reach (default: ``base_url`` itself, right for a single engine).
    """

    def __init__(self, config: ClientConfig, control_urls: Callable[[], Sequence[str]] | None = None) -> None:
        self.config = config
        self._control_urls = control_urls
        self._session: aiohttp.ClientSession | None = None
        self._limit: asyncio.Semaphore | None = None
        self._attempt_rid: dict[str, str] = {}
        self._background: set[asyncio.Future[int]] = set()
        self._client_aborted: set[str] = set()
        self._pool: HttpPool | None = None  # the /generate data path (plain http); aiohttp for the rest
        # answers arrive in bursts (an engine finishes a batch): each is parsed in its turn, so one loop pass
        # never parses a thousand of them back to back; a scheduler on this client shares this pacer
        self.pacer = Pacer()
        # LoRA: the adapter every request is served through, (name, the policy version it is) (None: the
        # base weights); the weight sync moves it to each new version, so a request sent (or resumed) after
        # a sync uses the new one, and the tokens of a request say the version of the adapter they came from
        self._adapter: tuple[str, str] | None = None

    @property
    def adapter(self) -> str | None:
        """The name of the LoRA adapter requests go through (``None``: the base weights)."""
        return None if self._adapter is None else self._adapter[0]

    def set_adapter(self, name: str | None, version: str | int | None = None) -> None:
        """Serve every later request through adapter ``name`` (``None``: the base weights); its results
        then report ``version`` as their weight version (SGLang's own is the base weights' version, which
        an adapter load does not change)."""
        if name is None:
            self._adapter = None
            return
        if not isinstance(name, str) or not name:
            raise ValueError(f"set_adapter(name={name!r}): expected an adapter name or None")
        self._adapter = (name, str(version) if version is not None else name)

    async def __aenter__(self) -> InferenceClient:
        self._ensure_session()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            n = self.config.max_concurrency
            connector = aiohttp.TCPConnector(limit=n, limit_per_host=n, keepalive_timeout=60.0)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
            self._limit = asyncio.Semaphore(n)
            if self.config.lean_transport and self.config.base_url.startswith("http://"):
                self._pool = HttpPool(self.config.base_url, max_connections=n,
                                      connect_timeout_s=self.config.connect_timeout_s)
        return self._session

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        rid: str | None = None,
        routing_key: str | None = None,
        return_logprob: bool = True,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        deadline_s: float | None = None,
        routed_experts: RoutingShape | None = None,
        routed_experts_start: int = 0,
    ) -> GenerateResult:
        """Generates from ``input_ids`` with ``sampling``; see the module docstring for failures.

        ``logprob_start_len=k`` (with ``max_new_tokens=0`` for pure scoring) also returns the logprobs
        of prompt positions from ``k`` on. ``deadline_s`` overrides ``ClientConfig.deadline_s``.
        ``routed_experts``: ask a mixture-of-experts engine (started with
        ``--enable-return-routed-experts``) for the experts of positions ``routed_experts_start`` on
        (at most ``len(input_ids)``: the positions already held need not travel again); the answer's
        ``routed_experts`` holds them (:class:`GenerateResult`).
        """
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"generate(sampling=...): expected SamplingParams, got {type(sampling).__name__}")
        if len(input_ids) == 0:
            raise ValueError("generate(input_ids=[]): expected at least one prompt token")
        rid = rid or os.urandom(16).hex()
        sampling_payload = _payload(sampling)
        if self.config.via_router:
            lost = sorted(ROUTER_REFUSED_SAMPLING_KEYS & set(sampling_payload))
            if lost:
                raise ValueError(f"generate(sampling=...): {', '.join(lost)} would be dropped by sglang-router "
                                 f"({self.config.base_url}) without notice; send such requests to an engine URL")
        payload: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": sampling_payload,
            "return_logprob": return_logprob,
        }
        if logprob_start_len is not None:
            payload["logprob_start_len"] = logprob_start_len
        if top_logprobs_num is not None:
            payload["top_logprobs_num"] = top_logprobs_num
        if routed_experts is not None:
            if not 0 <= routed_experts_start <= len(input_ids):
                raise ValueError(f"generate(routed_experts_start={routed_experts_start}): expected a position in "
                                 f"[0, {len(input_ids)}] (the prompt's length)")
            payload["return_routed_experts"] = True
            payload["routed_experts_start_len"] = routed_experts_start
        adapter = self._adapter
        if adapter is not None:  # LoRA: every request goes through the current adapter version
            payload["lora_path"] = adapter[0]
        headers = {ROUTING_KEY_HEADER: routing_key} if routing_key is not None else {}
        deadline = self.config.deadline_s if deadline_s is None else deadline_s
        if rid in self._attempt_rid:
            raise ValueError(f"generate(rid={rid!r}): a request with this rid is already in flight")
        self._attempt_rid[rid] = rid
        self._ensure_session()
        assert self._limit is not None
        try:
            routing = (routed_experts, routed_experts_start) if routed_experts is not None else None
            async with self._limit:
                if deadline is None:
                    result = await self._with_retries(payload, headers, rid, routing=routing)
                else:
                    result = await self._with_deadline(payload, headers, rid, deadline, routing)
            if adapter is not None and result.weight_version is not None:  # the adapter's version, not the base's
                result = dataclasses.replace(result, weight_version=adapter[1], weight_version_spans=())
            return result
        finally:
            self._attempt_rid.pop(rid, None)
            self._client_aborted.discard(rid)

    async def _with_deadline(self, payload: dict[str, Any], headers: dict[str, str], rid: str,
                             deadline: float, routing: tuple[RoutingShape, int] | None) -> GenerateResult:
        # Timers instead of a helper task per request: at the deadline the engine is asked to abort
        # (it then answers with the tokens produced so far); if it has not answered ``abort_grace_s``
        # later, the request is cancelled and comes back aborted without tokens.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        state = _DeadlineState()

        def on_grace() -> None:
            state.cancelled = True
            task.cancel()

        def on_deadline() -> None:
            state.expired = True
            self._background.add(asyncio.ensure_future(self.abort(rid)))
            state.grace_handle = loop.call_later(self.config.abort_grace_s, on_grace)

        handle = loop.call_later(deadline, on_deadline)
        try:
            return await self._with_retries(payload, headers, rid, state, routing)
        except asyncio.CancelledError:
            if not state.cancelled:
                raise
            if hasattr(task, "uncancel"):
                task.uncancel()
            return self._aborted(rid, f"deadline of {deadline:.1f} s exceeded and the engine did not answer "
                                      "the abort", 0, cause=AbortCause.DEADLINE)
        finally:
            handle.cancel()
            if state.grace_handle is not None:
                state.grace_handle.cancel()
            self._background = {t for t in self._background if not t.done()}

    async def _with_retries(self, payload: dict[str, Any], headers: dict[str, str], rid: str,
                            state: _DeadlineState | None = None,
                            routing: tuple[RoutingShape, int] | None = None) -> GenerateResult:
        cfg = self.config
        last: _Retryable | None = None
        attempts = 0
        first_failure: float | None = None
        attempt = 0
        while True:
            if (state is not None and state.expired) or rid in self._client_aborted:
                break
            attempt_rid = rid if attempt == 0 else f"{rid}-retry{attempt}"
            self._attempt_rid[rid] = attempt_rid
            payload["rid"] = attempt_rid
            attempts += 1
            try:
                body = await self._post_generate(payload, headers)
            except _Retryable as err:
                last = err
                now = time.monotonic()
                first_failure = now if first_failure is None else first_failure
                if attempt >= cfg.max_retries and now - first_failure >= cfg.unavailable_wait_s:
                    break
                delay = min(cfg.backoff_max_s, cfg.backoff_initial_s * cfg.backoff_multiplier**min(attempt, 30))
                await asyncio.sleep(delay * random.uniform(1 - cfg.jitter, 1 + cfg.jitter))
                attempt += 1
                continue
            shape, start = routing if routing is not None else (None, 0)
            parsed = parse_generate_response(body, rid, attempts=attempts, routed_experts=shape,
                                             routed_experts_start=start)
            return self._attribute(parsed, rid, state)
        expired = state is not None and state.expired
        if last is None:  # aborted before anything was sent
            if expired:
                return self._aborted(rid, "deadline exceeded before the request was sent", 0, cause=AbortCause.DEADLINE)
            return self._aborted(rid, "aborted by the client before the request was sent", 0, cause=AbortCause.CLIENT)
        why, cause = ("deadline exceeded", AbortCause.DEADLINE) if expired else \
            ("engine unavailable", AbortCause.UNAVAILABLE)
        return self._aborted(rid, f"{why} after {attempts} attempts: {last}", attempts, last.status, cause=cause)

    def _attribute(self, result: GenerateResult, rid: str, state: _DeadlineState | None) -> GenerateResult:
        """An engine-reported abort that this client caused (its deadline, its abort()) says so."""
        if not result.aborted:
            return result
        if state is not None and state.expired:
            cause, note = AbortCause.DEADLINE, "deadline exceeded"
        elif rid in self._client_aborted:
            cause, note = AbortCause.CLIENT, "aborted by the client"
        else:
            return result
        engine_said = result.finish_reason.message
        message = f"{note} (the engine answered: {engine_said})" if engine_said else note
        finish = dataclasses.replace(result.finish_reason, cause=cause, message=message)
        return dataclasses.replace(result, finish_reason=finish)

    def _engine_for(self, routing_key: str | None) -> str | None:
        """The engine a routed-experts request goes to when this client is bound to a router:
        sglang-router 0.3.2 re-serialises ``/generate`` bodies without ``return_routed_experts`` and
        ``routed_experts_start_len`` (measured), so such a request goes straight to one of the group's
        engines, the same one for the same routing key (rendezvous hashing over the engines in
        rotation: an episode keeps its prefix cache, and a departing engine moves only its keys)."""
        urls = self._targets()
        if not urls:
            return None
        if routing_key is None:
            return random.choice(urls)
        return max(urls, key=lambda u: hashlib.blake2b(f"{u}|{routing_key}".encode(), digest_size=8).digest())

    async def _post_generate(self, payload: dict[str, Any], headers: dict[str, str]) -> Any:
        url = self.config.base_url + "/generate"
        direct = None
        if payload.get("return_routed_experts") and self.config.via_router:
            direct = self._engine_for(headers.get(ROUTING_KEY_HEADER))
            url = direct + "/generate" if direct is not None else url
        try:
            if self._pool is not None and direct is None:
                status, raw = await self._pool.post("/generate", orjson.dumps(payload), headers)
            else:
                session = self._ensure_session()
                async with session.post(url, data=orjson.dumps(payload), headers={**_JSON_HEADERS, **headers}) as resp:
                    raw = await resp.read()
                    status = resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            raise _Retryable(f"{type(err).__name__}: {err}") from err
        await self.pacer.turn()
        if status == 200:
            try:
                return orjson.loads(raw)
            except ValueError as err:
                raise ProtocolError(f"{url}: answer is not JSON: {raw[:200]!r}") from err
        message = _error_message(raw)
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}: {message}", status)
        if status == 400 and "context length" in message:
            raise PromptTooLongError(status, message, url)
        raise RequestRejectedError(status, message, url)

    @staticmethod
    def _aborted(rid: str, message: str, attempts: int, status: int | None = None, *,
                 cause: AbortCause) -> GenerateResult:
        return GenerateResult(
            rid=rid, output_ids=(), output_logprobs=(), weight_version=None, prompt_tokens=0,
            cached_tokens=0, completion_tokens=0, attempts=attempts,
            finish_reason=FinishReason(FinishKind.ABORT, message=message, status_code=status, cause=cause),
        )

    def _targets(self) -> list[str]:
        urls = list(self._control_urls()) if self._control_urls is not None else [self.config.base_url]
        return [u.rstrip("/") for u in urls]

    async def _broadcast(self, path: str, body: dict[str, Any]) -> int:
        session = self._ensure_session()
        timeout = aiohttp.ClientTimeout(total=self.config.control_timeout_s)

        async def one(url: str) -> bool:
            try:
                async with session.post(url + path, data=orjson.dumps(body), headers=_JSON_HEADERS,
                                        timeout=timeout) as resp:
                    await resp.read()
                    return resp.status < 300
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return False  # an engine that is gone has nothing left to abort

        return sum(await asyncio.gather(*(one(u) for u in self._targets())))

    async def abort(self, rid: str) -> int:
        """Aborts request ``rid`` (its current attempt) wherever it runs; unknown ids are a no-op.

        A request of this client that is still waiting for a slot, or backing off before a retry, is
        not sent (again) and comes back aborted. Returns how many engines accepted the abort (0 means
        it reached none: sglang-router does not serve ``/abort_request``, so a client of a router
        needs ``control_urls``)."""
        if rid in self._attempt_rid:
            self._client_aborted.add(rid)  # no (further) attempts: covers waiting and backing-off requests
        return await self._broadcast("/abort_request", {"rid": self._attempt_rid.get(rid, rid)})

    async def abort_all(self) -> int:
        """Aborts every request on every engine of the group (also other clients' requests); returns
        how many engines accepted it."""
        self._client_aborted.update(self._attempt_rid)
        return await self._broadcast("/abort_request", {"abort_all": True})
