"""One episode's handle on its workspace: created at the first tool call, removed with the episode.

:class:`WorkspaceSession` is what an environment (and its tools) hold. Nothing exists until a tool
first needs the workspace (:meth:`get`); :meth:`remove` ends it — the environment's ``close()``,
which the agent loop calls after the reward has run, so a reward may run tests in the workspace.
The session also keeps the shell's working directory between ``bash`` calls and carries a resumed
episode's *replay* (see below). A fresh session pickles (an environment is picklable before
``reset``), without its :class:`Workspaces` (the unpickled copy uses its process's default); one
holding a live workspace refuses to.

Resume, decided: **replay the recorded tool calls**, not snapshots. A checkpoint keeps a suspended
episode's conversation (:mod:`agentrl.rollout.restore`); a resumed run builds a fresh environment and
replays it. Through :meth:`begin_replay` the session gets the recorded tool results: each replayed
call of a workspace tool runs again for real, in order, on a fresh fork of the same prepared state —
so files, the working directory and the kernel's variables (its cells run again) are rebuilt — but
answers with the *recorded* result, so output that differs from run to run (timings, addresses)
cannot break the replay. What must match is the files: after every step that ran with a workspace,
:meth:`after_step` records a hash of everything the episode wrote (``info["workspace"]["digest"]``,
kept in the checkpoint with the step's info); a replayed step whose files hash differently (a command
whose effect is not deterministic) fails the replay, and the episode restarts from scratch — counted
by the scheduler, never continued on files it did not have. A step whose files could not be hashed
records ``digest: None`` with the error (and a warning is logged); replaying it fails the same way,
since there is nothing to check the rebuilt files against.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.chat.types import FailureKind
from agentrl.tools.base import ToolResult
from agentrl.tools.workspace.base import ROOT, TOOL_NAMES, Workspace, WorkspaceError, WorkspaceSpec
from agentrl.tools.workspace.manager import WorkspaceHost, default_workspaces

__all__ = ["Answer", "WorkspaceReplayError", "WorkspaceSession"]

log = logging.getLogger(__name__)

FilesFn = Callable[[], Mapping[str, str | bytes]]


class WorkspaceReplayError(WorkspaceError):
    """A replayed episode's tool calls did not rebuild the files it had."""


@dataclass(frozen=True)
class Answer:
    """A recorded tool result: the tool's name, the message content, the failure kind (or None)."""

    tool: str
    content: str
    failure: str | None = None


