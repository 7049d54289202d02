"""Episodes against an OpenAI-compatible chat-completions server: messages in, messages out.

For evaluating a baseline (a hosted API, vLLM, SGLang's ``/v1``) or generating SFT conversations
from a stronger model with the same environment and reward as training. The server applies its own
chat template and tool-call parser, so there are no token ids, loss mask or logprobs: every
trajectory here is *message-level* (:meth:`~agentrl.trajectory.Trajectory.from_messages`) and
:func:`~agentrl.train.build_training_batch` refuses it.

- :class:`ChatEndpoint`: one server (``httpx``); ``complete(messages, tools, sampling)`` returns
  the assistant :class:`~agentrl.chat.types.Message`, the parse failures of its tool calls
  (arguments that are not a JSON object) and the finish reason.
- :func:`run_message_episode`: one environment episode; the same termination as the token loop
  where it applies (``no_tool_calls``, ``max_turns``... from the environment; ``engine_length``
  when the server stopped at ``max_tokens``; ``context_budget`` when it rejected the prompt as too
  long; ``failed`` on a server error, recorded in ``trajectory.errors``); each environment step is
  counted as the token loop counts it (``failures/<kind>``, ``tolerated/<kind>``, step reward parts:
  :mod:`agentrl.rollout._env_steps`).
- :func:`evaluate_endpoint`: :func:`agentrl.rollout.eval.evaluate`'s report for such episodes.

Example::

    async with ChatEndpoint("http://127.0.0.1:30000/v1") as endpoint:
        report = await evaluate_endpoint(ToyArithmeticEnv, endpoint, rows, EvalConfig(pass_k=(1,)))
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from agentrl._tracebacks import exception_origin
from agentrl.chat.types import FailureKind, Message, ToolCall, ToolCallFailure
from agentrl.environments.base import Environment
from agentrl.episode import Episode
from agentrl.rewards.pool import RewardTimeout, shared_pool
from agentrl.rewards.types import score
from agentrl.rollout._env_steps import error_kind_of, record_step, reward_total
from agentrl.rollout.eval import EvalConfig, EvalReport, _report
from agentrl.rollout.types import SamplingParams
from agentrl.trajectory import ErrorKind, StopReason, Trajectory, status_for

__all__ = ["ChatEndpoint", "Completion", "EndpointError", "evaluate_endpoint", "run_message_episode"]

_TOO_LONG = ("context length", "context_length", "maximum context", "too long", "longer than")


class EndpointError(RuntimeError):
    """The server could not be reached or answered with an error (``status``: the HTTP status, if any)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def prompt_too_long(self) -> bool:
        return self.status == 400 and any(s in str(self).lower() for s in _TOO_LONG)


@dataclass
class Completion:
    """One answer: the assistant message, its tool-call failures, the finish reason and usage."""

    message: Message
    failures: list[ToolCallFailure]
    finish_reason: str
    usage: dict[str, int]


def chat_url(base: str) -> str:
    """``http://h:p`` / ``http://h:p/v1`` / ``.../chat/completions`` → the chat-completions URL."""
    url = base.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return f"{url}/chat/completions" if url.endswith("/v1") else f"{url}/v1/chat/completions"


def to_openai(message: Message) -> dict[str, Any]:
    """The wire form of a message: tool-call arguments as JSON text, no reasoning field."""
    out: dict[str, Any] = {"role": message.role, "content": message.content if message.content is not None else ""}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id or f"call_{i}", "type": "function",
                              "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                             for i, c in enumerate(message.tool_calls)]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def from_openai(data: Mapping[str, Any]) -> tuple[Message, list[ToolCallFailure]]:
    """The assistant message of a response choice and a failure per call whose arguments are not a JSON object."""
    calls: list[ToolCall] = []
    failures: list[ToolCallFailure] = []
    for raw in data.get("tool_calls") or []:
        fn = raw.get("function") or {}
        name, args = str(fn.get("name") or ""), fn.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else (args if args is not None else {})
        except json.JSONDecodeError as exc:
            parsed = exc
        if not isinstance(parsed, dict):
            failures.append(ToolCallFailure(FailureKind.MALFORMED_JSON, f"arguments of {name!r} are not a JSON "
                                            f"object: {args!r:.120}", raw=str(args), tool_name=name))
            continue
        calls.append(ToolCall(name=name, arguments=parsed, id=raw.get("id")))
    reasoning = data.get("reasoning_content")
    message = Message("assistant", data.get("content") or "", reasoning_content=reasoning or None, tool_calls=calls)
    return message, failures


