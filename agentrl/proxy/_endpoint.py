"""An agent harness evaluated against an OpenAI-compatible endpoint (``agentrl eval --endpoint``).

No proxy is involved: the harness's OpenAI client talks to the endpoint itself, which applies its own
chat template and tool-call parser, so the episode is *message-level* like every endpoint episode
(:mod:`agentrl.rollout.endpoint`; never trained on). The client's HTTP transport sees each chat
completion on its way:

- the request's ``model`` is set to the endpoint's (the proxy accepts any name a harness writes; a
  real server serves its own), ``temperature`` and ``top_p`` to the evaluation's sampling, as the
  proxy pins them in training, and ``max_tokens`` / ``max_completion_tokens`` capped at its per-turn
  budget;
- the last request's messages and the reply to it (streamed or not) become the episode's conversation,
  its ``finish_reason`` the stop reason (``length``: ``engine_length``), the answers' ``usage`` its
  ``usage/...`` metrics and the number of completions its ``turns``.

``run`` gets ``Agent.timeout_s`` (a thread running a plain ``def run`` cannot be stopped: past the
deadline the episode ends and the thread finishes alone). ``run`` raising is an ``agent`` error with
where it was raised, past its deadline ``agent_timeout``, returning without a completion ``agent``:
the episode fails. Otherwise ``info["answer"]`` is what ``run`` returned, scored by the agent's reward.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from agentrl._tracebacks import exception_origin
from agentrl.chat.types import Message
from agentrl.episode import Episode
from agentrl.proxy._wire import RequestError, _message
from agentrl.rewards.pool import RewardTimeout, shared_pool
from agentrl.rewards.types import score
from agentrl.rollout.endpoint import ChatEndpoint, from_openai
from agentrl.rollout.types import SamplingParams
from agentrl.trajectory import ErrorKind, StopReason, Trajectory, status_for

if TYPE_CHECKING:
    from agentrl.proxy.adapter import AgentEpisode

__all__ = ["run_agent_on_endpoint"]

_DROPPED_HEADERS = ("content-length", "content-encoding", "transfer-encoding")


class _Recorder:
    """What the harness's completions were: rewrites each request, keeps the last exchange."""

    def __init__(self, model: str, sampling: SamplingParams) -> None:
        self.model, self.sampling = model, sampling
        self.completions = 0
        self.messages: list[Any] | None = None  # the last request's messages, as sent
        self.reply: dict[str, Any] | None = None  # the answer to it: an assistant message
        self.finish: str | None = None
        self.usage: Counter[str] = Counter()

    def rewrite(self, content: bytes) -> bytes:
        try:
            body = json.loads(content)
        except ValueError:
            return content  # not JSON: the endpoint answers it
        if not isinstance(body, dict):
            return content
        body["model"] = self.model
        body["temperature"], body["top_p"] = self.sampling.temperature, self.sampling.top_p
        for key in ("max_tokens", "max_completion_tokens"):
            asked = body.get(key)
            if isinstance(asked, int) and not isinstance(asked, bool):
                body[key] = min(asked, self.sampling.max_new_tokens)
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = self.sampling.max_new_tokens
        self.messages = body.get("messages") if isinstance(body.get("messages"), list) else None
        return json.dumps(body).encode()

    def record(self, status: int, text: str) -> None:
        if status != 200:
            return
        self.completions += 1
        if text.lstrip().startswith("data:"):
            self._record_stream(text)
            return
        try:
            data = json.loads(text)
            choice = data["choices"][0]
            self.reply, self.finish = dict(choice["message"]), choice.get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError):
            return
        self._count(data.get("usage"))

    def _record_stream(self, text: str) -> None:
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        for line in text.splitlines():
            payload = line.removeprefix("data:").strip()
            if not line.startswith("data:") or payload == "[DONE]":
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            self._count(chunk.get("usage"))
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                reasoning.append(delta.get("reasoning_content") or "")
                for call in delta.get("tool_calls") or []:
                    held = calls.setdefault(call.get("index", len(calls)), {"id": None, "name": "", "arguments": ""})
                    fn = call.get("function") or {}
                    held["id"] = call.get("id") or held["id"]
                    held["name"] += fn.get("name") or ""
                    held["arguments"] += fn.get("arguments") or ""
                self.finish = choice.get("finish_reason") or self.finish
        self.reply = {"role": "assistant", "content": "".join(content), "reasoning_content": "".join(reasoning) or None,
                      "tool_calls": [{"id": c["id"], "type": "function", "function": {
                          "name": c["name"], "arguments": c["arguments"]}} for _, c in sorted(calls.items())]}

    def _count(self, usage: Any) -> None:
        if isinstance(usage, Mapping):
            for key, value in usage.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    self.usage[key] += value


def _rewritten(request: httpx.Request, recorder: _Recorder) -> httpx.Request | None:
    if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
        return None
    headers = [(k, v) for k, v in request.headers.items() if k.lower() != "content-length"]
    return httpx.Request(request.method, request.url, headers=headers, content=recorder.rewrite(request.content),
                         extensions=request.extensions)


