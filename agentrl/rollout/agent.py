"""The multi-turn agent loop: one environment episode, driven token-in / token-out.

:func:`run_episode` owns the token boundary of an episode:

1. render the environment's opening messages once with the :class:`~agentrl.chat.ChatTemplate`
   (tools listed, generation prompt added);
2. generate through a :class:`GenerateClient` (the SGLang client, or a scripted policy in tests),
   stopping on the template's stop tokens;
3. ``append_model`` the sampled ids and logprobs **verbatim** (never re-tokenised);
4. parse the decoded ids into an assistant message plus typed failures;
5. ``env.step`` (the environment sees messages, never ids);
6. bridge the returned messages with the template (prefix-checked) and ``append_env`` the pieces —
   a synthetic turn close as ``scaffold`` when the turn stopped on ``</tool_call>``, then the tool
   or user segment in the template's own framing; repeat.

The bridge runs as a :class:`~agentrl.chat.bridge.BridgeSession`, which proves each next prompt
equals a full render of the conversation. When a sampled turn does not re-render to the text the
model wrote (``sampled_text_differs``: key order, spacing...), the sampled ids still stand (token
in, token out), the outcome is counted in ``metrics["bridge/sampled_text_differs"]``, and later
turns use the stateless prefix-checked bridge (:meth:`~agentrl.chat.ChatTemplate.bridge`).

Termination (first terminal condition wins; the trajectory never overwrites an earlier one):

=====================  ==========  ==================================================================
stop reason            status      when
=====================  ==========  ==================================================================
``aborted``            aborted     ``should_abort()`` before a request, or the turn was aborted on
                                   purpose (by the engine or the client; reason in ``info``)
``context_budget``     truncated   no room left for another token, a later turn's prompt was rejected
                                   as too long, the turn hit a budget the context imposed, or the
                                   next env segment would not fit
``engine_length``      truncated   the turn hit the per-turn ``max_new_tokens``
``max_sampled_tokens`` truncated   the rollout sampled ``EnvLimits.max_sampled_tokens`` (all its sequences)
``no_tool_calls``      completed   the model answered without calling a tool
``max_tool_calls``     completed   the turn asked for more calls than the environment allows
``max_turns``          completed   the environment's turn limit
``env_done``           completed   the environment ended the episode for its own reasons
``failed``             failed      failure policy ``end``, an environment exception, a malformed
                                   engine answer (e.g. no logprobs), an engine that could not be
                                   reached or ran past the deadline, or an opening prompt that
                                   alone fills the context (nothing could be sampled; its
                                   ``prompt_too_long`` error says why)
=====================  ==========  ==================================================================

The status of each stop reason is :func:`agentrl.trajectory.status_for`. Whatever went wrong is an
:class:`~agentrl.trajectory.EpisodeError` in ``trajectory.errors`` (kind, message, turn, component,
tool call id): ``engine`` / ``engine_output`` / ``prompt_too_long`` from a request, ``env`` from
``step()``, ``parse`` / ``tool`` / ``sandbox`` when the failure policy ends the episode, ``bridge``,
``reward``.

Token ids: the engine samples from the model's vocabulary, which checkpoints pad beyond the
tokenizer (the tiny test model has 1,792 rows for 1,790 tokens; Qwen3 151,936 for 151,669). An id
in ``[len(tokenizer), vocab_size)`` is a *padding id*: a real action of the policy, so it is kept
verbatim with its logprob and trained on like any sampled token; it has no text, so it decodes to
nothing (the parser, the bridge and rewards never see it). ``metrics["padding_tokens"]`` counts them.
Ids at or above ``AgentConfig.vocab_size`` (the model's embedding rows, when given) or below 0 fail
the episode without appending anything; the trainer checks ids against its own embedding again.

Budget: every request asks for ``min(per-turn max_new_tokens, context − len(tokens))`` where the
context is the smaller of the engine's ``context_length`` and the environment's
``max_context_tokens``; a value ≤ 0 truncates without sending a request.

Not append-only: when the bridge reports that the full render rewrites history (a new user query
strips earlier reasoning), the episode forks: a new sequence starts from the fresh full render and
shares the rollout id. :class:`Episode` holds every sequence; all of them get the episode's final
status and reward. An environment's context policy (:mod:`agentrl.rollout.context`, run by
:mod:`agentrl.rollout._compaction`) forks the same way when the next request would pass its trigger.

Suspending and resuming (partial rollouts): :class:`EpisodeRunner` is the loop itself, as an object.
``await runner.advance(should_abort)`` runs until the episode ends (it returns the :class:`Episode`) or
until it is aborted (it returns ``None``; the runner is *suspended*): the trajectory keeps every token
sampled so far, including the first part of a turn the engine cut short, and the environment stays
open. A later ``advance`` continues the *same* assistant turn from those tokens, asking only for what
is left of the turn's budget (:func:`~agentrl.rollout.types.continuation_budget`), and parses the
turn as a whole once it ends. Each model segment keeps the weight version that produced it.
:func:`run_episode` is ``advance`` once, with an abort ending the episode as ``aborted``.

Example::

    episode = await run_episode(env, template, client, AgentConfig(sampling=SamplingParams(max_new_tokens=512)))
    traj = episode.trajectory          # the last (usually only) sequence
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

from agentrl._tracebacks import exception_origin
from agentrl.chat.bridge import BridgeOutcome, BridgeResult, BridgeSession
from agentrl.chat.template import ChatTemplate
from agentrl.chat.types import Message, ToolCallFailure
from agentrl.environments.base import Environment
from agentrl.episode import Episode
from agentrl.rewards.pool import RewardTimeout, shared_pool
from agentrl.rewards.types import Reward, score
from agentrl.rollout._agent_config import AgentConfig, env_hook
from agentrl.rollout._compaction import Compactor
from agentrl.rollout._env_steps import error_kind_of, record_step, reward_total
from agentrl.rollout._requests import GenerateClient, new_id, request_sampling
from agentrl.rollout.opening import OpeningCache
from agentrl.rollout.pacing import Pacer
from agentrl.rollout.routing import missing_routing, routing_request, store_routing
from agentrl.rollout.types import (
    FinishKind,
    InferenceError,
    PromptTooLongError,
    continuation_budget,
)
from agentrl.trajectory import (
    ErrorKind,
    ForkReason,
    SegmentKind,
    Status,
    StopReason,
    Trajectory,
    TrajectoryError,
    status_for,
)

# Episode lives in agentrl.episode (saving and batching it need no rollout code); re-exported here.
__all__ = ["AgentConfig", "Episode", "EpisodeRunner", "GenerateClient", "run_episode", "status_for"]


def _never() -> bool:
    return False


PROMPT_TOO_LONG = "prompt too long: "  # how the error of an opening prompt that cannot fit begins


def runner_for(env: Any, template: ChatTemplate, client: GenerateClient, config: AgentConfig | None = None,
               **kwargs: Any) -> EpisodeRunner:
    """The runner of one episode: ``env.make_runner(template, client, config, **kwargs)`` when the
    environment brings its own (an agent harness behind the proxy, :class:`agentrl.proxy.AgentEpisode`,
    whose runner has the same surface), else an :class:`EpisodeRunner`."""
    make = getattr(env, "make_runner", None)
    if make is not None:
        return cast("EpisodeRunner", make(template, client, config, **kwargs))
    return EpisodeRunner(env, template, client, config, **kwargs)


async def run_episode(env: Environment, template: ChatTemplate, client: GenerateClient,
                      config: AgentConfig | None = None, *, group_id: str | None = None,
                      rollout_id: str | None = None, sample_id: str | None = None,
                      should_abort: Callable[[], bool] | None = None) -> Episode:
    """Runs ``env`` to the end and returns its :class:`Episode`; always closes ``env``.

    Errors become values: an environment exception in ``step``, a bad engine answer or a reward
    failure ends the episode as documented and is recorded in ``trajectory.errors``. An exception in
    ``reset()`` or in rendering the opening propagates (there is no trajectory without a prompt). A cancelled task aborts its
    in-flight request (when the client has ``abort``) and re-raises ``CancelledError``.
    """
    try:
        runner = EpisodeRunner(env, template, client, config, group_id=group_id, rollout_id=rollout_id,
                               sample_id=sample_id)
    except BaseException:
        await env.close()
        raise
    try:
        episode = await runner.advance(should_abort)
        return episode if episode is not None else runner.finish_aborted()
    finally:
        await runner.close()


class EpisodeRunner:
    """One episode's agent loop as a resumable object (see "Suspending and resuming" in the module doc).

    Single-use: built for one environment, advanced until :meth:`advance` returns an :class:`Episode`
    (or :meth:`finish_aborted` gives up on a suspended one), then closed with :meth:`close`. ``tool_slots``
    bounds concurrent environment steps that run tool calls (shared by the episodes of a scheduler);
    ``opening_cache`` renders a group's shared opening once; ``pacer`` spreads the CPU work of many
    episodes over event-loop passes (:class:`~agentrl.rollout.pacing.Pacer`). Not thread-safe.
    """

    def __init__(self, env: Environment, template: ChatTemplate, client: GenerateClient,
                 config: AgentConfig | None = None, *, group_id: str | None = None, rollout_id: str | None = None,
                 sample_id: str | None = None, tool_slots: asyncio.Semaphore | None = None,
                 opening_cache: OpeningCache | None = None, pacer: Pacer | None = None) -> None:
        config = config or AgentConfig()
        self.env, self.template, self.client, self.config = env, template, client, config
        self.group_id, self.rollout_id, self.sample_id = group_id, rollout_id or new_id(), sample_id
        self.should_abort: Callable[[], bool] = _never
        self.tool_slots = tool_slots
        self.opening_cache = opening_cache
        self.pacer = pacer
        self.tools: list[dict[str, Any]] = []  # read after reset(): environments may register tools there
        self.kwargs = dict(config.template_kwargs)
        own = template.stop_token_ids(one_call_per_turn=config.one_call_per_turn)  # raises without a tokenizer
        self.decodable = len(template.tokenizer)  # ids from here up to vocab_size are padding ids
        if config.vocab_size is not None and config.vocab_size < self.decodable:
            raise ValueError(f"AgentConfig.vocab_size={config.vocab_size} is smaller than the tokenizer "
                             f"({self.decodable} tokens); expected the model's vocabulary (tokenizer and model differ?)")
        self.vocab_size = config.vocab_size  # every sequence checks its ids against it
        self.stops = tuple(dict.fromkeys((*own, *config.sampling.stop_token_ids)))  # the template's, plus the user's
        limits = [c for c in (config.context_length, env.limits.max_context_tokens) if c is not None]
        self.context = min(limits) if limits else None
        self.max_sampled = env.limits.max_sampled_tokens
        self._bound_by_sampled = False
        policy = getattr(env, "context_policy", None)  # raises here when its trigger needs a context there is not
        self.compactor = Compactor(policy, template, self.context, self.kwargs) if policy is not None else None
        self.opening_size = 0  # messages of the episode's opening (reset()): what every compaction keeps
        self.sequences: list[Trajectory] = []
        self.metrics: Counter[str] = Counter()
        self.timings: dict[str, float] = {"time/generate_s": 0.0, "time/env_s": 0.0, "time/reward_s": 0.0}
        self.reward_parts: dict[str, float] = {}
        self.env_info: list[dict[str, Any]] = []
        self._pending_failures: list[ToolCallFailure] = []
        self._last_ids: tuple[int, ...] = ()
        self._turn_ids: list[int] = []  # ids of the current turn sampled before an abort (a partial turn)
        self.bridge_session: BridgeSession | None = None
        self.suspensions = 0
        self.abort_message: str | None = None  # the engine's or client's message of the last aborted turn
        self._result: Episode | None = None
        self._closed = False

    @property
    def traj(self) -> Trajectory:
        return self.sequences[-1]

    @property
    def started(self) -> bool:
        return bool(self.sequences)

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def partial_turn_tokens(self) -> int:
        """Tokens of the current turn sampled before the last abort (0 between turns)."""
        return len(self._turn_ids)

    def episode(self) -> Episode:
        """The episode as it stands (its sequences may still be running when suspended)."""
        return self._result if self._result is not None else Episode(sequences=self.sequences, env_info=self.env_info)

    async def advance(self, should_abort: Callable[[], bool] | None = None) -> Episode | None:
        """Runs until the episode ends (returns it, scored) or is aborted (returns None: suspended).

        ``should_abort`` is checked before every engine request; an engine answer that was aborted
        suspends too. Calling ``advance`` again resumes; after the episode ended it returns it again.
        """
        if self._result is not None:
            return self._result
        if self._closed:
            raise RuntimeError("EpisodeRunner.advance: the runner is closed")
        self.should_abort = should_abort or _never
        try:
            return await self._advance()
        finally:
            # the caller's check often holds what holds this runner (a scheduler's member): keeping it
            # would make every finished episode a reference cycle, left to the cyclic collector
            self.should_abort = _never

    async def _advance(self) -> Episode | None:
        if not self.sequences:
            if self.pacer is not None:
                await self.pacer.turn()
            await self._start()
        reason = await self._loop()
        if reason is StopReason.ABORTED:
            self.suspensions += 1
            return None
        self._finish(reason)
        if self.pacer is not None:
            await self.pacer.turn()
        started = time.perf_counter()
        await self._score()
        self.traj.metrics["time/reward_s"] = time.perf_counter() - started
        self._result = Episode(sequences=self.sequences, env_info=self.env_info)
        return self._result

    def finish_aborted(self) -> Episode:
        """Ends a suspended (or never started) episode as ``aborted``, unscored."""
        if self._result is not None:
            return self._result
        if self.sequences:
            self._finish(StopReason.ABORTED)
            if self.abort_message:
                self.traj.info.setdefault("abort_reason", self.abort_message)
        self._result = Episode(sequences=self.sequences, env_info=self.env_info)
        return self._result

    async def close(self) -> None:
        """Closes the environment (once), within the environment's deadline (past it, the close is
        left behind: a hook cannot be killed)."""
        if not self._closed:
            self._closed = True
            await env_hook("close", self.env.close(), self.config.env_timeout_s)

    async def _start(self) -> None:
        opening = await env_hook("reset", self.env.reset(), self.config.env_timeout_s)
        self.tools = self.env.tool_specs()
        if self.opening_cache is not None:
            self.bridge_session = self.opening_cache.session(opening, tools=self.tools, **self.kwargs)
        else:
            self.bridge_session = BridgeSession(self.template, opening, tools=self.tools, **self.kwargs)
        prompt_ids = self.bridge_session.prompt_ids
        self.opening_size = len(opening)
        group_id = self.group_id
        session = group_id if self.config.routing == "group" and group_id else new_id()
        self.sequences.append(Trajectory.from_prompt(prompt_ids, messages=list(opening), vocab_size=self.vocab_size,
                                                     group_id=group_id, rollout_id=self.rollout_id,
                                                     sample_id=self.sample_id, session_id=session))

    async def _loop(self) -> StopReason:
        while True:
            if self.should_abort():
                return StopReason.ABORTED
            if self.compactor is not None and self.compactor.summarizing:
                stop = await self.compactor.finish_summary(self)  # the summary turn (resumed after an abort)
                if stop is not None:
                    return stop
                continue
            budget = self.budget()
            if budget <= 0:
                if self._turn_ids and len(self._turn_ids) >= self.config.sampling.max_new_tokens:
                    return self._end_partial_turn()  # a resumed turn that had used its whole budget
                if self._bound_by_sampled:
                    return StopReason.MAX_SAMPLED_TOKENS
                if self._nothing_sampled():
                    return self._prompt_too_long(f"the context holds {self.context}")
                return StopReason.CONTEXT_BUDGET
            started = time.perf_counter()
            try:
                outcome = await self._generate(budget)
            finally:
                self.timings["time/generate_s"] += time.perf_counter() - started
            if isinstance(outcome, StopReason):
                return outcome
            started = time.perf_counter()
            try:
                reason = await self._env_turn(outcome)
            finally:
                self.timings["time/env_s"] += time.perf_counter() - started
            if reason is not None:
                return reason

    def budget(self, per_turn: int | None = None) -> int:
        """What the next request of the current turn may ask for: what is left of the turn's budget
        (``per_turn``, default the sampling's ``max_new_tokens``), of the context and of the rollout's
        sampled tokens (``max_sampled_tokens``; ``_bound_by_sampled`` says when that was the least)."""
        per_turn = self.config.sampling.max_new_tokens if per_turn is None else per_turn
        if self.context is None:
            budget = max(0, per_turn - len(self._turn_ids))
        else:
            budget = continuation_budget(per_turn, len(self._turn_ids), len(self.traj.tokens), self.context)
        left = None if self.max_sampled is None else self.max_sampled - self.metrics["generated_tokens"]
        self._bound_by_sampled = left is not None and left < budget
        return max(0, left) if left is not None and left < budget else budget


    async def _generate(self, budget: int) -> StopReason | Message:
        """One model turn: request, append verbatim, parse. Returns the parsed message or a stop reason."""
        outcome = await self.request(budget)
        if isinstance(outcome, StopReason):
            return outcome
        turn_ids, finish = outcome
        traj = self.traj
        self._last_ids = turn_ids
        self.metrics["turns"] += 1
        parsed = self.template.parse(turn_ids, self.tools, strict=self.config.strict_parsing,
                                     max_calls=self.config.max_calls_per_turn)
        message = parsed.to_message()
        traj.messages.append(message)
        if finish is FinishKind.LENGTH:
            traj.info["last_message_partial"] = True
            if len(turn_ids) < self.config.sampling.max_new_tokens:
                return StopReason.MAX_SAMPLED_TOKENS if self._bound_by_sampled else StopReason.CONTEXT_BUDGET
            return StopReason.ENGINE_LENGTH
        self._pending_failures = parsed.failures
        return message

    async def request(self, budget: int) -> StopReason | tuple[tuple[int, ...], FinishKind]:
        """Sends one request for the current turn and appends the sampled ids verbatim. Returns the whole
        turn's ids (with what earlier, aborted requests of it sampled) and how it finished, or a stop
        reason (``aborted``: suspended, the partial turn kept for the next request)."""
        traj, rid = self.traj, new_id()
        sampling = request_sampling(self.config.sampling, budget, self.stops)
        try:
            result = await self.client.generate(list(traj.tokens), sampling, rid=rid, routing_key=traj.session_id,
                                                **routing_request(traj, self.config.routed_experts))
        except asyncio.CancelledError:
            abort = getattr(self.client, "abort", None)
            if abort is not None:
                await asyncio.shield(abort(rid))
            raise
        except PromptTooLongError as exc:
            if self._nothing_sampled():
                return self._prompt_too_long(f"the engine refused it: {exc}")
            traj.add_error(ErrorKind.PROMPT_TOO_LONG, str(exc), component="generate")
            return StopReason.CONTEXT_BUDGET
        except InferenceError as exc:
            traj.add_error(ErrorKind.ENGINE, f"{type(exc).__name__}: {exc}", component="generate")
            return StopReason.FAILED
        if self.pacer is not None:  # many answers arrive together: take turns with the other episodes
            await self.pacer.turn()
        if len(result.output_logprobs) != len(result.output_ids):
            traj.add_error(ErrorKind.ENGINE_OUTPUT, f"the engine returned {len(result.output_ids)} ids but "
                           f"{len(result.output_logprobs)} logprobs; nothing was appended", component="generate")
            return StopReason.FAILED
        try:
            traj.append_model(result.output_ids, result.output_logprobs, weight_version=result.weight_version,
                              finish_reason=result.finish_reason.kind.value, message_index=len(traj.messages))
        except TrajectoryError as exc:  # e.g. a positive logprob or an id outside the vocabulary
            traj.add_error(ErrorKind.ENGINE_OUTPUT, f"the engine's answer breaks a trajectory invariant; nothing was "
                           f"appended: {exc}", component="generate")
            return StopReason.FAILED
        if self.config.routed_experts is not None:
            store_routing(traj, result, self.metrics)
        self.metrics["generated_tokens"] += len(result.output_ids)
        if result.output_ids and max(result.output_ids) >= self.decodable:  # rare: counted only when present
            self.metrics["padding_tokens"] += sum(1 for t in result.output_ids if t >= self.decodable)
        self.metrics["prompt_tokens"] += result.prompt_tokens
        self.metrics["cached_tokens"] += result.cached_tokens
        if result.finish_reason.kind is FinishKind.ABORT:
            cause = result.finish_reason.cause
            if cause is not None and cause.failure:  # the engine is down or too slow: a failure with its reason
                traj.add_error(ErrorKind.ENGINE, result.finish_reason.message or f"the request ended: {cause.value}",
                               component="generate")
                return StopReason.FAILED
            self.abort_message = result.finish_reason.message
            self._turn_ids.extend(result.output_ids)  # resumed later from here, same turn
            return StopReason.ABORTED
        turn_ids = (*self._turn_ids, *result.output_ids)
        self._turn_ids = []
        return turn_ids, result.finish_reason.kind

    def _nothing_sampled(self) -> bool:
        """Nothing was generated in this episode yet: the only tokens are the opening prompt's."""
        return len(self.sequences) == 1 and not self._turn_ids and not self.traj.segments_of(SegmentKind.MODEL)

    def _prompt_too_long(self, detail: str) -> StopReason:
        """The opening prompt leaves no room for a single token: there is nothing to train on, and
        running it again cannot help. The episode fails with the reason (the scheduler does not regenerate it)."""
        self.traj.add_error(
            ErrorKind.PROMPT_TOO_LONG,
            f"{PROMPT_TOO_LONG}sample {self.sample_id}'s opening prompt has {len(self.traj.tokens)} tokens and {detail}; expected a "
            "prompt that leaves room for the reply (shorten the row or raise the context)", component="generate")
        return StopReason.FAILED

    def _end_partial_turn(self) -> StopReason:
        """A resumed turn whose earlier parts used the whole per-turn budget: it ends as if cut by length."""
        turn_ids = tuple(self._turn_ids)
        self._turn_ids = []
        self._last_ids = turn_ids
        self.metrics["turns"] += 1
        parsed = self.template.parse(turn_ids, self.tools, strict=self.config.strict_parsing,
                                     max_calls=self.config.max_calls_per_turn)
        self.traj.messages.append(parsed.to_message())
        self.traj.info["last_message_partial"] = True
        return StopReason.ENGINE_LENGTH

    async def _env_turn(self, message: Message) -> StopReason | None:
        """One environment step and its bridge. Returns a stop reason when the episode ends."""
        traj = self.traj
        deadline = self.config.env_timeout_s
        try:
            if self.tool_slots is not None and message.tool_calls:
                async with self.tool_slots:
                    step = await env_hook("step", self.env.step(message, self._pending_failures), deadline)
            else:
                step = await env_hook("step", self.env.step(message, self._pending_failures), deadline)
        except Exception as exc:  # the environment's bug (or the sandbox fleet's failure) ends it as a value
            traj.add_error(error_kind_of(exc, ErrorKind.ENV), f"{type(exc).__name__}: {exc}", component="step",
                           origin=exception_origin(exc))
            return StopReason.FAILED
        reason = record_step(self, traj, step)
        if reason is not None:
            return reason
        try:
            bridge = self._bridge(message, step.messages)
        except ValueError as exc:  # ChatTemplateError included: the template rejected the conversation
            traj.add_error(ErrorKind.BRIDGE, str(exc), component="bridge")
            return StopReason.FAILED
        if self.compactor is not None and self.compactor.due(self.next_prompt_tokens(bridge)):
            return await self.compactor.compact(self, step.messages, bridge)
        return self._append(bridge, step.messages)

    def next_prompt_tokens(self, bridge: BridgeResult) -> int:
        """The next request's prompt length once ``bridge`` is applied (a fork's full render, else the
        sequence plus the bridged pieces)."""
        if bridge.outcome is BridgeOutcome.NOT_APPEND_ONLY:
            assert bridge.full_render_ids is not None
            return len(bridge.full_render_ids)
        return len(self.traj.tokens) + sum(len(p.ids) for p in bridge.pieces)

    def _bridge(self, message: Message, new: list[Message]) -> BridgeResult:
        if self.compactor is not None:  # a summary bridges the turn again, with its instruction
            self.compactor.session_before = copy.copy(self.bridge_session)
        if self.bridge_session is not None:
            result = self.bridge_session.step(self._last_ids, message, new)
            if result.outcome is not BridgeOutcome.APPEND:
                self.bridge_session = None  # the session ends here; later turns use the stateless bridge
            return result
        return self.template.bridge(self.traj.tokens, self.traj.messages, new, tools=self.tools,
                                    audit=self.config.audit, **self.kwargs)

    def _append(self, bridge: BridgeResult, new: list[Message]) -> StopReason | None:
        traj = self.traj
        if bridge.outcome is BridgeOutcome.SAMPLED_TEXT_DIFFERS or bridge.history_matches is False:
            self.metrics["bridge/sampled_text_differs"] += 1
        if bridge.control_tokens:  # tolerated: serving tokenises the same text the same way (docs/chat.md)
            self.metrics["bridge/control_tokens_in_env_text"] += bridge.control_tokens
            traj.info.setdefault("control_tokens_in_env_text", bridge.notes[0])
        if bridge.outcome is BridgeOutcome.NOT_APPEND_ONLY:
            assert bridge.full_render_ids is not None
            if self.context is not None and len(bridge.full_render_ids) >= self.context:
                traj.info["unsent_messages"] = [m.to_dict() for m in new]
                return StopReason.CONTEXT_BUDGET
            self.metrics["bridge/fork"] += 1
            self.open_sequence(bridge.full_render_ids, [*traj.messages, *new], ForkReason.TEMPLATE,
                               {"forked_because": bridge.reason})
            return None
        if self.context is not None and len(traj.tokens) + len(bridge.ids) >= self.context:
            traj.info["unsent_messages"] = [m.to_dict() for m in new]
            return StopReason.CONTEXT_BUDGET
        self.metrics["bridge/append"] += 1
        first_new = len(traj.messages)
        for piece in bridge.pieces:
            kind = SegmentKind(piece.kind)
            traj.append_env(piece.ids, kind=kind, message_index=None if kind is SegmentKind.SCAFFOLD else first_new)
            self.metrics[f"{kind.value}_tokens"] += len(piece.ids)
        traj.messages.extend(new)
        return None

    def open_sequence(self, prompt_ids: Sequence[int], messages: list[Message], reason: ForkReason,
                      info: dict[str, Any], bridge: BridgeSession | None = None) -> Trajectory:
        """Starts the episode's next sequence (same ids, ``fork_reason``) from ``prompt_ids``, the render of
        ``messages``; later turns bridge on ``bridge`` (a new session over ``messages`` when None)."""
        last = self.traj
        seq = Trajectory.from_prompt(prompt_ids, messages=messages, vocab_size=self.vocab_size,
                                     group_id=last.group_id, rollout_id=last.rollout_id, sample_id=last.sample_id,
                                     session_id=last.session_id)
        seq.sequence_index = len(self.sequences)
        seq.fork_reason = reason
        seq.info.update(info)
        self.sequences.append(seq)
        self.bridge_session = bridge or BridgeSession(self.template, messages, tools=self.tools, **self.kwargs)
        return seq

    def _finish(self, reason: StopReason) -> None:
        status = status_for(reason)
        for seq in self.sequences:
            seq.finish(status, reason)
        if self.config.routed_experts is not None:
            self.metrics["routing/missing_tokens"] += sum(missing_routing(seq) for seq in self.sequences)
        last = self.traj
        last.metrics.update({k: float(v) for k, v in self.metrics.items()})
        last.metrics.update(self.timings)
        last.metrics["sequences"] = float(len(self.sequences))
        last.metrics["tool_calls"] = float(self.env.tool_calls)
        last.metrics["successful_tool_calls"] = float(self.env.successful_tool_calls)

    async def _score(self) -> None:
        """Scores every episode but an aborted one (it may be resumed) or one the sandbox fleet failed (it is
        regenerated; its reward would meet the same failure); adds step-level shaping."""
        last = self.traj
        if last.status is Status.ABORTED or last.error_of(ErrorKind.SANDBOX_UNAVAILABLE, ErrorKind.EXECUTOR_LOST):
            return
        try:
            reward = await score(self.env.reward, last, timeout_s=self.config.reward_timeout_s,
                                 pool=shared_pool() if self.config.reward_pool else None)
        except Exception as exc:  # a reward failure: scored by the policy, never resampled (the fleet's: regenerated)
            kind = error_kind_of(exc, ErrorKind.REWARD_TIMEOUT if isinstance(exc, RewardTimeout) else ErrorKind.REWARD)
            last.add_error(kind, f"{type(exc).__name__}: {exc}", component="reward", origin=exception_origin(exc))
            last.metrics["reward_failed"] = 1.0
            if self.config.reward_failure != "zero" or kind.value not in ("reward", "reward_timeout"):
                return
            reward = Reward(0.0, parts={"reward_failed": 0.0})
        total, parts = reward_total(self, reward)
        for seq in self.sequences:
            seq.reward, seq.reward_parts = total, dict(parts)
        if reward.info:
            last.info["reward_info"] = dict(reward.info)