class ChatEndpoint:
    """An OpenAI-compatible server. ``model`` ``None``: the first model ``GET /v1/models`` lists."""

    def __init__(self, url: str, *, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 600.0, max_connections: int = 64) -> None:
        self.url = chat_url(url)
        self.model, self.api_key = model, api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(timeout=timeout_s, headers=headers,
                                       limits=httpx.Limits(max_connections=max_connections))
        self._model_lock = asyncio.Lock()

    async def __aenter__(self) -> ChatEndpoint:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def model_name(self) -> str:
        async with self._model_lock:
            if self.model is None:
                models_url = self.url.removesuffix("/chat/completions") + "/models"
                data = await self._request("GET", models_url)
                listed = [m.get("id") for m in data.get("data") or [] if isinstance(m, dict)]
                if not listed or not isinstance(listed[0], str):
                    raise EndpointError(f"{models_url}: lists no model; pass the model name")
                self.model = listed[0]
            return self.model

    async def _request(self, method: str, url: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        try:
            resp = await self._http.request(method, url, json=body)
        except httpx.HTTPError as exc:
            raise EndpointError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise EndpointError(f"{method} {url}: HTTP {resp.status_code}: {resp.text[:300]}", status=resp.status_code)
        try:
            data = resp.json()
        except ValueError as exc:
            raise EndpointError(f"{method} {url}: the answer is not JSON: {resp.text[:200]!r}") from exc
        if not isinstance(data, dict):
            raise EndpointError(f"{method} {url}: expected a JSON object, got {type(data).__name__}")
        return data

    async def complete(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]],
                       sampling: SamplingParams) -> Completion:
        body: dict[str, Any] = {"model": await self.model_name(), "messages": [to_openai(m) for m in messages],
                                "max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                                "top_p": sampling.top_p}
        if tools:
            body["tools"] = list(tools)
        if sampling.sampling_seed is not None:
            body["seed"] = sampling.sampling_seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        data = await self._request("POST", self.url, body)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0].get("message"), dict):
            raise EndpointError(f"POST {self.url}: expected choices[0].message, got {str(data)[:200]}")
        message, failures = from_openai(choices[0]["message"])
        usage = {k: int(v) for k, v in (data.get("usage") or {}).items() if isinstance(v, int)}
        return Completion(message, failures, str(choices[0].get("finish_reason") or "stop"), usage)