def _replayed(response: httpx.Response, request: httpx.Request) -> httpx.Response:
    headers = [(k, v) for k, v in response.headers.items() if k.lower() not in _DROPPED_HEADERS]
    return httpx.Response(response.status_code, headers=headers, content=response.content, request=request,
                          extensions=response.extensions)


class _AsyncRecording(httpx.AsyncBaseTransport):
    def __init__(self, recorder: _Recorder) -> None:
        self.recorder, self.inner = recorder, httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        changed = _rewritten(request, self.recorder)
        if changed is None:
            return await self.inner.handle_async_request(request)
        response = await self.inner.handle_async_request(changed)
        await response.aread()
        self.recorder.record(response.status_code, response.text)
        return _replayed(response, changed)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Recording(httpx.BaseTransport):
    def __init__(self, recorder: _Recorder) -> None:
        self.recorder, self.inner = recorder, httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        changed = _rewritten(request, self.recorder)
        if changed is None:
            return self.inner.handle_request(request)
        response = self.inner.handle_request(changed)
        response.read()
        self.recorder.record(response.status_code, response.text)
        return _replayed(response, changed)

    def close(self) -> None:
        self.inner.close()


async def _harness(episode: AgentEpisode, endpoint: ChatEndpoint, recorder: _Recorder) -> Any:
    import openai

    agent = episode.agent
    options = {"base_url": endpoint.url.removesuffix("/chat/completions"), "api_key": endpoint.api_key or "none",
               "timeout": agent.timeout_s or 600.0, "max_retries": 2, **agent.client_options}
    if agent.is_async:
        async with openai.AsyncOpenAI(**options, http_client=httpx.AsyncClient(transport=_AsyncRecording(recorder))) \
                as client:
            return await agent.run(episode.task, client, **episode.options)

    def call() -> Any:
        with openai.OpenAI(**options, http_client=httpx.Client(transport=_Recording(recorder))) as client:
            return agent.run(episode.task, client, **episode.options)

    return await asyncio.to_thread(call)


def _conversation(recorder: _Recorder) -> list[Message]:
    if recorder.messages is None or recorder.reply is None:
        return []
    try:
        sent = [_message(m, i)[0] for i, m in enumerate(recorder.messages)]
    except RequestError:
        return []
    return [*sent, from_openai(recorder.reply)[0]]


async def run_agent_on_endpoint(episode: AgentEpisode, endpoint: ChatEndpoint, sampling: SamplingParams, *,
                                group_id: str | None = None, sample_id: str | None = None,
                                reward_timeout_s: float | None = 300.0) -> Episode:
    """Runs ``episode``'s harness against ``endpoint`` (module doc); a message-level, scored :class:`Episode`."""
    from agentrl.proxy.adapter import _plain

    recorder = _Recorder(await endpoint.model_name(), sampling)
    started = time.perf_counter()
    timeout = episode.agent.timeout_s
    reason, answer = StopReason.ENV_DONE, None
    error: tuple[ErrorKind, str, str | None] | None = None
    try:
        answer = await asyncio.wait_for(_harness(episode, endpoint, recorder), timeout)
    except TimeoutError:
        error = (ErrorKind.AGENT_TIMEOUT, f"run() ran past its deadline of {timeout:g} s (Agent.timeout_s)", None)
    except Exception as exc:
        error = (ErrorKind.AGENT, f"run() raised {type(exc).__name__}: {exc}", exception_origin(exc))
    if error is None and not recorder.completions:
        error = (ErrorKind.AGENT, "run() returned without calling the model; an episode needs at least one model "
                 "turn", None)
    traj = Trajectory.from_messages(_conversation(recorder), group_id=group_id, sample_id=sample_id,
                                    rollout_id=uuid.uuid4().hex)
    traj.info["endpoint"] = endpoint.url
    traj.metrics.update({"turns": float(recorder.completions), "time/endpoint_s": time.perf_counter() - started,
                         **{f"usage/{k}": float(v) for k, v in recorder.usage.items()}})
    if error is not None:
        traj.add_error(error[0], error[1], component="run", origin=error[2])
        traj.finish(status_for(StopReason.FAILED), StopReason.FAILED)
        return Episode(sequences=[traj])
    if recorder.finish == "length":
        reason = StopReason.ENGINE_LENGTH
    traj.info["answer"] = _plain(answer)
    traj.finish(status_for(reason), reason)
    if episode.reward is None:
        traj.add_error(ErrorKind.REWARD, "the agent has no reward (Agent(run, reward) or --reward)", component="reward")
        return Episode(sequences=[traj])
    try:
        reward = await score(episode.reward, traj, timeout_s=reward_timeout_s, pool=shared_pool())
    except Exception as exc:
        kind = ErrorKind.REWARD_TIMEOUT if isinstance(exc, RewardTimeout) else ErrorKind.REWARD
        traj.add_error(kind, f"{type(exc).__name__}: {exc}", component="reward", origin=exception_origin(exc))
        return Episode(sequences=[traj])
    traj.reward, traj.reward_parts = reward.value, dict(reward.parts) or {"reward": reward.value}
    if reward.info:
        traj.info["reward_info"] = dict(reward.info)
    return Episode(sequences=[traj])
