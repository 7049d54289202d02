"""Bring your own agent: an agent harness written against the OpenAI client, trained as an environment.

The user writes the harness and a reward::

    async def run(task, client: openai.AsyncOpenAI) -> answer      # any framework, any loop
    def reward(task, answer) -> float

    agent = Agent(run, reward)       # agentrl train: environment.name = "my_agents:agent"

``Agent`` is a ``row -> episode`` factory, so it goes wherever an environment goes: ``agentrl train``
and ``agentrl eval`` by name (a ``module:attr``, an entry point of group ``agentrl.environments``),
``agentrl.run(config, environment=agent)``, the scheduler. For each group member the scheduler
builds an :class:`AgentEpisode` and runs it with an :class:`AgentRunner` (through
:func:`agentrl.rollout.agent.runner_for`): the runner opens a :class:`~agentrl.proxy.ProxySession`
on the agent's :class:`~agentrl.proxy.ProxyServer` (one per event loop, on loopback, started with the
first episode and stopped after the last), hands ``run`` an ``openai.AsyncOpenAI`` whose base URL is
that session (``openai.OpenAI`` in a worker thread for a plain ``def run``), and when ``run`` returns
ends the episode: every sequence the session produced, the answer in ``info["answer"]``, scored by
``reward(task, answer)`` (or ``agentrl train --reward``'s ``(trajectory, task)``).

Bounded and timed: at most ``max_concurrency`` harnesses of an agent run at once per event loop
(the others wait for a slot); each has ``timeout_s`` of running time (time suspended by the
scheduler does not count). Failures are typed errors on the episode, which ends ``failed``:
``agent`` (``run`` raised, or returned without ever calling the model), ``agent_timeout`` (past
its deadline: an async ``run`` is cancelled; a thread cannot be, so its session is closed and its
next call fails). A request the proxy refused (``agent_request``) or a call after the episode ended
(``agent_late_call``, answered 410) is recorded without changing the outcome. ``agent`` and
``agent_timeout`` episodes are regenerated like an environment that raised.

Abort and partial rollout: when the step is full (or the episode too stale) the scheduler's abort
reaches the session: the in-flight turn is aborted on the engine, its tokens kept, and the request
is *held* (the harness just waits); a harness between requests is held at its next one. The runner
is then suspended. With ``partial_rollout`` the next step resumes it: the held request continues
the same turn, the harness never notices. Without it the episode is discarded (the harness
cancelled) and the prompt recycled. What cannot be done: a suspended harness lives in this process
only, so a checkpoint cannot carry it across a restart (the saved member restarts from scratch
unless the harness replays exactly; see :mod:`agentrl.rollout.restore`), and a held request is an
open HTTP call, so a harness with its own short client timeout sees an error (and retries).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl._tracebacks import exception_origin
from agentrl.chat.template import ChatTemplate
from agentrl.episode import Episode
from agentrl.proxy.server import ProxyServer
from agentrl.proxy.session import ProxyConfig, ProxySession
from agentrl.rewards.pool import RewardTimeout, shared_pool
from agentrl.rewards.types import Reward, score
from agentrl.rollout._agent_config import AgentConfig
from agentrl.rollout._requests import GenerateClient, new_id
from agentrl.rollout.context import ContextPolicy
from agentrl.rollout.types import FinishKind, SamplingParams
from agentrl.trajectory import ErrorKind, Status, StopReason, Trajectory

if TYPE_CHECKING:
    from agentrl.rollout.endpoint import ChatEndpoint

__all__ = ["Agent", "AgentEpisode", "AgentRunner"]

_POLL_S = 0.1  # how often a running harness's runner looks at the abort check between requests


def _never() -> bool:
    return False


def _plain(value: Any) -> Any:
    """``value`` as JSON-like data for ``info["answer"]`` (``str()`` of anything else)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


class _AnswerReward:
    """``reward(task, answer)`` as the per-trajectory reward the scorer calls (picklable when its parts are)."""

    def __init__(self, fn: Callable[..., Any], task: Any) -> None:
        self.fn, self.task = fn, task
        self.__wrapped__ = fn  # what a failure's origin names (agentrl._tracebacks.function_origin)

    def __call__(self, trajectory: Trajectory) -> Any:
        return self.fn(self.task, trajectory.info.get("answer"))


