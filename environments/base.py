"""The :class:`Environment` base class: one episode, built from one dataset row, speaking messages.

Contract (what the agent loop relies on, and what ``agentrl env check`` verifies):

- **Single use.** An environment instance runs exactly one episode: ``reset()`` once, then
  ``step()`` until a :class:`StepResult` says ``done``, then ``reward()``, then ``close()``.
  Stepping after ``done`` raises :class:`EpisodeDoneError`. GRPO groups are G independent
  instances built from the same row (:func:`~agentrl.environments.make_group`).
- **Messages only.** An environment never sees token ids; the agent loop owns the token boundary.
- **Own copy of the row.** The constructor deep-copies the row (or validates it into
  ``task_type``), so nothing an episode does leaks into the dataset or into another episode.
- **Picklable before reset.** A fresh instance can be shipped to another process. Tools declared
  on the class are not pickled with it (they are shared objects, re-bound from the class when
  unpickled); tools registered per instance must be picklable themselves.
- **Tools** are registered declaratively (the ``tools`` class attribute) or per instance with
  :meth:`Environment.register_tool`. The default :meth:`Environment.step` runs the reply's calls
  (concurrently, results in call order), applies the :class:`FailurePolicy` to every parse
  failure and tool error, and ends the episode when the reply has no calls (stop reason
  ``no_tool_calls``), when the failure policy says ``end`` (``failed``), when a turn asks for
  more calls than ``max_tool_calls`` leaves (``max_tool_calls``), or after ``max_turns`` turns
  (``max_turns``) — in that order of precedence.
- ``reward(trajectory)`` may be sync or async and returns a float or a
  :class:`~agentrl.rewards.Reward` inside ``reward_range``. Step-level ``reward_parts`` (failure
  penalties) are added on top by the agent loop.
- **A workspace** (optional): an environment that declares ``workspace = WorkspaceSpec(...)`` gets a
  per-episode folder, shell and Python kernel that keep their state across its tool calls
  (:mod:`agentrl.tools.workspace`): ``self.workspace_session``, created at the first tool call (from
  the spec and :meth:`Environment.workspace_files`, the row's own files), with the spec's tools
  (``bash``, ``python`` kernel, ``read_file``, ``write_file``, ``edit_file``, ``list_dir``) registered
  per instance. It is removed by ``close()``, which the agent loop calls after ``reward()``, so a
  reward may run commands in it; an override of ``close()`` must call ``super().close()``. A
  resumed episode's replay (:meth:`Environment.begin_replay`) rebuilds it by running the recorded
  calls again and answering with the recorded results.
- **Long episodes** (optional): ``default_context_policy`` on the class or ``context_policy=`` per
  instance (:mod:`agentrl.rollout.context`: window, elided tool output, a summary the model writes)
  says what the agent loop does when the next request would not fit; ``None``: the episode ends
  ``context_budget``. The environment itself sees only messages, whatever the policy keeps.
- The default ``step`` logs, in ``StepResult.info``: ``turn`` (1 for the first reply), ``calls``
  (one ``{"id", "name", "failure", "duration_s"}`` per call run; ``failure`` a failure kind or None)
  and ``parse_failures`` (kind, tool, call id, tolerated, message) of the reply. The agent loop keeps
  them in ``Episode.env_info``; the trajectory viewer shows them next to each call.

Example::

    class Echo(Environment):
        tools = [calculator]
        async def reset(self): return [Message("user", self.task["question"])]
        def reward(self, trajectory): return math_answer_reward(final_answer_text(trajectory.messages),
                                                                self.task["answer"])
"""

from __future__ import annotations

import asyncio
import copy
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ValidationError

from agentrl.chat.schema import check_parameters_schema
from agentrl.chat.types import FailureKind, Message, ToolCall, ToolCallFailure
from agentrl.environments.policy import EnvLimits, FailureAction, FailurePolicy
from agentrl.rewards.types import RewardValue
from agentrl.tools.base import Tool, ToolResult, short_error, tool_schema
from agentrl.tools.fleet.errors import ExecutorUnavailableError
from agentrl.tools.workspace import WorkspaceSession, WorkspaceSpec, answers_from_record, workspace_tools
from agentrl.trajectory import EpisodeError, ErrorKind, StopReason, Trajectory

