"""The router of a sandbox fleet: executors on the cluster's nodes, calls routed and admitted to them.

:class:`Fleet` lives in the process that runs the episodes (the rollout actor). It places
``executors_per_node`` executors (:class:`~agentrl.tools.fleet.executor.ExecutorActor`) on every node
that carries the config's resource (CPU-only nodes first, :func:`select_nodes`), routes each call
(:mod:`~agentrl.tools.fleet.admission`), and hands out the tools' view of it:
:meth:`Fleet.sandbox` (a :class:`~agentrl.tools.sandbox.Sandbox` whose calls go to any executor with
room) and :attr:`Fleet.workspaces` (workspaces that live on one executor each, a group's members on
the executor that holds their prepared state). Every ``refresh_s`` it looks at the nodes: an executor
on a node that left is lost (its calls and workspaces fail ``executor_lost``), a node that joined gets
executors, a lost executor on a live node is replaced. Figures per node: :meth:`Fleet.take_metrics`.

Start-up: each executor's actor must answer ``ready`` (which runs one program on the probe backend)
within ``start_timeout_s``, else it is killed and started again, ``start_retries`` times.
:meth:`Fleet.start` fails, naming the nodes and their resources, when no executor starts at all.

Example::

    fleet = Fleet(FleetConfig(executor="ray", resource="sandbox", executors_per_node=2))
    await fleet.start()                      # ray.init() was called: a cluster with 'sandbox' nodes
    async with fleet.sandbox("bwrap", SandboxLimits(timeout_s=5)) as sandbox:
        print((await sandbox.run("print(1)")).stdout)
    ws = await fleet.workspaces.create(WorkspaceSpec(), {"a.txt": "x"})
    await fleet.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl.tools.fleet.admission import Admission, Slot
from agentrl.tools.fleet.config import FleetConfig
from agentrl.tools.fleet.errors import ExecutorLostError, ExecutorUnavailableError
from agentrl.tools.fleet.executor import ExecutorSettings
from agentrl.tools.fleet.links import ExecutorLink, start_ray_executor
from agentrl.tools.fleet.metrics import FleetMetrics
from agentrl.tools.sandbox.base import SandboxLimits
from agentrl.tools.workspace.base import WorkspaceSpec, files_key, task_files

__all__ = ["ACCELERATORS", "Fleet", "NodeList", "Starter", "select_nodes"]

log = logging.getLogger(__name__)

ACCELERATORS: tuple[str, ...] = ("GPU", "NPU", "TPU", "HPU", "neuron_cores")
"""Ray resources that make a node an accelerator node (the fleet prefers the others)."""

NodeList = Callable[[], Sequence[Mapping[str, Any]]]
"""The cluster's nodes as ``ray.nodes()`` lists them (``NodeID``, ``Alive``, ``Resources``)."""
Starter = Callable[[int, str, ExecutorSettings, int], ExecutorLink]
"""Starts executor ``index`` on a node: ``(index, node id, settings, max concurrency) -> link``."""

_CONTROL_CALLS = 16  # calls the router makes besides the admitted ones (ready, remove, stats, close)


def select_nodes(nodes: Sequence[Mapping[str, Any]], resource: str | None, cpu_nodes_first: bool) -> list[str]:
    """The ids of the alive nodes that get executors: those carrying ``resource`` (``None``: all); of
    them, when ``cpu_nodes_first`` and some have no accelerator (:data:`ACCELERATORS`), only those."""
    marked = [n for n in nodes if n.get("Alive") and (resource is None or float(n.get("Resources", {}).get(resource, 0)) > 0)]
    if cpu_nodes_first:
        plain = [n for n in marked if not any(float(n.get("Resources", {}).get(a, 0)) > 0 for a in ACCELERATORS)]
        if plain:
            marked = plain
    return [str(n["NodeID"]) for n in marked]


def _ray_nodes() -> list[dict[str, Any]]:
    import ray

    if not ray.is_initialized():
        raise RuntimeError("sandbox.executor='ray': this process is not connected to Ray; expected a run on Ray "
                           "(agentrl.run with use_ray=True, the default) or ray.init(address=...) before the fleet starts")
    return list(ray.nodes())


def _ray_starter(index: int, node: str, settings: ExecutorSettings, max_concurrency: int) -> ExecutorLink:
    return start_ray_executor(index, node, settings, max_concurrency=max_concurrency)