@dataclass
class _Host:
    """What an agent's episodes share on one event loop: the server, the concurrency slots, the threads."""

    server: ProxyServer
    slots: asyncio.Semaphore
    executor: ThreadPoolExecutor | None = None
    users: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Agent:
    """An agent harness as an environment factory (see the module doc).

    ``run(task, client, **options)``: ``async`` with an ``openai.AsyncOpenAI``, or plain (run in a
    worker thread) with an ``openai.OpenAI``; ``options`` are the run config's ``environment.options``.
    ``reward(task, answer)`` returns a number or a :class:`~agentrl.rewards.Reward` (None: the reward
    must come from ``agentrl train --reward``). ``task_type``: a pydantic model rows are validated
    against (and ``task`` is an instance of), else ``task`` is the row dict. ``client_options`` go to
    the OpenAI client (``max_retries``, ``timeout``...). ``context_policy``: each session compacts the
    harness's history with it past its trigger (:mod:`agentrl.rollout.context`; the run config's
    ``environment.context`` sets it too); ``None``: the harness gets ``context_length_exceeded`` and
    may compact by itself. Picklable when ``run`` and ``reward`` are.
    """

    def __init__(self, run: Callable[..., Any], reward: Callable[..., Any] | None = None, *, name: str | None = None,
                 task_type: Any = None, timeout_s: float | None = 600.0, max_concurrency: int = 64,
                 proxy: ProxyConfig | None = None, client_options: Mapping[str, Any] | None = None,
                 context_policy: ContextPolicy | None = None) -> None:
        if not callable(run):
            raise TypeError(f"Agent.run: expected a function run(task, client), got {run!r:.80}")
        if reward is not None and not callable(reward):
            raise TypeError(f"Agent.reward: expected a function reward(task, answer) or None, got {reward!r:.80}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"Agent.timeout_s: got {timeout_s!r}; expected None or a number > 0")
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"Agent.max_concurrency: got {max_concurrency!r}; expected an int >= 1")
        self.run, self.reward, self.task_type = run, reward, task_type
        self.__name__: str = str(name or getattr(run, "__name__", "agent"))
        self.timeout_s, self.max_concurrency = timeout_s, max_concurrency
        call = run if inspect.isfunction(run) or inspect.ismethod(run) else type(run).__call__  # an object with __call__
        self.is_async = inspect.iscoroutinefunction(call)
        self.proxy = proxy or ProxyConfig(api_key=secrets.token_urlsafe(16))
        self.client_options = dict(client_options or {})
        self.context_policy = context_policy  # each session's (environment.context sets an episode's own)
        self._hosts: dict[asyncio.AbstractEventLoop, _Host] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_hosts"] = {}  # servers and threads belong to the process that started them
        return state

    def __repr__(self) -> str:
        return f"Agent({self.__name__!r}, timeout_s={self.timeout_s}, max_concurrency={self.max_concurrency})"

    def __call__(self, row: Mapping[str, Any] | Any, **options: Any) -> AgentEpisode:
        """The episode of one dataset row (one group member); ``options`` are passed on to ``run``."""
        task: Any = row
        if self.task_type is not None and not isinstance(row, self.task_type):
            task = self.task_type.model_validate(dict(row))
        elif isinstance(row, Mapping):
            task = dict(row)
        reward = _AnswerReward(self.reward, task) if self.reward is not None else None
        return AgentEpisode(self, task, reward, options)

    # -- what an agent's episodes share on one loop ------------------------------------------------
    async def _acquire(self) -> _Host:
        loop = asyncio.get_running_loop()
        host = self._hosts.get(loop)
        if host is None:
            host = self._hosts[loop] = _Host(ProxyServer(self.proxy), asyncio.Semaphore(self.max_concurrency))
        host.users += 1
        async with host.lock:
            await host.server.start()
        return host

    async def _release(self, host: _Host) -> None:
        host.users -= 1
        async with host.lock:
            if host.users == 0 and host.server.running:
                await host.server.stop()
                if host.executor is not None:
                    host.executor.shutdown(wait=False)
                    host.executor = None
                if self._hosts.get(asyncio.get_running_loop()) is host:
                    del self._hosts[asyncio.get_running_loop()]


class AgentEpisode:
    """One member's episode before it runs: the agent, the task, the reward (``reward(trajectory)``,
    replaced by ``agentrl train --reward``) and the options. The scheduler builds its runner with
    :meth:`make_runner`."""

    def __init__(self, agent: Agent, task: Any, reward: Callable[[Trajectory], Any] | None,
                 options: dict[str, Any]) -> None:
        self.agent, self.task, self.reward, self.options = agent, task, reward, options
        self.context_policy: ContextPolicy | None = agent.context_policy  # the session compacts with it

    def make_runner(self, template: ChatTemplate, client: GenerateClient, config: AgentConfig | None = None,
                    **ids: Any) -> AgentRunner:
        return AgentRunner(self, template, client, config, **ids)

    async def close(self) -> None:
        """Nothing to close: the runner closes the session and stops the harness."""

    async def run_on_endpoint(self, endpoint: ChatEndpoint, sampling: SamplingParams, **kwargs: Any) -> Episode:
        """The harness run against an OpenAI-compatible endpoint, no proxy between (``agentrl eval
        --endpoint``): a message-level episode (:mod:`agentrl.proxy._endpoint`)."""
        from agentrl.proxy._endpoint import run_agent_on_endpoint

        return await run_agent_on_endpoint(self, endpoint, sampling, **kwargs)