if TYPE_CHECKING:
    from agentrl.rollout.context import ContextPolicy

__all__ = ["Environment", "EpisodeDoneError", "StepResult", "ToolLike", "tool_spec"]


class EpisodeDoneError(RuntimeError):
    """``step()`` was called on an environment whose episode is already over."""


ToolLike = Tool
"""What an environment needs of a tool; the same protocol as :class:`agentrl.tools.Tool`."""
tool_spec = tool_schema
"""The OpenAI function object a chat template lists for a tool (:func:`agentrl.tools.tool_schema`)."""


@dataclass
class StepResult:
    """What one environment step returns.

    - ``messages``: new tool/user messages for the model (empty when the episode ends on an answer);
    - ``done``: whether the episode is over; ``stop_reason`` says why (required when done);
    - ``reward_parts``: step-level shaping (e.g. ``failure_penalty``), summed over the episode;
    - ``failures``: every failure this step saw, by kind (counted in the trajectory's metrics);
      a tolerated parse failure the policy only records is counted too, under ``tolerated``;
    - ``info``: free-form, logged;
    - ``error``: why a step that ends the episode as ``failed`` failed (the agent loop records it in
      ``Trajectory.errors``; the default ``step`` sets it when the failure policy says ``end``).
    """

    messages: list[Message] = field(default_factory=list)
    done: bool = False
    reward_parts: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    stop_reason: StopReason | None = None
    failures: list[FailureKind] = field(default_factory=list)
    tolerated: list[FailureKind] = field(default_factory=list)
    error: EpisodeError | None = None

    def __post_init__(self) -> None:
        if self.done and self.stop_reason is None:
            self.stop_reason = StopReason.ENV_DONE
        if not self.done and self.stop_reason is not None:
            raise ValueError(f"StepResult.stop_reason={self.stop_reason.value!r} with done=False; "
                             "expected a stop reason only when done")
        for i, m in enumerate(self.messages):
            if not isinstance(m, Message):
                raise TypeError(f"StepResult.messages[{i}]: expected a Message, got {type(m).__name__}")
            if m.role not in ("tool", "user"):
                raise ValueError(f"StepResult.messages[{i}].role={m.role!r}; expected 'tool' or 'user'")


# a failure's message can quote the model's arguments: keep the error short
_MAX_ERROR_CHARS = 500
_TOOL_FAILURES = {FailureKind.TOOL_ERROR: ErrorKind.TOOL, FailureKind.TOOL_TIMEOUT: ErrorKind.TOOL,
                  FailureKind.SANDBOX_ERROR: ErrorKind.SANDBOX}


def _error_kind_of(kind: FailureKind) -> ErrorKind:
    """The episode error a tool-use failure becomes when it ends the episode: ``tool`` or ``sandbox``
    for a call that ran, ``parse`` for a call the parser could not accept (unknown tool included)."""
    return _TOOL_FAILURES.get(kind, ErrorKind.PARSE)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" ... ({len(text) - limit} more characters)"


@dataclass
class _CallOutcome:
    content: str
    failure: FailureKind | None = None
    duration_s: float = 0.0


_ATOMS = (str, int, float, bool, bytes, type(None))