class WorkspaceSession:
    """See the module doc. ``files``: the task's files (or a function giving them, called once at
    creation); ``workspaces``: the :class:`Workspaces` to create it with (default: the process's)."""

    def __init__(self, spec: WorkspaceSpec, files: FilesFn | Mapping[str, str | bytes] | None = None, *,
                 workspaces: WorkspaceHost | None = None) -> None:
        if not isinstance(spec, WorkspaceSpec):
            raise TypeError(f"WorkspaceSession(spec=...): expected a WorkspaceSpec, got {type(spec).__name__}")
        self.spec = spec
        self._files = files
        self._workspaces = workspaces
        self.workspace: Workspace | None = None
        self.cwd = ROOT
        self._lock: asyncio.Lock | None = None
        self._answers: list[Answer] = []
        self._digests: list[str | None] = []
        self.replayed = 0
        self.create_s = 0.0

    # -- pickling: a fresh session only ------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        if self.workspace is not None:
            raise TypeError("WorkspaceSession: a session with a live workspace cannot be pickled (an environment "
                            "is picklable before its episode starts)")
        state = self.__dict__.copy()
        state["_lock"] = None
        state["_workspaces"] = None  # processes do not share one: an unpickled session uses its process's default
        return state

    @property
    def workspaces(self) -> WorkspaceHost:
        return self._workspaces if self._workspaces is not None else default_workspaces()

    @property
    def active(self) -> bool:
        return self.workspace is not None and not self.workspace.removed

    async def get(self) -> Workspace:
        """The episode's workspace, created (forked from its prepared state) at the first call."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.workspace is None:
                files = self._files() if callable(self._files) else (self._files or {})
                loop = asyncio.get_running_loop()
                started = loop.time()
                self.workspace = await self.workspaces.create(self.spec, files)
                self.create_s = loop.time() - started
            elif self.workspace.removed:
                raise WorkspaceError("the episode's workspace was removed (the episode is over)")
            return self.workspace

    async def remove(self) -> None:
        """Removes the workspace (if one was created). Idempotent."""
        ws, self.workspace = self.workspace, None
        if ws is not None:
            await self.workspaces.remove(ws)
            self.workspace = ws  # kept (removed) so a late tool call says so instead of creating another

    # -- replay (module doc) -----------------------------------------------------------------------
    def begin_replay(self, answers: Sequence[Answer], digests: Sequence[str | None]) -> None:
        """The recorded results of the workspace tools' calls, in order, and the recorded digests of
        the steps that ran with the workspace."""
        self._answers = list(answers)
        self._digests = list(digests)

    @property
    def replaying(self) -> bool:
        return bool(self._answers) or bool(self._digests)

    async def call(self, tool: str, run: Callable[[], Awaitable[ToolResult]]) -> ToolResult:
        """Runs one tool call; while replaying, returns the recorded result instead of ``run``'s own."""
        answer = self._answers.pop(0) if self._answers else None  # taken before any await: call order
        if answer is not None and answer.tool != tool:
            self._answers.clear()
            raise WorkspaceReplayError(f"the replay called {tool!r} where the record has {answer.tool!r}")
        result = await run()
        if answer is None:
            return result
        self.replayed += 1
        if answer.failure is None:
            return ToolResult(answer.content, metrics={"replayed": True})
        return ToolResult(answer.content, is_error=True, error_kind=FailureKind(answer.failure),
                          metrics={"replayed": True})

    async def after_step(self, info: dict[str, Any]) -> None:
        """Records (or, replaying, checks) the hash of the files after a step (module doc)."""
        if not self.spec.verify_replay or not self.active:
            return
        assert self.workspace is not None
        try:
            digest: str | None = (await self.workspace.digest(self.spec.ignore))[:16]
        except WorkspaceError as exc:  # the workspace broke: the tools say so; the record says it too
            log.warning("workspace %s: the step's files could not be hashed, so a resumed replay of this episode "
                        "cannot be checked and restarts it: %s", self.workspace.name, exc)
            info["workspace"] = {"digest": None, "error": str(exc)[:300]}
            digest = None
        else:
            info["workspace"] = {"digest": digest}
        if self._digests:
            expected = self._digests.pop(0)
            if expected is None or digest is None:
                self._answers.clear()
                self._digests.clear()
                raise WorkspaceReplayError(
                    "a replayed step's files cannot be checked (the record or the replay could not hash them), "
                    "so the episode restarts")
            if expected != digest:
                self._answers.clear()
                self._digests.clear()
                raise WorkspaceReplayError(
                    f"the replayed tool calls rebuilt other files than the record (digest {digest} where the "
                    f"record has {expected}): a command's effect is not deterministic, so the episode restarts")


def answers_from_record(messages: Sequence[Any], env_info: Sequence[Mapping[str, Any]],
                        tools: Sequence[str] = TOOL_NAMES) -> tuple[list[Answer], list[str | None]]:
    """The recorded workspace tool results (from the tool messages, in order, with their failure kinds
    from the steps' ``calls`` info) and step digests of a suspended episode."""
    calls = [(c.get("name"), c.get("failure")) for info in env_info for c in info.get("calls") or []]
    failures = [f for name, f in calls if name in tools]
    contents = [(m.name, m.content) for m in messages if m.role == "tool" and m.name in tools]
    answers = [Answer(str(name), content if isinstance(content, str) else str(content),
                      failures[i] if i < len(failures) else None) for i, (name, content) in enumerate(contents)]
    digests = [info["workspace"].get("digest") for info in env_info if isinstance(info.get("workspace"), Mapping)]
    return answers, digests