class AgentRunner:
    """Runs one :class:`AgentEpisode` with the surface of :class:`~agentrl.rollout.agent.EpisodeRunner`
    (``advance``, ``finish_aborted``, ``close``, ``sequences``...), so the scheduler, evaluation and the
    restore code drive it unchanged. Single-use, not thread-safe."""

    def __init__(self, env: AgentEpisode, template: ChatTemplate, client: GenerateClient,
                 config: AgentConfig | None = None, *, group_id: str | None = None, rollout_id: str | None = None,
                 sample_id: str | None = None, **_unused: Any) -> None:
        self.env, self.template, self.config = env, template, config or AgentConfig()
        self.agent = env.agent
        self.session = ProxySession(template, client, self.config, self.agent.proxy, group_id=group_id,
                                    rollout_id=rollout_id or new_id(), sample_id=sample_id,
                                    context_policy=env.context_policy)
        self.group_id, self.rollout_id, self.sample_id = group_id, self.session.rollout_id, sample_id
        self.reward_parts: dict[str, float] = {}
        self.env_info: list[dict[str, Any]] = []
        self.suspensions = 0
        self._host: _Host | None = None
        self._task: asyncio.Future[Any] | None = None
        self._running_since: float | None = None  # when the harness got its slot (the deadline's clock)
        self._active_s = 0.0
        self._result: Episode | None = None
        self._closed = False

    # -- the EpisodeRunner surface -----------------------------------------------------------------
    @property
    def client(self) -> GenerateClient:
        return self.session.client

    @client.setter
    def client(self, value: GenerateClient) -> None:
        self.session.client = value

    @property
    def sequences(self) -> list[Trajectory]:
        return self.session.sequences

    @property
    def metrics(self) -> Counter[str]:
        return self.session.metrics

    @metrics.setter
    def metrics(self, value: Counter[str]) -> None:
        self.session.metrics = value

    @property
    def timings(self) -> dict[str, float]:
        return self.session.timings

    @timings.setter
    def timings(self, value: dict[str, float]) -> None:
        self.session.timings = value

    @property
    def abort_message(self) -> str | None:
        return self.session.abort_message

    @abort_message.setter
    def abort_message(self, value: str | None) -> None:
        self.session.abort_message = value

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def partial_turn_tokens(self) -> int:
        return self.session.partial_turn_tokens

    def episode(self) -> Episode:
        return self._result if self._result is not None else self.session.episode()

    async def advance(self, should_abort: Callable[[], bool] | None = None) -> Episode | None:
        """Runs the harness until it returns (the episode, scored) or the owner aborts it (None: suspended,
        its pending request held; call again to resume)."""
        if self._result is not None:
            return self._result
        if self._closed:
            raise RuntimeError("AgentRunner.advance: the runner is closed")
        check = should_abort or _never
        if self._task is None:
            if check():
                return None
            self._host = await self.agent._acquire()
            self._host.server.open(self.session)
            self._task = asyncio.ensure_future(self._harness(self._host))
        self.session.resume(check)
        outcome = await self._wait(check)
        if outcome == "suspended":
            self.suspensions += 1
            return None
        return await self._end(outcome)

    def finish_aborted(self) -> Episode:
        """Ends a suspended (or never started) episode as ``aborted``, unscored."""
        if self._result is None:
            if self.sequences:
                self.session.finish(StopReason.ABORTED)
                if self.session.abort_message:
                    self.sequences[-1].info.setdefault("abort_reason", self.session.abort_message)
            self._result = self.session.episode()
        return self._result

    async def close(self) -> None:
        """Stops the harness (an async one is cancelled), closes the session, releases the server."""
        if self._closed:
            return
        self._closed = True
        self.session.close()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=5.0)
        if self._host is not None:
            self._host.server.close(self.session)
            host, self._host = self._host, None
            await self.agent._release(host)

    # -- the harness -------------------------------------------------------------------------------
    async def _harness(self, host: _Host) -> Any:
        import openai

        agent = self.agent
        options = {"base_url": host.server.base_url(self.session), "api_key": agent.proxy.api_key or "none",
                   "timeout": agent.timeout_s or 600.0, "max_retries": 5, **agent.client_options}
        async with host.slots:
            self._running_since = time.monotonic()
            if agent.is_async:
                async with openai.AsyncOpenAI(**options) as client:
                    return await agent.run(self.env.task, client, **self.env.options)
            if host.executor is None:
                host.executor = ThreadPoolExecutor(agent.max_concurrency, thread_name_prefix="agentrl-agent")

            def call() -> Any:
                with openai.OpenAI(**options) as client:
                    return agent.run(self.env.task, client, **self.env.options)

            return await asyncio.get_running_loop().run_in_executor(host.executor, call)

    def _left_s(self) -> float | None:
        if self.agent.timeout_s is None or self._running_since is None:
            return None
        return self.agent.timeout_s - self._active_s - (time.monotonic() - self._running_since)

    async def _wait(self, check: Callable[[], bool]) -> str:
        """``done`` (the harness returned or raised), ``suspended`` or ``timeout``."""
        assert self._task is not None
        held = asyncio.ensure_future(self.session.suspended.wait())
        try:
            while True:
                left = self._left_s()
                timeout = _POLL_S if left is None else max(0.0, min(_POLL_S, left))
                done, _ = await asyncio.wait({self._task, held}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if self._task in done:
                    return "done"
                if held in done or (check() and not self.session.busy):
                    return "suspended"
                left = self._left_s()
                if left is not None and left <= 0:
                    return "timeout"
        finally:
            held.cancel()
            if self._running_since is not None:
                self._active_s += time.monotonic() - self._running_since
                self._running_since = time.monotonic()

    async def _end(self, outcome: str) -> Episode:
        assert self._task is not None
        session = self.session
        session.close()  # the harness's calls from now on are late calls
        reason, answer = StopReason.ENV_DONE, None
        if outcome == "timeout":
            self._task.cancel()
            session.record(ErrorKind.AGENT_TIMEOUT, f"run() ran past its deadline of {self.agent.timeout_s:g} s "
                           "(Agent.timeout_s)", "run")
            reason = StopReason.FAILED
        elif self._task.cancelled() or self._task.exception() is not None:
            exc = None if self._task.cancelled() else self._task.exception()
            what = "was cancelled" if exc is None else f"raised {type(exc).__name__}: {exc}"
            session.record(ErrorKind.AGENT, f"run() {what}", "run", None if exc is None else exception_origin(exc))
            reason = StopReason.FAILED
        else:
            answer = _plain(self._task.result())
            if session.context_exceeded:
                reason = StopReason.CONTEXT_BUDGET
            elif session.last_finish is FinishKind.LENGTH:
                reason = StopReason.ENGINE_LENGTH
        if not session.sequences:  # no model call: an episode still needs a sequence to carry its error
            self._placeholder(reason)
            reason = StopReason.FAILED
        elif outcome == "done" and reason is not StopReason.FAILED:
            session.sequences[-1].info["answer"] = answer
        episode = session.finish(reason)
        await self._score()
        self._result = episode
        return episode

    def _placeholder(self, reason: StopReason) -> None:
        ids = self.template.encode([{"role": "user", "content": ""}], add_generation_prompt=True)
        traj = Trajectory.from_prompt(ids, group_id=self.group_id, rollout_id=self.rollout_id,
                                      sample_id=self.sample_id, session_id=self.session.routing_key)
        traj.info["no_model_calls"] = True
        self.session.sequences.append(traj)
        if reason is not StopReason.FAILED:
            self.session.record(ErrorKind.AGENT, "run() returned without calling the model; an episode needs at "
                                "least one model turn", "run")

    async def _score(self) -> None:
        """Scores the episode as the agent loop does (a failure is scored too; the scheduler drops it)."""
        last = self.sequences[-1]
        fn = self.env.reward
        if last.status is Status.ABORTED or last.error_of(ErrorKind.AGENT, ErrorKind.AGENT_TIMEOUT) is not None:
            return  # aborted: may resume; the harness failed: the episode is not trained (nor its answer scored)
        if fn is None:
            last.add_error(ErrorKind.REWARD, "the agent has no reward (Agent(run, reward) or agentrl train --reward)",
                           component="reward")
            return
        try:
            reward = await score(fn, last, timeout_s=self.config.reward_timeout_s,
                                 pool=shared_pool() if self.config.reward_pool else None)
        except Exception as exc:
            kind = ErrorKind.REWARD_TIMEOUT if isinstance(exc, RewardTimeout) else ErrorKind.REWARD
            last.add_error(kind, f"{type(exc).__name__}: {exc}", component="reward", origin=exception_origin(exc))
            last.metrics["reward_failed"] = 1.0
            if self.config.reward_failure != "zero":
                return
            reward = Reward(0.0, parts={"reward_failed": 0.0})
        parts = dict(reward.parts) or {"reward": reward.value}
        for seq in self.sequences:
            seq.reward, seq.reward_parts = reward.value, dict(parts)
        if reward.info:
            last.info["reward_info"] = dict(reward.info)