class _MessageEpisode:
    def __init__(self, env: Environment, endpoint: ChatEndpoint, sampling: SamplingParams, ids: dict[str, Any]) -> None:
        self.env, self.endpoint, self.sampling, self.ids = env, endpoint, sampling, ids
        self.metrics: Counter[str] = Counter()
        self.reward_parts: dict[str, float] = {}
        self.env_info: list[dict[str, Any]] = []

    async def run(self, reward_timeout_s: float | None) -> Episode:
        traj = Trajectory.from_messages(await self.env.reset(), **self.ids)
        traj.info["endpoint"] = self.endpoint.url
        started = time.perf_counter()
        reason = await self._loop(traj, self.env.tool_specs())
        traj.finish(status_for(reason), reason)
        traj.metrics.update({k: float(v) for k, v in self.metrics.items()})
        traj.metrics.update({"tool_calls": float(self.env.tool_calls), "time/endpoint_s": time.perf_counter() - started,
                             "successful_tool_calls": float(self.env.successful_tool_calls)})
        await self._score(traj, reward_timeout_s)
        return Episode(sequences=[traj], env_info=self.env_info)

    async def _loop(self, traj: Trajectory, tools: list[dict[str, Any]]) -> StopReason:
        while True:
            try:
                answer = await self.endpoint.complete(traj.messages, tools, self.sampling)
            except EndpointError as exc:
                traj.add_error(ErrorKind.PROMPT_TOO_LONG if exc.prompt_too_long else ErrorKind.ENGINE, str(exc),
                               component="endpoint")
                return StopReason.CONTEXT_BUDGET if exc.prompt_too_long else StopReason.FAILED
            traj.messages.append(answer.message)
            self.metrics["turns"] += 1
            for key, count in answer.usage.items():
                self.metrics[f"usage/{key}"] += count
            if answer.finish_reason == "length":
                return StopReason.ENGINE_LENGTH
            try:
                step = await self.env.step(answer.message, answer.failures)
            except Exception as exc:  # the environment's bug (or the sandbox fleet's failure) ends it as a value
                traj.add_error(error_kind_of(exc, ErrorKind.ENV), f"{type(exc).__name__}: {exc}", component="step",
                               origin=exception_origin(exc))
                return StopReason.FAILED
            reason = record_step(self, traj, step)
            if reason is not None:
                return reason
            traj.messages.extend(step.messages)

    async def _score(self, traj: Trajectory, timeout_s: float | None) -> None:
        try:
            reward = await score(self.env.reward, traj, timeout_s=timeout_s, pool=shared_pool())
        except Exception as exc:
            kind = error_kind_of(exc, ErrorKind.REWARD_TIMEOUT if isinstance(exc, RewardTimeout) else ErrorKind.REWARD)
            traj.add_error(kind, f"{type(exc).__name__}: {exc}", component="reward", origin=exception_origin(exc))
            return
        traj.reward, traj.reward_parts = reward_total(self, reward)
        if reward.info:
            traj.info["reward_info"] = dict(reward.info)


async def run_message_episode(env: Environment | Any, endpoint: ChatEndpoint, sampling: SamplingParams, *,
                              group_id: str | None = None, sample_id: str | None = None,
                              reward_timeout_s: float | None = 300.0) -> Episode:
    """Runs ``env`` to the end against ``endpoint``; a message-level, scored :class:`Episode`. Closes ``env``.
    An episode that brings its own loop (``env.run_on_endpoint(endpoint, sampling, **ids)``: an agent
    harness, :class:`agentrl.proxy.AgentEpisode`) runs it instead."""
    run_on = getattr(env, "run_on_endpoint", None)
    if run_on is not None:
        episode: Episode = await run_on(endpoint, sampling, group_id=group_id, sample_id=sample_id,
                                        reward_timeout_s=reward_timeout_s)
        return episode
    ids = {"group_id": group_id, "sample_id": sample_id, "rollout_id": uuid.uuid4().hex}
    try:
        return await _MessageEpisode(env, endpoint, sampling, ids).run(reward_timeout_s)
    finally:
        await env.close()


async def evaluate_endpoint(env_factory: Callable[[dict[str, Any]], Environment], endpoint: ChatEndpoint,
                            rows: Sequence[Mapping[str, Any]], config: EvalConfig | None = None, *,
                            max_new_tokens: int = 1024) -> EvalReport:
    """:func:`agentrl.rollout.eval.evaluate` against a chat-completions server (message-level episodes).
    ``config.sampling`` ``None``: greedy with ``max_new_tokens`` per turn."""
    cfg = config or EvalConfig()
    sampling = cfg.sampling or SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    limit = asyncio.Semaphore(cfg.max_concurrency)
    started = time.perf_counter()

    async def one(row: Mapping[str, Any], i: int, j: int) -> Episode:
        async with limit:
            return await run_message_episode(env_factory(dict(row)), endpoint, sampling, group_id=f"{cfg.name}:{i}",
                                             sample_id=f"{cfg.name}:{i}:{j}")

    per_prompt = await asyncio.gather(*(asyncio.gather(*(one(row, i, j) for j in range(cfg.samples_per_prompt)))
                                        for i, row in enumerate(rows)))
    return _report(cfg, per_prompt, time.perf_counter() - started)