class Fleet:
    """See the module doc. ``nodes``/``starter``: how nodes are listed and executors started (default:
    Ray's); ``settings``: what each executor gets (default: from ``config``); ``probe_backend``: the
    sandbox backend each executor must be able to run at start-up (``None``: no probe)."""

    def __init__(self, config: FleetConfig, *, nodes: NodeList | None = None, starter: Starter | None = None,
                 settings: ExecutorSettings | None = None, probe_backend: str | None = "bwrap") -> None:
        if not isinstance(config, FleetConfig):
            raise TypeError(f"Fleet(config=...): expected a FleetConfig, got {type(config).__name__}")
        if config.executor != "ray" and nodes is None:
            raise ValueError(f"Fleet: config.executor={config.executor!r}; a fleet places executors on Ray nodes, "
                             "expected executor='ray'")
        self.config = config
        self.settings = settings or ExecutorSettings(concurrency=config.concurrency,
                                                     start_timeout_s=config.start_timeout_s,
                                                     start_retries=config.start_retries, probe_backend=probe_backend)
        self._nodes = nodes or _ray_nodes
        self._starter = starter or _ray_starter
        self.admission = Admission(config.queue_limit)
        self.metrics = FleetMetrics()
        self._starting: dict[str, int] = {}
        self._next_index = 0
        self._room = asyncio.Condition()
        self._refresher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.node_problems: dict[str, str] = {}
        from agentrl.tools.fleet.remote import FleetWorkspaces

        self.workspaces = FleetWorkspaces(self)

    # -- executors ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Places the executors (module doc); raises :class:`ExecutorUnavailableError` when none starts."""
        if self._closed:
            raise ExecutorUnavailableError("Fleet.start: the fleet is closed", reason="no_executor")
        nodes = await self.refresh()
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if not self.admission.live():
            described = "; ".join(f"{str(n.get('NodeID'))[:8]} {'alive' if n.get('Alive') else 'dead'} "
                                  f"{dict(n.get('Resources', {}))}" for n in nodes) or "none"
            problems = "; ".join(f"{k[:8]}: {v}" for k, v in self.node_problems.items())
            raise ExecutorUnavailableError(
                f"sandbox fleet: no executor started. Nodes: {described}. "
                + (f"Start-up failures: {problems}. " if problems else "")
                + (f"Expected a node started with the Ray resource {self.config.resource!r} "
                   f"(ray start ... --resources '{{\"{self.config.resource}\": 1}}')" if self.config.resource else ""),
                reason="start_failed" if problems else "no_executor")
        if self._refresher is None:
            self._refresher = asyncio.ensure_future(self._refresh_loop())

    async def refresh(self) -> list[Mapping[str, Any]]:
        """Looks at the nodes once: loses executors on nodes that left, starts them where missing."""
        nodes = list(await asyncio.to_thread(self._nodes))
        alive = {str(n["NodeID"]) for n in nodes if n.get("Alive")}
        for slot in self.admission.live():
            if slot.node not in alive:
                self._lose(slot, f"executor {slot.name}: its node {slot.node[:8]} left the cluster")
        self.admission.forget()
        for node in select_nodes(nodes, self.config.resource, self.config.cpu_nodes_first):
            have = sum(1 for s in self.admission.live() if s.node == node) + self._starting.get(node, 0)
            for _ in range(self.config.executors_per_node - have):
                self._starting[node] = self._starting.get(node, 0) + 1
                task = asyncio.ensure_future(self._start_one(node))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        return nodes

    async def _refresh_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.refresh_s)
            try:
                await self.refresh()
            except Exception as exc:  # the cluster did not answer this time: try again at the next period
                log.warning("sandbox fleet: looking at the nodes failed: %s", exc)

    async def _start_one(self, node: str) -> None:
        try:
            for _ in range(self.config.start_retries + 1):
                if self._closed:
                    return
                index, self._next_index = self._next_index, self._next_index + 1
                link = self._starter(index, node, self.settings, self.config.concurrency + _CONTROL_CALLS)
                self.metrics.count(node, "starts")
                try:
                    info, _ = await asyncio.wait_for(link.call("ready"), self.config.start_timeout_s)
                    if info.get("node") not in (None, node):
                        raise ExecutorUnavailableError(f"executor {index} runs on node {info['node']}, not on {node}",
                                                       reason="start_failed", node=node)
                except Exception as exc:
                    self.metrics.count(node, "start_failures")
                    self.node_problems[node] = f"{type(exc).__name__}: {exc}"[:500]
                    log.warning("sandbox fleet: executor %d on node %s did not start: %s", index, node[:8], exc)
                    link.kill()
                    continue
                if self._closed:
                    link.kill()
                    return
                self.node_problems.pop(node, None)
                self.admission.add(Slot(index, node, link, self.config.concurrency))
                await self._notify_room()
                return
        finally:
            self._starting[node] -= 1

    def _lose(self, slot: Slot, message: str) -> None:
        if slot.alive:
            self.metrics.count(slot.node, "lost")
            log.warning("sandbox fleet: %s", message)
        self.admission.lose(slot, message)
        slot.link.kill()

    def executors(self) -> list[Slot]:
        """The live executors."""
        return self.admission.live()

    # -- calls ---------------------------------------------------------------------------------------
    async def call(self, method: str, *args: Any, pinned: Slot | None = None, limit_s: float | None = None,
                   admitted: bool = True, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` on an executor (``pinned``, or any with room), admitted (module doc)
        unless ``admitted=False`` (removals: they free room). ``limit_s``: the call's own time limit; the
        fleet waits ``call_grace_s`` more before the call fails ``call_deadline``."""
        if self._closed:
            raise ExecutorUnavailableError("the sandbox fleet is closed", reason="no_executor")
        loop = asyncio.get_running_loop()
        queued = loop.time()
        if admitted:
            try:
                slot = await self.admission.acquire(pinned, self.config.admission_timeout_s)
            except ExecutorUnavailableError as exc:
                self.metrics.count(exc.node or (pinned.node if pinned else None), "failures")
                raise
        else:
            assert pinned is not None, "an unadmitted call names its executor"
            slot = pinned
            slot.inflight += 1
        if admitted:  # the figures are the tools' calls, not the router's own (removals, stats, close)
            self.metrics.waited(slot.node, loop.time() - queued)
        limit = None if limit_s is None else limit_s + self.config.call_grace_s
        try:
            value, inside = await asyncio.wait_for(slot.link.call(method, *args, **kwargs), limit)
        except asyncio.TimeoutError:
            self.metrics.count(slot.node, "failures")
            raise ExecutorUnavailableError(
                f"executor {slot.name} did not answer {method} within {limit:g} s (the call's limit plus "
                f"call_grace_s={self.config.call_grace_s:g})", reason="call_deadline", node=slot.node) from None
        except ExecutorLostError:
            self.metrics.count(slot.node, "failures")
            self._lose(slot, f"executor {slot.name} on node {slot.node[:8]} was lost")
            raise
        finally:
            self.admission.release(slot)
        if admitted:
            self.metrics.ran(slot.node, inside)
        return value

    def sandbox(self, backend: str = "bwrap", limits: SandboxLimits | None = None, **options: Any) -> Any:
        """A :class:`~agentrl.tools.fleet.remote.FleetSandbox`: ``run`` on any executor's warm pool for
        ``backend``, ``limits`` and the backend's ``options`` (``pool_size``/``max_concurrency`` are the
        executors' own: ``concurrency``)."""
        from agentrl.tools.fleet.remote import FleetSandbox

        options = {k: v for k, v in options.items() if k not in ("pool_size", "max_concurrency")}
        return FleetSandbox(self, backend, limits or SandboxLimits(), options)

    # -- workspaces ----------------------------------------------------------------------------------
    async def place_workspace(self, spec: WorkspaceSpec, files: Mapping[str, str | bytes] | None) -> tuple[Slot, str]:
        """The executor a new workspace for ``spec`` and ``files`` goes to (its place reserved): the one
        holding that prepared state if it has room, else the one with the fewest workspaces; waits for
        room up to the admission deadline."""
        key = files_key(spec, task_files(files or {}))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.admission_timeout_s
        async with self._room:
            while True:
                open_ = [s for s in self.admission.live() if s.workspaces < self.config.max_workspaces]
                if open_:
                    warm = [s for s in open_ if s.prepared[key] > 0]
                    slot = min(warm or open_, key=lambda s: (s.workspaces, s.inflight))
                    slot.workspaces += 1
                    slot.prepared[key] += 1
                    return slot, key
                left = deadline - loop.time()
                if left <= 0 or self._closed:
                    live = self.admission.live()
                    raise ExecutorUnavailableError(
                        f"no executor had room for a workspace within {self.config.admission_timeout_s:g} s "
                        f"({len(live)} executor(s), max_workspaces={self.config.max_workspaces} each)",
                        reason="admission_timeout" if live else "no_executor")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._room.wait(), left)

    async def unplace_workspace(self, slot: Slot, key: str) -> None:
        slot.workspaces -= 1
        slot.prepared[key] -= 1
        if slot.prepared[key] <= 0:
            del slot.prepared[key]
        await self._notify_room()

    async def _notify_room(self) -> None:
        async with self._room:
            self._room.notify_all()

    # -- figures and the end -------------------------------------------------------------------------
    def take_metrics(self) -> dict[str, float]:
        """Per-node figures since the last call (:mod:`~agentrl.tools.fleet.metrics`)."""
        return self.metrics.take(len(self.admission.live()))

    async def executor_stats(self) -> list[dict[str, Any]]:
        """Each live executor's own counts and leftovers (``SandboxExecutor.stats``), with its node."""
        out = []
        for slot in self.admission.live():
            try:
                stats = await self.call("stats", pinned=slot, admitted=False, limit_s=10.0)
            except ExecutorUnavailableError:
                continue
            out.append({**stats, "node": slot.node, "executor": slot.name})
        return out

    async def close(self) -> None:
        """Removes every workspace, closes every executor's pools and stops the executors. Idempotent."""
        if self._closed:
            return
        await self.workspaces.close()
        self._closed = True
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

        async def stop(slot: Slot) -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(slot.link.call("close"), 30.0)
            slot.link.kill()

        await asyncio.gather(*(stop(s) for s in self.admission.live()))
        for slot in self.admission.live():
            self.admission.lose(slot, "the sandbox fleet was closed")
        await self._notify_room()
