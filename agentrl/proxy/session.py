"""One proxy session: an episode whose turns an agent harness asks for, one OpenAI request at a time.

A :class:`ProxySession` is the agent loop's token path driven from the outside. Each request is
placed against the session's sequences (:mod:`agentrl.proxy._history`):

- it **extends** a sequence (its history, the proxy's last reply recognised, then new messages):
  the new messages are bridged exactly as the agent loop bridges an environment's reply
  (:class:`~agentrl.chat.bridge.BridgeSession`, prefix-checked; a synthetic turn close as
  ``scaffold`` when the turn did not end with one) and appended with
  :meth:`~agentrl.trajectory.Trajectory.append_env`; the sampled ids of every recognised reply
  stand, nothing sampled is re-tokenised;
- it **repeats** the request of the last reply: a retry (the OpenAI client's
  ``X-Stainless-Retry-Count`` > 0) is answered with the same reply; otherwise it is a new sample
  of the same prompt and forks;
- it continues a **pending** turn (one an abort cut short, or whose request failed);
- or it matches no sequence (the harness truncated, summarised or re-ordered its history, changed
  the tools, or dropped a reply): a new sequence is **forked** from the full render of the request,
  sharing the rollout id, as the agent loop forks when a template rewrites history.

Then the turn is generated token-in/token-out through the inference client (the router's, with the
session's routing key), appended verbatim with its logprobs and weight version, parsed by the
template's parser (the calls SGLang's parser serves, and as content the text SGLang's server answers:
before the first call; no parser runs without tools or under ``tool_choice="none"``) and returned
in OpenAI's shape with ids the proxy issues (``chatcmpl-…``, ``call_…``: random, so only this session's harness can quote them).

Sampling: ``AgentConfig.sampling`` is the base; a request's ``max_tokens`` lowers the per-turn cap,
its ``stop`` strings are added; with ``ProxyConfig.pin_sampling`` (default) its ``temperature`` and
``top_p`` are ignored (counted as ``proxy/ignored_sampling``), because the trainer scores tokens at
the run's temperature. ``tool_choice`` ``required``/named is served with a grammar
(:mod:`agentrl.proxy._grammar`) when ``ProxyConfig.constrained_decoding`` is on, else refused (400).

Aborts: with a ``should_abort`` set by the owner (:class:`agentrl.proxy.AgentRunner`), a request
that finds it true (or whose turn the engine aborted while it is true) is *held*: the session is
suspended with the partial turn kept, and the request continues the same turn when the owner
resumes it; the harness sees nothing. Any other abort answers 503 ``aborted`` with
``x-should-retry: true``: the partial turn is kept and the retried request continues it.

Errors answer the harness in OpenAI's error shape (:class:`SessionError`): 400 for a request the
proxy cannot serve (recorded as an ``agent_request`` error), 400 ``context_length_exceeded`` when
no token fits, 502/503 for engine failures (``engine`` errors), 410 after the episode closed.
Single-use, not thread-safe: the server serialises a session's requests.

Long episodes: ``context_length_exceeded`` is not final. A harness that compacts its history on it
sends a shorter request, which forks a sequence with ``fork_reason = compaction`` and trains like any
other; the episode ends ``context_budget`` only when no request succeeds after the refusal
(``proxy/context_refusals``, ``proxy/context_recoveries``). A session given a ``context_policy``
(:mod:`agentrl.rollout.context`) compacts for a harness that does not (:mod:`agentrl.proxy._compact`):
past the policy's trigger it starts a sequence from the policy's conversation, which the harness's
later requests (still carrying its whole history) continue.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat.bridge import BridgeOutcome, BridgeResult, BridgeSession
from agentrl.chat.template import ChatTemplate
from agentrl.chat.types import Message, ToolCall
from agentrl.episode import Episode
from agentrl.proxy._compact import ProxyCompactor
from agentrl.proxy._grammar import forced_call_grammar
from agentrl.proxy._history import Issued, Match, match
from agentrl.proxy._wire import ChatRequest, ParseMemo, Reply, RequestError
from agentrl.rollout._agent_config import AgentConfig
from agentrl.rollout._requests import GenerateClient, new_id, request_sampling
from agentrl.rollout.context import ContextPolicy
from agentrl.rollout.routing import missing_routing, routing_request, store_routing
from agentrl.rollout.types import (
    FinishKind,
    GenerateResult,
    InferenceError,
    PromptTooLongError,
    SamplingParams,
    continuation_budget,
)
from agentrl.trajectory import (
    EpisodeError,
    ErrorKind,
    ForkReason,
    SegmentKind,
    StopReason,
    Trajectory,
    TrajectoryError,
    status_for,
)

__all__ = ["ProxyConfig", "ProxySession", "SessionError"]


@dataclass(frozen=True)
class ProxyConfig:
    """Settings of the proxy server and its sessions.

    - ``host``/``port``: where the server listens (``port=0``: a free one); loopback by default.
    - ``api_key``: when set, every request must carry ``Authorization: Bearer <api_key>`` (else 401).
    - ``model_name``: the one model ``/v1/models`` lists (requests may name any model).
    - ``pin_sampling``: temperature and top_p come from ``AgentConfig.sampling``; a request's are ignored.
    - ``constrained_decoding``: serve ``tool_choice`` ``"required"``/named with a grammar (the engine
      needs a grammar backend, SGLang's default xgrammar); off: such a request is a 400.
    - ``max_body_bytes``: the largest request body accepted (413 above).
    """

    host: str = "127.0.0.1"
    port: int = 0
    api_key: str | None = None
    model_name: str = "agentrl"
    pin_sampling: bool = True
    constrained_decoding: bool = False
    max_body_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ValueError(f"ProxyConfig.port: got {self.port!r}; expected an int in [0, 65535]")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError(f"ProxyConfig.api_key: got {self.api_key!r}; expected None or a non-empty string")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ValueError(f"ProxyConfig.max_body_bytes: got {self.max_body_bytes!r}; expected an int >= 1024")


class SessionError(Exception):
    """A request the session answers with an error: HTTP ``status``, OpenAI error ``kind``, and whether
    the harness should retry (``x-should-retry``)."""

    def __init__(self, status: int, kind: str, message: str, *, retry: bool = False, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.retry, self.code = status, kind, message, retry, code


def _never() -> bool:
    return False


@dataclass
class _Sequence:
    traj: Trajectory
    tools: list[dict[str, object]] | None
    owners: list[Issued | None]
    bridge: BridgeSession | None
    partial: list[int] = field(default_factory=list)  # ids of a turn an abort cut short
    # a sequence the session's context policy compacted: the harness's messages its first ``stand_in``
    # messages stand for (the harness goes on sending them; a request that does continues this sequence)
    shadow: tuple[Message, ...] = ()
    stand_in: int = 0

    def view(self) -> tuple[list[Message], list[Issued | None]]:
        """The history a request is matched against, as the harness holds it, and who issued each message."""
        if not self.shadow:
            return self.traj.messages, self.owners
        return ([*self.shadow, *self.traj.messages[self.stand_in:]],
                [*([None] * len(self.shadow)), *self.owners[self.stand_in:]])


class ProxySession:
    """See the module doc. ``id`` is unguessable (the URL path segment that addresses the session)."""

    def __init__(self, template: ChatTemplate, client: GenerateClient, agent: AgentConfig | None = None,
                 config: ProxyConfig | None = None, *, session_id: str | None = None, group_id: str | None = None,
                 rollout_id: str | None = None, sample_id: str | None = None,
                 context_policy: ContextPolicy | None = None) -> None:
        self.template, self.client = template, client
        self.agent, self.config = agent or AgentConfig(), config or ProxyConfig()
        self.id = session_id or secrets.token_urlsafe(24)
        self.group_id, self.rollout_id, self.sample_id = group_id, rollout_id or new_id(), sample_id
        self.routing_key = group_id if self.agent.routing == "group" and group_id else new_id()
        self.kwargs = dict(self.agent.template_kwargs)
        self.stops = tuple(dict.fromkeys((*template.stop_token_ids(), *self.agent.sampling.stop_token_ids)))
        self.decodable = len(template.tokenizer)
        self.context = self.agent.context_length
        self.compactor = ProxyCompactor(context_policy, template, self.context, self.kwargs) if context_policy else None
        self.sequences: list[Trajectory] = []
        self._seqs: list[_Sequence] = []
        self.metrics: Counter[str] = Counter()
        self.timings: dict[str, float] = {"time/generate_s": 0.0, "time/proxy_s": 0.0}
        self.should_abort: Callable[[], bool] = _never
        self.suspended = asyncio.Event()  # set while a request waits for the owner to resume the session
        self._resume = asyncio.Event()
        self._lock = asyncio.Lock()
        self.closed = False
        self.abort_message: str | None = None
        self.last_request: ChatRequest | None = None
        self.last_finish: FinishKind | None = None
        self.context_exceeded = False
        self._unplaced: list[EpisodeError] = []  # errors before the first sequence existed
        self.memo = ParseMemo()  # the server's parsing state (read-only messages and tools)
        self._samplings: dict[tuple[Any, ...], SamplingParams] = {}  # per distinct request settings

    # -- the owner's side ------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """A request is being served (or held)."""
        return self._lock.locked()

    @property
    def partial_turn_tokens(self) -> int:
        return sum(len(s.partial) for s in self._seqs)

    def resume(self, should_abort: Callable[[], bool] | None = None) -> None:
        """Lets a held request go on (with a new abort check)."""
        self.should_abort = should_abort or _never
        self.suspended.clear()
        self._resume.set()

    def close(self) -> None:
        """No request is served after this (410); a held request is answered ``aborted``."""
        self.closed = True
        self._resume.set()

    def episode(self) -> Episode:
        return Episode(sequences=list(self.sequences))

    def finish(self, reason: StopReason) -> Episode:
        """Ends every sequence with ``reason``'s status and puts the session's metrics on the last one."""
        if self.sequences:
            self.sequences[0].errors[0:0] = self._unplaced  # first, in the order they happened
            self._unplaced = []
        for seq in self.sequences:
            seq.finish(status_for(reason), reason)
        if self.agent.routed_experts is not None:
            self.metrics["routing/missing_tokens"] += sum(missing_routing(seq) for seq in self.sequences)
        if self.sequences:
            last = self.sequences[-1]
            last.metrics.update({k: float(v) for k, v in self.metrics.items()})
            last.metrics.update(self.timings)
            last.metrics["sequences"] = float(len(self.sequences))
            last.metrics["proxy/forks"] = float(self.metrics["proxy/forks"])  # 0 too: every episode carries it
            follow_ups = max(self.metrics["proxy/requests"] - 1, 0)
            last.metrics["proxy/fork_rate"] = self.metrics["proxy/forks"] / follow_ups if follow_ups else 0.0
        return self.episode()

    def record(self, kind: ErrorKind, message: str, component: str, origin: str | None = None) -> None:
        """An error of the harness's side, on the latest sequence (kept for later when there is none yet);
        ``origin``: where the harness raised it (``path:line in function``)."""
        if self.sequences:
            self.sequences[-1].add_error(kind, message, component=component, origin=origin)
        else:
            self._unplaced.append(EpisodeError(kind, message, turn=0, component=component, origin=origin))
        self.metrics[f"proxy/errors/{kind.value}"] += 1

    # -- serving ---------------------------------------------------------------------------------
    async def handle(self, request: ChatRequest, *, retry: bool = False) -> Reply:
        """Serves one request (see the module doc); raises :class:`SessionError` or :class:`RequestError`."""
        async with self._lock:
            if self.closed:
                self.record(ErrorKind.AGENT_LATE_CALL, "a request after the episode ended", "request")
                raise SessionError(410, "episode_closed", "this session's episode has ended; no more requests "
                                   "are served")
            started = time.perf_counter()
            generate_before = self.timings["time/generate_s"]
            self.metrics["proxy/requests"] += 1
            self.last_request = request
            try:
                reply = await self._serve(request, retry)
                self.memo.replied(reply)
                return reply
            except RequestError as exc:
                if exc.code != "context_length_exceeded":
                    self.metrics["proxy/bad_requests"] += 1
                    self.record(ErrorKind.AGENT_REQUEST, f"{exc.param or 'request'}: {exc.message}", "request")
                raise
            finally:
                spent = time.perf_counter() - started
                self.timings["time/proxy_s"] += spent - (self.timings["time/generate_s"] - generate_before)

    async def _serve(self, request: ChatRequest, retry: bool) -> Reply:
        sampling = self._sampling(request)
        seq, placed = self._place(request)
        if seq is not None and placed.kind == "repeat":
            last = seq.owners[-1]
            if retry and last is not None:
                self.metrics["proxy/retries_served"] += 1
                return last.reply
            seq = self._fork(request.messages, request.render_tools, "resampled",
                             "the same request again: a new sample of its prompt")
        elif seq is not None and placed.kind == "extend":
            seq = await self._extend(seq, list(placed.new), request)
        elif seq is None:
            # after a context_length_exceeded the harness's shorter history is its compaction
            kind = "compaction" if self.context_exceeded else "harness" if self._seqs else "first"
            seq = await self._open(request, kind, placed.reason)
        for how in placed.recognised:
            self.metrics[f"proxy/recognised/{how}"] += 1
        reply = await self._turn(seq, request, sampling)
        if self.context_exceeded:  # a refusal is final only when no later request succeeds
            self.context_exceeded = False
            self.metrics["proxy/context_recoveries"] += 1
        return reply

    def _place(self, request: ChatRequest) -> tuple[_Sequence | None, Match]:
        """The newest sequence the request continues, with how; else (None, why the last one does not)."""
        first: Match | None = None
        for seq in reversed(self._seqs):
            found = match(*seq.view(), seq.tools, request)
            if found.kind == "none" or (seq.partial and found.kind != "pending"):
                first = first or found
                continue
            return seq, found
        return None, first or Match("none", reason="the session's first request")

    def _sampling(self, request: ChatRequest) -> SamplingParams:
        key = (request.stop, request.temperature, request.top_p, request.forced, request.tool_choice)
        cached = self._samplings.get(key) if not request.forced else None
        if cached is not None and not request.template_kwargs:
            if request.temperature is not None or request.top_p is not None:
                self.metrics["proxy/ignored_sampling"] += self.config.pin_sampling
            return cached
        sampling = self._sampling_of(request)
        if not request.forced:
            self._samplings[key] = sampling
        return sampling

    def _sampling_of(self, request: ChatRequest) -> SamplingParams:
        base = self.agent.sampling
        for key, value in request.template_kwargs.items():
            if self.kwargs.get(key) != value:
                raise RequestError(f"chat_template_kwargs.{key}: got {value!r}; the run renders with "
                                   f"{self.kwargs.get(key)!r} (AgentConfig.template_kwargs)", param="chat_template_kwargs")
        changes: dict[str, object] = {"stop": tuple(dict.fromkeys((*base.stop, *request.stop)))}
        if request.temperature is not None or request.top_p is not None:
            if self.config.pin_sampling:
                self.metrics["proxy/ignored_sampling"] += 1
            else:
                if request.temperature is not None:
                    changes["temperature"] = request.temperature
                if request.top_p is not None:
                    changes["top_p"] = request.top_p
        if request.forced:
            if not self.config.constrained_decoding:
                raise RequestError(f"tool_choice: {request.tool_choice!r} forces a call, which needs constrained "
                                   "decoding (ProxyConfig.constrained_decoding=True on an engine with a grammar "
                                   "backend); expected 'auto' or 'none'", param="tool_choice")
            if base.regex or base.json_schema or base.ebnf:
                raise RequestError("tool_choice: the run's sampling already constrains every turn by a grammar; "
                                   "a forced call cannot add another", param="tool_choice")
            assert request.render_tools is not None
            changes["ebnf"] = forced_call_grammar(self.template.tool_call_format, request.render_tools)
        return base.replace(**changes)

    # -- sequences -------------------------------------------------------------------------------
    async def _open(self, request: ChatRequest, kind: str, why: str) -> _Sequence:
        """A new sequence for a request that continues none: its own render, or the session's context
        policy's compaction of it when the render passes the trigger."""
        if self.compactor is not None:
            size = self.compactor.count(request.messages, request.render_tools)
            if self.compactor.due(size):
                compacted = await self._compacted(list(request.messages), request.render_tools, size, request, None)
                if compacted is not None:
                    return compacted
        return self._fork(request.messages, request.render_tools, kind, why)

    async def _compacted(self, conversation: list[Message], tools: list[dict[str, object]] | None, size: int,
                         request: ChatRequest, source: int | None) -> _Sequence | None:
        """The sequence the session's policy compacts ``conversation`` into (None: it has nothing to compact)."""
        assert self.compactor is not None
        try:
            rewrite = await self.compactor.compact(conversation, tools, size)
        except ValueError as exc:  # the policy's bug, or a conversation it refuses: the harness hears why
            self.record(ErrorKind.CONTEXT, str(exc), "context")
            raise RequestError(f"messages: the session's context policy failed: {exc}", param="messages") from None
        if rewrite is None:
            self.metrics["context/nothing_to_compact"] += 1
            return None
        seq = self._fork(rewrite.messages, tools, "compaction" if self._seqs else "first",
                         f"{self.compactor.policy.name}: the request renders to {size} tokens, past the trigger of "
                         f"{self.compactor.trigger}")
        seq.shadow, seq.stand_in = tuple(request.messages), len(rewrite.messages)
        seq.traj.info["compaction"] = self.compactor.record(rewrite, size, len(seq.traj.tokens), source)
        self.metrics["context/compactions"] += 1
        self.metrics[f"context/compactions/{self.compactor.policy.name}"] += 1
        return seq

    def _fork(self, messages: Sequence[Message], tools: list[dict[str, object]] | None, kind: str,
              why: str) -> _Sequence:
        bridge = BridgeSession(self.template, list(messages), tools=tools, **self.kwargs)
        ids = bridge.prompt_ids
        if self.context is not None and len(ids) >= self.context:
            raise self._too_long(f"the conversation renders to {len(ids)} tokens; the context holds {self.context}")
        traj = Trajectory.from_prompt(ids, messages=list(messages), vocab_size=self.agent.vocab_size,
                                      group_id=self.group_id, rollout_id=self.rollout_id, sample_id=self.sample_id,
                                      session_id=self.routing_key)
        traj.sequence_index = len(self.sequences)
        if kind != "first":
            traj.fork_reason = ForkReason(kind)
            traj.info["forked_because"] = f"{kind}: {why}"
            self.metrics["proxy/forks"] += 1
            self.metrics[f"proxy/fork/{kind}"] += 1
        seq = _Sequence(traj, tools, [None] * len(traj.messages), bridge)
        self.sequences.append(traj)
        self._seqs.append(seq)
        return seq

    async def _extend(self, seq: _Sequence, new: list[Message], request: ChatRequest) -> _Sequence:
        """Bridges the request's new messages after the sequence's last reply (or forks where the template
        rewrites history), exactly as the agent loop bridges an environment's reply; compacts when the
        session has a context policy and the next prompt would pass its trigger."""
        last = seq.owners[-1]
        assert last is not None
        traj = seq.traj
        before = copy.copy(seq.bridge)  # the session as it was: kept when these messages are not appended
        try:
            if seq.bridge is not None:
                bridge = seq.bridge.step(last.ids, last.message, new)
                if bridge.outcome is not BridgeOutcome.APPEND:
                    seq.bridge = None  # later turns use the stateless bridge, as in the agent loop
            else:
                bridge = self.template.bridge(traj.tokens, traj.messages, new, tools=seq.tools, audit=self.agent.audit,
                                              **self.kwargs)
        except ValueError as exc:  # the template rejected the conversation
            traj.add_error(ErrorKind.BRIDGE, str(exc), component="bridge")
            raise RequestError(f"messages: the chat template rejected the conversation: {exc}", param="messages") from None
        self._count(bridge)
        size = (len(bridge.full_render_ids) if bridge.full_render_ids is not None and
                bridge.outcome is BridgeOutcome.NOT_APPEND_ONLY else len(traj.tokens) + len(bridge.ids))
        if self.compactor is not None and self.compactor.due(size):
            compacted = await self._compacted([*traj.messages, *new], seq.tools, size, request, traj.sequence_index)
            if compacted is not None:
                seq.bridge = before
                return compacted
        if bridge.outcome is BridgeOutcome.NOT_APPEND_ONLY:
            self.metrics["bridge/fork"] += 1
            return self._fork([*traj.messages, *new], seq.tools, "template", bridge.reason)
        if self.context is not None and len(traj.tokens) + len(bridge.ids) >= self.context:
            seq.bridge = before  # a shorter reply from the harness continues the sequence as it was
            raise self._too_long(f"the sequence holds {len(traj.tokens)} tokens and the new messages add "
                                 f"{len(bridge.ids)}; the context holds {self.context}")
        self.metrics["bridge/append"] += 1
        first_new = len(traj.messages)
        for piece in bridge.pieces:
            kind = SegmentKind(piece.kind)
            traj.append_env(piece.ids, kind=kind, message_index=None if kind is SegmentKind.SCAFFOLD else first_new)
            self.metrics[f"{kind.value}_tokens"] += len(piece.ids)
        traj.messages.extend(new)
        seq.owners.extend([None] * len(new))
        return seq

    def _count(self, bridge: BridgeResult) -> None:
        if bridge.outcome is BridgeOutcome.SAMPLED_TEXT_DIFFERS or bridge.history_matches is False:
            self.metrics["bridge/sampled_text_differs"] += 1
        if bridge.control_tokens:
            self.metrics["bridge/control_tokens_in_env_text"] += bridge.control_tokens

    def _too_long(self, detail: str) -> RequestError:
        self.context_exceeded = True
        self.metrics["proxy/context_refusals"] += 1
        return RequestError(f"this model's context is full: {detail}", param="messages", code="context_length_exceeded")

    # -- one model turn ----------------------------------------------------------------------------
    async def _hold(self) -> None:
        """Waits while the owner has the session suspended (the step is full, the episode too stale)."""
        while self.should_abort() and not self.closed:
            self._resume.clear()
            self.suspended.set()
            await self._resume.wait()
        if self.closed:
            raise SessionError(503, "aborted", "the episode was ended while this request waited", retry=True)

    async def _turn(self, seq: _Sequence, request: ChatRequest, sampling: SamplingParams) -> Reply:
        per_turn = min(request.max_tokens or sampling.max_new_tokens, sampling.max_new_tokens)
        traj = seq.traj
        while True:
            await self._hold()
            budget = per_turn - len(seq.partial)
            if self.context is not None:
                budget = continuation_budget(per_turn, len(seq.partial), len(traj.tokens), self.context)
            if budget <= 0:
                if seq.partial and len(seq.partial) >= per_turn:  # a resumed turn that used its whole budget
                    return self._reply(seq, request, tuple(seq.partial), FinishKind.LENGTH, None, 0)
                raise self._too_long(f"the sequence holds {len(traj.tokens)} tokens; the context holds {self.context}")
            result = await self._generate(traj, request_sampling(sampling, budget, self.stops))
            if result.finish_reason.kind is FinishKind.ABORT:
                self._aborted(seq, result)
                continue  # held until resumed (the owner suspended the session), then the same turn goes on
            turn_ids = (*seq.partial, *result.output_ids)
            seq.partial = []
            return self._reply(seq, request, turn_ids, result.finish_reason.kind, result.finish_reason.matched,
                               result.cached_tokens)

    async def _generate(self, traj: Trajectory, sampling: SamplingParams) -> GenerateResult:
        rid = new_id()
        started = time.perf_counter()
        try:
            result = await self.client.generate(list(traj.tokens), sampling, rid=rid, routing_key=self.routing_key,
                                                **routing_request(traj, self.agent.routed_experts))
        except asyncio.CancelledError:
            abort = getattr(self.client, "abort", None)
            if abort is not None:
                await asyncio.shield(abort(rid))
            raise
        except PromptTooLongError as exc:
            traj.add_error(ErrorKind.PROMPT_TOO_LONG, str(exc), component="generate")
            raise self._too_long(str(exc)) from None
        except InferenceError as exc:
            traj.add_error(ErrorKind.ENGINE, f"{type(exc).__name__}: {exc}", component="generate")
            raise SessionError(502, "engine_error", f"the engine refused the request: {exc}") from None
        finally:
            self.timings["time/generate_s"] += time.perf_counter() - started
        if len(result.output_logprobs) != len(result.output_ids):
            traj.add_error(ErrorKind.ENGINE_OUTPUT, f"the engine returned {len(result.output_ids)} ids but "
                           f"{len(result.output_logprobs)} logprobs; nothing was appended", component="generate")
            raise SessionError(502, "engine_error", "the engine's answer had no logprobs")
        try:
            traj.append_model(result.output_ids, result.output_logprobs, weight_version=result.weight_version,
                              finish_reason=result.finish_reason.kind.value, message_index=len(traj.messages))
        except TrajectoryError as exc:
            traj.add_error(ErrorKind.ENGINE_OUTPUT, f"the engine's answer breaks a trajectory invariant; nothing was "
                           f"appended: {exc}", component="generate")
            raise SessionError(502, "engine_error", f"the engine's answer was unusable: {exc}") from None
        if self.agent.routed_experts is not None:
            store_routing(traj, result, self.metrics)
        self.metrics["generated_tokens"] += len(result.output_ids)
        if result.output_ids and max(result.output_ids) >= self.decodable:
            self.metrics["padding_tokens"] += sum(1 for t in result.output_ids if t >= self.decodable)
        self.metrics["prompt_tokens"] += result.prompt_tokens
        self.metrics["cached_tokens"] += result.cached_tokens
        return result

    def _aborted(self, seq: _Sequence, result: GenerateResult) -> None:
        cause = result.finish_reason.cause
        message = result.finish_reason.message or "the request was aborted"
        if cause is not None and cause.failure:
            seq.traj.add_error(ErrorKind.ENGINE, message, component="generate")
            raise SessionError(503, "engine_unavailable", f"the engine is unavailable: {message}", retry=True)
        seq.partial.extend(result.output_ids)
        self.abort_message = message
        if not self.should_abort():  # not the owner's abort: the harness retries, the retry continues the turn
            self.metrics["proxy/aborted_requests"] += 1
            raise SessionError(503, "aborted", f"the turn was aborted ({message}); retry the same request to "
                                              "continue it", retry=True)

    def _reply(self, seq: _Sequence, request: ChatRequest, turn_ids: tuple[int, ...], finish: FinishKind,
               matched: object, cached: int) -> Reply:
        """The turn as SGLang's server answers it: its tool-call parser runs only when the request lists
        tools and ``tool_choice`` is not ``none``; content is what that server returns
        (:meth:`~agentrl.chat.types.ParsedReply.served_content`: with the parser on, the text before the
        first call). The sequence keeps the whole turn as the model wrote it."""
        tools = request.render_tools
        parser_on = tools is not None
        parsed = self.template.parse(turn_ids, tools, strict=self.agent.strict_parsing,
                                     max_calls=self.agent.max_calls_per_turn)
        if parser_on:
            message = parsed.to_message()
        else:  # no parser runs: the calls stay text, as served
            message = Message("assistant", parsed.served_content(False), reasoning_content=parsed.reasoning)
        call_ids = [f"call_{secrets.token_hex(12)}" for _ in message.tool_calls]
        message.tool_calls = [ToolCall(c.name, c.arguments, cid) for c, cid in zip(message.tool_calls, call_ids,
                                                                                     strict=True)]
        shown = parsed
        if isinstance(matched, str) and matched:  # a stop string: OpenAI leaves it (and what follows) out
            text = self.template.decode(turn_ids)
            shown = self.template.parse(text[:text.find(matched)] if matched in text else text, tools,
                                        strict=self.agent.strict_parsing, max_calls=self.agent.max_calls_per_turn)
        calls = tuple((cid, c.name, c.arguments) for cid, c in zip(call_ids, shown.calls, strict=False)) \
            if parser_on else ()
        content = shown.served_content(parser_on)
        if parser_on:
            for failure in parsed.failures:
                self.metrics[f"{'tolerated' if failure.tolerated else 'failures'}/{failure.kind.value}"] += 1
        reply = Reply(response_id=f"chatcmpl-{secrets.token_hex(16)}", created=int(time.time()),
                      model=request.model or self.config.model_name, content=content, reasoning=shown.reasoning,
                      calls=calls, finish_reason="tool_calls" if calls else ("length" if finish is FinishKind.LENGTH
                                                                             else "stop"),
                      prompt_tokens=len(seq.traj.tokens) - len(turn_ids), completion_tokens=len(turn_ids),
                      cached_tokens=cached)
        seq.traj.messages.append(message)
        seq.owners.append(Issued(reply, message, turn_ids))
        self.metrics["turns"] += 1
        self.metrics["tool_calls"] += len(calls)
        self.last_finish = finish
        return reply
