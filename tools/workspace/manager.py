"""Creating workspaces: each prepared state is built once and forked for every episode that needs it.

:class:`Workspaces` keys a prepared state by the spec and the task's files
(:func:`~agentrl.tools.workspace.base.files_key`), so the G members of a GRPO group, which share a
row, share one preparation (setup commands run once) and each get a fork. Members that ask at the
same time wait for the one preparation in flight. A prepared state stays while a fork of it lives;
by default it goes with its last fork, so nothing of an episode outlives it (a member whose first
tool call comes after every other member's episode ended prepares again). ``keep_prepared=N`` keeps
up to N unused ones (least recently used go first), so the next group on the same row forks without
preparing again — at the price of holders that outlive their episodes.

:func:`default_workspaces` is the process's instance (the environments' default); ``close()``
removes every workspace and prepared state. Backends are created on first use: ``bwrap``
(:class:`~agentrl.tools.workspace.bwrap.BwrapWorkspaces`) and ``docker``
(:class:`~agentrl.tools.workspace.docker.DockerWorkspaces`; its options, e.g. ``docker_host``, in
``backend_options["docker"]``).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from agentrl.tools.workspace.base import (
    Prepared,
    Workspace,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceSpec,
    files_key,
    task_files,
)

__all__ = ["WorkspaceHost", "Workspaces", "default_workspaces"]


class WorkspaceHost(Protocol):
    """What hands out an episode's workspace: :class:`Workspaces` here, or a sandbox fleet's
    (:class:`agentrl.tools.fleet.FleetWorkspaces`: each workspace on one of its executors)."""

    async def create(self, spec: WorkspaceSpec, files: Mapping[str, str | bytes] | None = None) -> Workspace: ...

    async def restore(self, spec: WorkspaceSpec, files: Mapping[str, str | bytes] | None,
                      snapshot: bytes) -> Workspace: ...

    async def remove(self, ws: Workspace) -> None: ...

    async def close(self) -> None: ...

    def leftovers(self) -> dict[str, int]: ...


class _Entry:
    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        self.refs = 0


class Workspaces:
    """Prepares, forks and removes workspaces (see the module doc). One event loop at a time."""

    def __init__(self, *, keep_prepared: int = 0, backend_options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        if isinstance(keep_prepared, bool) or not isinstance(keep_prepared, int) or keep_prepared < 0:
            raise ValueError(f"Workspaces(keep_prepared=...): expected an int >= 0, got {keep_prepared!r}")
        self.keep_prepared = keep_prepared
        self.backend_options = {k: dict(v) for k, v in (backend_options or {}).items()}
        self._backends: dict[str, WorkspaceBackend] = {}
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._preparing: dict[str, asyncio.Future[_Entry]] = {}
        self._owner: dict[int, str] = {}
        self.live: dict[int, Workspace] = {}
        self.stats: collections.Counter[str] = collections.Counter()
        self._loop: asyncio.AbstractEventLoop | None = None

    def backend(self, name: str) -> WorkspaceBackend:
        """The backend ``name`` (created on first use)."""
        if name not in self._backends:
            options = self.backend_options.get(name, {})
            if name == "bwrap":
                from agentrl.tools.workspace.bwrap import BwrapWorkspaces

                self._backends[name] = BwrapWorkspaces(**options)
            elif name == "docker":
                from agentrl.tools.workspace.docker import DockerWorkspaces

                self._backends[name] = DockerWorkspaces(**options)
            else:
                raise ValueError(f"Workspaces.backend: expected 'bwrap' or 'docker', got {name!r}")
        return self._backends[name]

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop and not self._loop.is_closed():
            raise WorkspaceError("Workspaces: used from a second event loop; expected one loop per instance")
        if self._loop is not loop:  # a new loop (the last one closed): nothing of the old one is usable
            self._entries.clear()
            self._preparing.clear()
            self._backends.clear()
            self._loop = loop

    async def _entry(self, spec: WorkspaceSpec, files: Mapping[str, bytes]) -> _Entry:
        key = files_key(spec, files)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            return entry
        pending = self._preparing.get(key)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._preparing[key] = pending
            try:
                prepared = await self.backend(spec.backend).prepare(spec, files, key)
            except BaseException as exc:
                pending.set_exception(exc if isinstance(exc, Exception) else WorkspaceError("preparation cancelled"))
                pending.exception()  # retrieved: the waiters (if any) see it
                raise
            finally:
                self._preparing.pop(key, None)
            entry = _Entry(prepared)
            self._entries[key] = entry
            self.stats["prepared"] += 1
            pending.set_result(entry)
            return entry
        return await asyncio.shield(pending)

    async def create(self, spec: WorkspaceSpec, files: Mapping[str, str | bytes] | None = None) -> Workspace:
        """A new workspace: a fork of the prepared state for ``spec`` and ``files`` (prepared now if needed)."""
        self._bind_loop()
        clean = task_files(files or {})
        entry = await self._entry(spec, clean)
        entry.refs += 1
        try:
            ws = await self.backend(spec.backend).fork(entry.prepared)
        except BaseException:
            entry.refs -= 1
            raise
        return self._adopt(ws, entry)

    async def restore(self, spec: WorkspaceSpec, files: Mapping[str, str | bytes] | None, snapshot: bytes) -> Workspace:
        """A new workspace from the prepared state for ``spec`` and ``files`` with ``snapshot`` applied."""
        self._bind_loop()
        entry = await self._entry(spec, task_files(files or {}))
        entry.refs += 1
        try:
            ws = await self.backend(spec.backend).restore(entry.prepared, snapshot)
        except BaseException:
            entry.refs -= 1
            raise
        return self._adopt(ws, entry)

    def _adopt(self, ws: Workspace, entry: _Entry) -> Workspace:
        self.live[id(ws)] = ws
        self._owner[id(ws)] = entry.prepared.key
        self.stats["created"] += 1
        return ws

    async def remove(self, ws: Workspace) -> None:
        """Removes ``ws`` and lets its prepared state go when nothing needs it. Idempotent."""
        key = self._owner.pop(id(ws), None)
        self.live.pop(id(ws), None)
        await ws.remove()
        if key is None:
            return
        self.stats["removed"] += 1
        entry = self._entries.get(key)
        if entry is not None:
            entry.refs -= 1
        await self._evict()

    async def _evict(self) -> None:
        idle = [k for k, e in self._entries.items() if e.refs <= 0]
        for key in idle[: max(0, len(idle) - self.keep_prepared)]:
            entry = self._entries.pop(key)
            await self.backend(entry.prepared.spec.backend).release(entry.prepared)

    async def close(self) -> None:
        """Removes every workspace and prepared state, and closes the backends. Idempotent."""
        for ws in list(self.live.values()):
            await self.remove(ws)
        for entry in list(self._entries.values()):
            await self.backend(entry.prepared.spec.backend).release(entry.prepared)
        self._entries.clear()
        for backend in list(self._backends.values()):
            await backend.close()
        self._backends.clear()

    async def __aenter__(self) -> Workspaces:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def leftovers(self) -> dict[str, int]:
        out = {"workspaces": len(self.live)}
        for name, backend in self._backends.items():
            out.update({f"{name}/{k}": v for k, v in backend.leftovers().items()})
        return out


_DEFAULT: Workspaces | None = None
_DEFAULT_LOCK = threading.Lock()


def default_workspaces() -> WorkspaceHost:
    """This process's :class:`Workspaces` (created on first use). What it leaves when the process
    exits without closing it, the reaper removes. While a sandbox fleet is installed
    (:func:`agentrl.tools.fleet.use_fleet`), the fleet's workspaces instead."""
    from agentrl.tools.fleet.placement import current_fleet

    fleet = current_fleet()
    if fleet is not None:
        return fleet.workspaces
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Workspaces()
        return _DEFAULT
