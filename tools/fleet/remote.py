"""The tools' view of a sandbox fleet: a :class:`~agentrl.tools.sandbox.Sandbox` and workspaces whose
work runs on the fleet's executors.

- :class:`FleetSandbox`: ``run`` goes to any executor with room, onto its warm pool for the same
  backend, limits and backend options. ``close()`` only ends this handle (the pools are the
  executors'). The request is checked here first, as every sandbox checks it.
- :class:`FleetWorkspaces`: what :class:`~agentrl.tools.workspace.Workspaces` offers (``create``,
  ``restore``, ``remove``, ``close``, ``leftovers``), each workspace living on one executor for its
  lifetime: a group's members on the executor that holds their prepared state.
- :class:`RemoteWorkspace`: a :class:`~agentrl.tools.workspace.Workspace` whose every method runs on
  its executor. When that executor is lost, every method but ``remove`` raises
  :class:`~agentrl.tools.fleet.errors.ExecutorLostError` and ``remove`` only forgets it (its processes
  went with the executor).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentrl.tools.fleet.errors import ExecutorLostError, ExecutorUnavailableError
from agentrl.tools.sandbox.base import Capabilities, ExecResult, Sandbox, SandboxLimits
from agentrl.tools.workspace.base import ROOT, CellResult, Workspace, WorkspaceSpec

if TYPE_CHECKING:
    from agentrl.tools.fleet.admission import Slot
    from agentrl.tools.fleet.router import Fleet

__all__ = ["FleetSandbox", "FleetWorkspaces", "RemoteWorkspace"]


class FleetSandbox(Sandbox):
    """See the module doc. Built by :meth:`Fleet.sandbox`."""

    def __init__(self, fleet: Fleet, backend: str, limits: SandboxLimits, options: Mapping[str, Any]) -> None:
        super().__init__(limits)
        self.fleet = fleet
        self.backend = backend
        self.options = tuple(sorted(options.items()))
        self._capabilities: Capabilities | None = None

    async def start(self) -> None:
        """Warms a pool on one executor and keeps its capabilities (what :meth:`capabilities` reports)."""
        if self._capabilities is None:
            self._capabilities = await self.fleet.call("capabilities", self.backend, self.limits, self.options,
                                                       limit_s=self.fleet.config.start_timeout_s)

    async def run(self, code: str, *, language: str = "python", timeout_s: float | None = None) -> ExecResult:
        timeout = self._check_request(code, language, timeout_s)
        result: ExecResult = await self.fleet.call("run", self.backend, self.limits, self.options, code, language,
                                                   timeout, limit_s=timeout)
        return result

    async def close(self) -> None:
        self._closed = True

    def capabilities(self) -> Capabilities:
        """The executors' backend's capabilities (fetched by :meth:`start`), noting where it runs."""
        if self._capabilities is None:
            return Capabilities(self.backend, enforced={}, not_enforced={"all": "not started: call start() first"},
                                details={"executor": "ray"})
        base = self._capabilities
        return Capabilities(base.backend, dict(base.enforced), dict(base.not_enforced),
                            {**base.details, "executor": "ray"}, dict(base.scopes))

    async def worker_pids(self) -> list[int]:
        """Every executor's pool workers' host PIDs (executors on this host: the fleet's tests)."""
        pids: list[int] = []
        for slot in self.fleet.executors():
            pids.extend(await self.fleet.call("pool_pids", pinned=slot, admitted=False, limit_s=10.0))
        return pids


class RemoteWorkspace(Workspace):
    """See the module doc. Built by :class:`FleetWorkspaces`."""

    def __init__(self, fleet: Fleet, slot: Slot, ws_id: str, name: str, spec: WorkspaceSpec, key: str) -> None:
        super().__init__(spec, name)
        self.fleet, self.slot, self.ws_id, self.key = fleet, slot, ws_id, key

    @property
    def node(self) -> str:
        """The Ray node this workspace lives on."""
        return self.slot.node

    @property
    def executor(self) -> str:
        """The executor this workspace lives on (``<node>/<index>``)."""
        return self.slot.name

    async def _call(self, method: str, limit_s: float, /, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return await self.fleet.call("ws_call", self.ws_id, method, args, kwargs, pinned=self.slot, limit_s=limit_s)

    async def run(self, command: str, *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
                  workdir: str = ROOT) -> ExecResult:
        limit = timeout_s if timeout_s is not None else self.spec.limits.timeout_s
        result: ExecResult = await self._call("run", limit, command, timeout_s=timeout_s,
                                              env=dict(env) if env is not None else None, workdir=workdir)
        return result

    async def python(self, code: str, *, timeout_s: float | None = None) -> CellResult:
        limit = (timeout_s if timeout_s is not None else self.spec.cell_timeout_s) + self.spec.limits.timeout_s
        result: CellResult = await self._call("python", limit, code, timeout_s=timeout_s)
        return result

    async def file_op(self, op: str, **arguments: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("file_op", self.spec.limits.timeout_s, op, **arguments)
        return result

    async def digest(self, ignore: tuple[str, ...] = ()) -> str:
        return str(await self._call("digest", self.spec.limits.timeout_s, ignore))

    async def snapshot(self) -> bytes:
        return bytes(await self._call("snapshot", self.spec.limits.timeout_s))

    async def grade(self, command: str, *, files: Mapping[str, str | bytes] | None = None,
                    timeout_s: float | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        """The reward's command, run on this workspace's executor (see ``Workspace.grade``)."""
        limit = timeout_s if timeout_s is not None else self.spec.limits.timeout_s
        result: ExecResult = await self._call("grade", limit, command, files=dict(files) if files else None,
                                              timeout_s=timeout_s, env=dict(env) if env is not None else None)
        return result

    async def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        try:
            if self.slot.alive:
                await self.fleet.call("ws_remove", self.ws_id, pinned=self.slot, admitted=False,
                                      limit_s=self.spec.limits.timeout_s)
        except ExecutorUnavailableError:  # lost with its executor; nothing of it is left to remove here
            pass
        finally:
            await self.fleet.unplace_workspace(self.slot, self.key)


class FleetWorkspaces:
    """:class:`~agentrl.tools.workspace.Workspaces`'s methods on a fleet (module doc)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.live: dict[int, RemoteWorkspace] = {}
        self.stats: collections.Counter[str] = collections.Counter()

    async def create(self, spec: WorkspaceSpec, files: Mapping[str, str | bytes] | None = None) -> RemoteWorkspace:
        """A new workspace on an executor (a fork of the prepared state there)."""
        return await self._new(spec, files, None)

    async def restore(self, spec: WorkspaceSpec, files: Mapping[str, str | bytes] | None,
                      snapshot: bytes) -> RemoteWorkspace:
        """A new workspace with ``snapshot`` (from a workspace of the same backend) applied."""
        return await self._new(spec, files, snapshot)

    async def _new(self, spec: WorkspaceSpec, files: Mapping[str, str | bytes] | None,
                   snapshot: bytes | None) -> RemoteWorkspace:
        if not isinstance(spec, WorkspaceSpec):
            raise TypeError(f"FleetWorkspaces.create(spec=...): expected a WorkspaceSpec, got {type(spec).__name__}")
        slot, key = await self.fleet.place_workspace(spec, files)
        limit = spec.setup_timeout_s * max(1, len(spec.setup)) + spec.limits.timeout_s
        try:
            ws_id, name = await self.fleet.call("ws_create", spec, dict(files) if files else None, snapshot,
                                                pinned=slot, limit_s=limit)
        except BaseException:
            await asyncio.shield(self.fleet.unplace_workspace(slot, key))
            raise
        ws = RemoteWorkspace(self.fleet, slot, ws_id, name, spec, key)
        self.live[id(ws)] = ws
        self.stats["created"] += 1
        return ws

    async def remove(self, ws: Workspace) -> None:
        """Removes ``ws`` on its executor. Idempotent."""
        self.live.pop(id(ws), None)
        if not ws.removed:
            self.stats["removed"] += 1
        await ws.remove()

    async def close(self) -> None:
        """Removes every workspace this object created."""
        for ws in list(self.live.values()):
            try:
                await self.remove(ws)
            except ExecutorLostError:
                pass

    def leftovers(self) -> dict[str, int]:
        return {"workspaces": len(self.live)}