def _own_copy(task: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a row that its environment may change freely: shallow when every value is immutable
    (a deep copy costs ~20 µs a row, paid by every member of every group), deep otherwise."""
    row = dict(task)
    if all(type(v) in _ATOMS for v in row.values()):
        return row
    return copy.deepcopy(row)


class Environment(ABC):
    """Base class for environments; see the module doc for the contract."""

    task_type: ClassVar[type[BaseModel] | None] = None
    tools: ClassVar[Sequence[Tool]] = ()
    reward_range: tuple[float, float] = (0.0, 1.0)  # an instance may narrow or widen it (e.g. shaping)
    default_limits: ClassVar[EnvLimits] = EnvLimits()
    default_failure_policy: ClassVar[FailurePolicy] = FailurePolicy()
    default_context_policy: ClassVar[ContextPolicy | None] = None
    workspace: ClassVar[WorkspaceSpec | None] = None

    def __init__(self, task: Mapping[str, Any] | BaseModel, *, limits: EnvLimits | None = None,
                 failure_policy: FailurePolicy | None = None, context_policy: ContextPolicy | None = None) -> None:
        self.task: Any = self._coerce_task(task)
        self.limits = limits if limits is not None else type(self).default_limits
        self.failure_policy = failure_policy if failure_policy is not None else type(self).default_failure_policy
        # what the agent loop does when the next request would not fit (agentrl.rollout.context); None: end
        # the episode (context_budget). ``env.context_policy = None`` turns a class default off.
        self.context_policy = context_policy if context_policy is not None else type(self).default_context_policy
        self._tools: dict[str, Tool] = {}
        for t in type(self).tools:
            self.register_tool(t)
        spec = self.workspace_spec()
        self.workspace_session: WorkspaceSession | None = None
        if spec is not None:
            if not isinstance(spec, WorkspaceSpec):
                raise TypeError(f"{type(self).__name__}.workspace: expected a WorkspaceSpec or None, got "
                                f"{type(spec).__name__}")
            self.workspace_session = WorkspaceSession(spec, self.workspace_files)
            for t in workspace_tools(self.workspace_session, spec.tools):
                self.register_tool(t)
        self.turns = 0
        self.tool_calls = 0
        self.successful_tool_calls = 0
        self.failure_counts: Counter[str] = Counter()
        self.done = False

    @classmethod
    def _coerce_task(cls, task: Mapping[str, Any] | BaseModel) -> Any:
        if cls.task_type is None:
            if isinstance(task, BaseModel):
                return task.model_copy(deep=True)
            if not isinstance(task, Mapping):
                raise TypeError(f"{cls.__name__}(task=...): expected a row mapping, got {type(task).__name__}")
            return _own_copy(task)
        if isinstance(task, cls.task_type):
            return task.model_copy(deep=True)
        if isinstance(task, BaseModel):
            task = task.model_dump()
        try:
            return cls.task_type.model_validate(_own_copy(task))
        except ValidationError as exc:
            problems = "; ".join(f"field {'.'.join(map(str, e['loc'])) or '<row>'}: {e['msg']} "
                                 f"(got {e.get('input')!r:.80})" for e in exc.errors())
            raise ValueError(f"{cls.__name__}: dataset row does not fit {cls.task_type.__name__}: {problems}") from None
        except TypeError:
            raise TypeError(f"{cls.__name__}(task=...): expected a row mapping, got {type(task).__name__}") from None

    # -- pickling: class-level tools are shared objects, re-bound from the class on unpickle ------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        shared = {id(t) for t in type(self).tools}
        state["_tools"] = {n: t for n, t in self._tools.items() if id(t) not in shared}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        own = state.pop("_tools", {})
        self.__dict__.update(state)
        self._tools = {t.name: t for t in type(self).tools}
        self._tools.update(own)

    # -- tools -----------------------------------------------------------------------------
    def register_tool(self, tool: Tool) -> None:
        """Adds a tool for this episode; names must be unique."""
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not name or not callable(tool):
            raise TypeError(f"register_tool: expected a tool with a non-empty 'name' and an async __call__, got {tool!r:.120}")
        if name in self._tools:
            raise ValueError(f"register_tool: a tool named {name!r} is already registered")
        try:
            check_parameters_schema(name, getattr(tool, "parameters", None))
        except ValueError as exc:
            raise ValueError(f"register_tool: {exc}") from None
        self._tools[name] = tool

    @property
    def tool_map(self) -> Mapping[str, Tool]:
        return dict(self._tools)

    def tool_specs(self) -> list[dict[str, Any]]:
        """OpenAI function objects for the chat template's tool list (registration order)."""
        return [tool_schema(t) for t in self._tools.values()]

    # -- the episode -----------------------------------------------------------------------
    @abstractmethod
    async def reset(self) -> list[Message]:
        """The opening conversation (system and user messages)."""

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        """Runs the reply's tool calls and applies the failure policy (module doc).

        ``failures`` are the parse failures the chat core found in the same reply.
        """
        self._begin_step()
        result = StepResult()
        feedback: list[Message] = []
        end = False
        for f in failures:
            if f.tolerated and self.failure_policy.action_for(f.kind, tolerated=True) is FailureAction.RECORD:
                self.failure_counts[f"tolerated/{f.kind.value}"] += 1
                result.tolerated.append(f.kind)
                continue
            end |= self._apply_failure(result, f.kind, f"Error: {f.kind.value}: {f.message}", feedback, None,
                                       tolerated=f.tolerated, where=(f.tool_name, f.call_id))
        calls = list(reply.tool_calls)
        if not calls and not feedback and not end:
            return self._finish(result, StopReason.NO_TOOL_CALLS)
        room = max(self.limits.max_tool_calls - self.tool_calls, 0)
        run, skipped = calls[:room], calls[room:]
        outcomes = await asyncio.gather(*(self._timed_call(c) for c in run))
        self.tool_calls += len(run)
        for call, out in zip(run, outcomes, strict=True):
            msg = Message(role="tool", content=out.content, tool_call_id=call.id, name=call.name)
            if out.failure is None:
                self.successful_tool_calls += 1
                result.messages.append(msg)
            else:
                end |= self._apply_failure(result, out.failure, out.content, result.messages, msg,
                                           where=(call.name, call.id))
        result.messages.extend(feedback)
        if run and self.workspace_session is not None:
            await self.workspace_session.after_step(result.info)
        result.info["tool_calls"] = len(run)
        result.info["turn"] = self.turns
        if run:
            result.info["calls"] = [{"id": c.id, "name": c.name, "failure": o.failure.value if o.failure else None,
                                     "duration_s": round(o.duration_s, 6)} for c, o in zip(run, outcomes, strict=True)]
        if failures:
            result.info["parse_failures"] = [{"kind": f.kind.value, "tool": f.tool_name, "call_id": f.call_id,
                                              "tolerated": f.tolerated, "message": f.message[:300]}
                                             for f in failures]
        if skipped:
            result.info["tool_calls_skipped"] = len(skipped)
        if end:
            return self._finish(result, StopReason.FAILED)
        if skipped:
            return self._finish(result, StopReason.MAX_TOOL_CALLS)
        if self.turns >= self.limits.max_turns:
            return self._finish(result, StopReason.MAX_TURNS)
        return result

    @abstractmethod
    def reward(self, trajectory: Trajectory) -> RewardValue | Awaitable[RewardValue]:
        """The episode's reward, within ``reward_range``; read only the model's own text."""

    def reference_reply(self, messages: Sequence[Message]) -> Message | None:
        """A winning next assistant turn for the conversation so far (a scripted solver), or ``None``
        (the default: this environment has none). ``agentrl env check`` plays it to the end: the episode
        must reach the top of ``reward_range``, so a reward that can never give full marks is caught."""
        return None

    def workspace_spec(self) -> WorkspaceSpec | None:
        """This episode's workspace spec: the class's ``workspace`` (override to choose per instance,
        e.g. the backend from an option; called by ``__init__``, before a subclass's own attributes
        are set unless it sets them before ``super().__init__``)."""
        return type(self).workspace

    def workspace_files(self) -> Mapping[str, str | bytes]:
        """The task's own files, written into the workspace (relative path -> content) before the
        spec's setup commands run; called once, when the workspace is created. Default: none."""
        return {}

    def begin_replay(self, sequences: Sequence[Trajectory], env_info: Sequence[Mapping[str, Any]]) -> None:
        """A resumed episode is about to be replayed (:mod:`agentrl.rollout.restore`): its workspace
        tools run the recorded calls again and answer with the recorded results. No-op without a workspace."""
        session = self.workspace_session
        if session is not None and sequences:
            names = tuple(n for n, t in self._tools.items() if getattr(t, "session", None) is session)
            session.begin_replay(*answers_from_record(sequences[-1].messages, env_info, names))

    async def close(self) -> None:
        """Releases what this episode started (processes, containers, files): the workspace, if one
        was created. Idempotent; an override must call ``super().close()``."""
        if self.workspace_session is not None:
            await self.workspace_session.remove()

    # -- helpers for subclasses ------------------------------------------------------------
    def _begin_step(self) -> None:
        """Raises if the episode is over; counts the turn. Call it first in an overriding ``step``."""
        if self.done:
            raise EpisodeDoneError(f"{type(self).__name__}.step: the episode is already done; "
                                   "environments are single-use (build a new one per episode)")
        self.turns += 1

    def _finish(self, result: StepResult, reason: StopReason) -> StepResult:
        result.done = True
        result.stop_reason = reason
        self.done = True
        return result

    def _apply_failure(self, result: StepResult, kind: FailureKind, text: str, sink: list[Message],
                       msg: Message | None, tolerated: bool = False,
                       where: tuple[str | None, str | None] = (None, None)) -> bool:
        """Records one failure; appends feedback to ``sink`` unless the policy ends the episode (the
        first failure that does is ``result.error``; ``where`` is its tool name and call id).

        ``record`` appends nothing for a parse failure (``msg`` None); a failed tool call still gets
        its tool message, which the conversation needs.
        """
        self.failure_counts[kind.value] += 1
        result.failures.append(kind)
        action = self.failure_policy.action_for(kind, tolerated=tolerated)
        if action is FailureAction.END:
            if result.error is None:
                result.error = EpisodeError(_error_kind_of(kind), f"failure policy 'end' on {kind.value}: "
                                            f"{_clip(text, _MAX_ERROR_CHARS)}", component=where[0] or "parse",
                                            tool_call_id=where[1])
            return True
        if action is FailureAction.RECORD and msg is None:
            return False
        if action is FailureAction.PENALIZE:
            result.reward_parts["failure_penalty"] = (result.reward_parts.get("failure_penalty", 0.0)
                                                      + self.failure_policy.penalty)
        sink.append(msg if msg is not None else Message(role="tool", content=text))
        return False

    async def _timed_call(self, call: ToolCall) -> _CallOutcome:
        started = time.perf_counter()
        out = await self._run_call(call)
        out.duration_s = time.perf_counter() - started
        return out

    async def _run_call(self, call: ToolCall) -> _CallOutcome:
        tool = self._tools.get(call.name)
        if tool is None:
            valid = ", ".join(sorted(self._tools)) or "none"
            return _CallOutcome(f"Error: {FailureKind.UNKNOWN_TOOL.value}: no tool named {call.name!r} "
                                f"(available: {valid})", FailureKind.UNKNOWN_TOOL)
        try:
            res = await tool(**call.arguments)
        except ExecutorUnavailableError:  # the sandbox fleet's failure: not the model's; the episode is regenerated
            raise
        except Exception as exc:  # a tool's bug must reach the model as an error value, not crash the loop
            return _CallOutcome(f"Error: {FailureKind.TOOL_ERROR.value}: {short_error(exc)}", FailureKind.TOOL_ERROR)
        return _outcome_of(res)


def _outcome_of(res: object) -> _CallOutcome:
    """Reads a :class:`ToolResult` or a plain string (anything else is shown as its ``str``)."""
    if not isinstance(res, ToolResult):
        return _CallOutcome(res if isinstance(res, str) else str(res))
    if not res.is_error:
        return _CallOutcome(res.content)
    return _CallOutcome(res.content, res.error_kind or FailureKind.TOOL_ERROR)
