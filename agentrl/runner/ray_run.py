"""The run on Ray: a rollout actor (scheduler + engine group) and one train actor per data-parallel
rank, placed by :class:`~agentrl.runner.placement.PlacementPlan`; the driver runs the same
:class:`~agentrl.runner.loop.Runner` as in-process runs, through proxies.

The actors only wrap plain objects (:class:`~agentrl.runner.RolloutService`,
:class:`~agentrl.runner.trainer.TrainService`). Everything the run started (engines, router, actors,
placement groups, a local Ray) is stopped when it ends, fails or is interrupted; a Ray the process
was already connected to is left running.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson

from agentrl.runner._forward import Forwarded, forwards, protocol_methods
from agentrl.runner.cluster import RayRuntime, TrainGroup, spawn
from agentrl.runner.config import RunConfig
from agentrl.runner.device_plan import trainer_resident_bytes
from agentrl.runner.devices import (
    GIB,
    DeviceMap,
    MemoryShares,
    colocated_shares,
    noset_env,
    visible_devices_env,
)
from agentrl.runner.engine_host import EngineHost, HostStarter
from agentrl.runner.loop import RolloutSide, Runner, RunnerError, RunSummary, TrainSide
from agentrl.runner.placement import PlacedGroups, PlacementPlan
from agentrl.runner.rundir import RunDirectory
from agentrl.runner.sides import ActorProxy

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from agentrl.rollout.engine import EngineStarter
    from agentrl.rollout.groups import GroupFilter
    from agentrl.runner._run_plan import RunPlan
    from agentrl.runner.cpu import CpuPlan
    from agentrl.runner.envs import RowFactory
    from agentrl.runner.rollout_service import RolloutService
    from agentrl.runner.weight_transports import Pusher

__all__ = ["GroupPusher", "GroupTrainer", "RolloutActor", "TrainRank", "check_weights_folder", "run_on_ray",
           "start_sides"]

logger = logging.getLogger(__name__)


def _awaiting_service(name: str) -> Callable[..., Awaitable[object]]:
    async def method(self: RolloutActor, *args: Any, **kwargs: Any) -> object:
        return await getattr(self.service, name)(*args, **kwargs)

    return method


@forwards((*protocol_methods(RolloutSide), "active_requests"), _awaiting_service)
class RolloutActor:
    """The rollout actor: builds a :class:`RolloutService` in its own event loop; each
    :class:`~agentrl.runner.loop.RolloutSide` method (and ``active_requests``) is the service's."""

    def __init__(self, config: dict[str, Any], env_factory: RowFactory, group_filter: GroupFilter | None = None,
                 cpu: CpuPlan | None = None) -> None:
        self.config = RunConfig.from_dict(config)
        self.env_factory, self.group_filter, self.cpu = env_factory, group_filter, cpu
        self.service: RolloutService | None = None

    async def setup(self, starters: list[EngineStarter] | None = None, engine_fraction: float | None = None,
                    teacher_starters: list[EngineStarter] | None = None) -> int:
        """Starts the router and the engines (each through its host's ``starter`` when given; a
        distillation teacher's own engines through ``teacher_starters``) and builds the service;
        returns this actor's pid."""
        from agentrl.runner.rollout_service import RolloutService

        self.service = await RolloutService.launch(self.config, self.env_factory, group_filter=self.group_filter,
                                                   cpu=self.cpu, starters=starters, engine_fraction=engine_fraction,
                                                   teacher_starters=teacher_starters)
        import os

        return os.getpid()

    def _ready(self) -> RolloutService:
        if self.service is None:
            raise RuntimeError("RolloutActor: setup() has not built the rollout service")
        return self.service

    async def engine_versions(self) -> list[str]:
        """The weight version each engine reports (``/model_info``)."""
        group = self._ready().group
        return [await e.weight_version() for e in group.in_rotation()] if group is not None else []

    async def set_pusher(self, pusher: Pusher) -> None:
        """The trainer's weight sender (``sync.method`` tensor or distributed)."""
        self._ready().set_pusher(pusher)

    async def router_workers(self) -> list[str]:
        """The engine URLs the router has registered."""
        group = self._ready().group
        return [str(w.get("url")) for w in await group.router.workers()] if group is not None else []

    async def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    async def shutdown(self) -> None:
        if self.service is not None:
            await self.service.shutdown()
            self.service = None


def _on_service(name: str) -> Callable[..., object]:
    def method(self: TrainRank, *args: Any, **kwargs: Any) -> object:
        return getattr(self.service, name)(*args, **kwargs)

    return method


@forwards((*protocol_methods(TrainSide), "push_weights"), _on_service)
class TrainRank:
    """One train actor's plain object: the trainer service built from the run config; each
    :class:`~agentrl.runner.loop.TrainSide` method (and ``push_weights``) is the service's."""

    def __init__(self, config: dict[str, Any], threads: int | None = None) -> None:
        from agentrl.runner.trainer import TrainService

        self.service = TrainService.from_config(RunConfig.from_dict(config), threads=threads)

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def write_marker(self, path: str, token: str) -> str:
        """Writes ``token`` to ``path`` (folders made); returns this rank's node id."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(token, encoding="utf-8")
        return self.node_id()


def _every_rank(name: str) -> Callable[..., Awaitable[object]]:
    async def method(self: GroupTrainer, *args: Any, **kwargs: Any) -> object:
        results = await asyncio.to_thread(self.group.call, name, *args, **kwargs)
        return results[0]

    return method


@forwards(protocol_methods(TrainSide), _every_rank)
class GroupTrainer(Forwarded):
    """The runner's trainer side over a :class:`TrainGroup`: every :class:`~agentrl.runner.loop.TrainSide`
    call runs on every rank (the collectives need them all); the result is rank 0's."""

    def __init__(self, group: TrainGroup) -> None:
        self.group = group

    async def node_ids(self) -> list[str]:
        return [str(x) for x in await asyncio.to_thread(self.group.call, "node_id")]

    async def write_marker(self, path: str, token: str) -> str:
        """Rank 0 writes ``token`` to ``path``; returns its node id."""
        return str(await asyncio.to_thread(self.group.call_rank, 0, "write_marker", path, token))

    async def group_env(self) -> list[Any]:
        """Every rank's ``env()`` (the placement tests' recording ranks)."""
        return list(await asyncio.to_thread(self.group.call, "env"))


class GroupPusher:
    """:class:`~agentrl.runner.weight_transports.Pusher` over the train actors, for the rollout actor:
    every rank runs ``push_weights`` (a Megatron trainer gathers collectively); rank 0's report."""

    def __init__(self, actors: Sequence[Any]) -> None:
        self.actors = list(actors)

    async def push(self, version: int, targets: list[Any], *, flush: bool, exact: bool) -> dict[str, Any]:
        refs = [a.call.remote("push_weights", (version, targets), {"flush": flush, "exact": exact})
                for a in self.actors]
        results = await asyncio.gather(*refs)
        return dict(results[0])


class Sides:
    """The started actors, the run's device map, and what to stop when the run ends."""

    def __init__(self, runtime: RayRuntime, placed: PlacedGroups, rollout: ActorHandle[RolloutActor],
                 trainer: GroupTrainer | None, hosts: Sequence[ActorHandle[EngineHost]] = (),
                 device_map: DeviceMap | None = None) -> None:
        self.runtime, self.placed, self.rollout_handle, self.trainer = runtime, placed, rollout, trainer
        self.hosts = list(hosts)
        self.device_map = device_map
        self.warmup: dict[str, Any] = {}  # the warm-up's report, when the train group ran one
        self.teacher_hosts: list[ActorHandle[EngineHost]] = []  # a distillation teacher's own engines' hosts

    @property
    def rollout(self) -> ActorProxy:
        return ActorProxy(self.rollout_handle)

    async def stop(self) -> None:
        import ray

        try:
            try:
                await self.rollout_handle.shutdown.remote()  # stops the engines through their hosts
            finally:
                ray.kill(self.rollout_handle)
                await _stop_hosts([*self.hosts, *self.teacher_hosts])
                if self.trainer is not None:
                    await asyncio.to_thread(self.trainer.group.teardown)
        finally:
            self.placed.remove()
            self.runtime.shutdown()


async def _stop_hosts(hosts: Sequence[Any]) -> None:
    """Stops every engine a host still runs (a failed start leaves some), then the host actors."""
    import ray

    await asyncio.gather(*(h.stop.remote() for h in hosts), return_exceptions=True)
    for host in hosts:
        ray.kill(host)


def _colocated_on_accelerator(config: RunConfig) -> bool:
    return config.cluster.placement == "colocated" and config.cluster.accelerator != "cpu"


async def _engine_shares(config: RunConfig, hosts: Sequence[Any]) -> MemoryShares | None:
    """Colocated on an accelerator: the engines' share of each device (the device's memory as one host
    per node reads it, the smallest of the nodes', else ``cluster.accelerator_memory_gib``); ``None``
    otherwise or when unknown."""
    if not hosts or not _colocated_on_accelerator(config):
        return None
    # one host per node reads (each read imports torch there): the nodes' devices may differ, a node's do not
    nodes = await asyncio.gather(*(h.where.remote() for h in hosts))
    readers: dict[str, Any] = {}
    for host, where in zip(hosts, nodes, strict=True):
        readers.setdefault(where["node"], host)  # the node's first host
    read = [m for m in await asyncio.gather(*(h.device_memory_bytes.remote() for h in readers.values())) if m]
    capacity = min(read) if read else (int(config.cluster.accelerator_memory_gib * GIB)
                                       if config.cluster.accelerator_memory_gib else None)
    resident = trainer_resident_bytes(config)
    if capacity is None or resident is None:
        return None
    return colocated_shares(capacity, resident, engine_fraction=config.rollout.engines.mem_fraction_static)


async def start_sides(config: RunConfig, env_factory: RowFactory, *, group_filter: GroupFilter | None = None,
                      cpu: CpuPlan | None = None,
                      rollout_only: bool = False, node_resource_engines: str | None = None,
                      node_resource_trainer: str | None = None, runtime: RayRuntime | None = None,
                      warmup_dir: str | None = None, trainer_cls: type = TrainRank,
                      train_device: str | None = None, host_cls: type = EngineHost) -> Sides:
    """Starts Ray (or reuses it), places the engines' hosts, the rollout actor and the train group
    (:class:`~agentrl.runner.placement.PlacementPlan`), starts every engine on its own devices and
    records the :class:`~agentrl.runner.devices.DeviceMap`. With ``warmup_dir`` the train group runs
    the config's warm-up while the engines boot; colocated on an accelerator the engines boot first
    (SGLang sizes its memory against what is free when it starts) and the trainer builds after.

    The actors get the config with every path made absolute here (each would resolve a relative path
    in its own working directory, on its own node). ``trainer_cls`` (built on every rank as
    ``trainer_cls(config_dict, threads)``), ``train_device`` (``None``: the cluster's accelerator) and
    ``host_cls`` (an :class:`EngineHost`) let a test record or alter what each actor does."""
    runtime = runtime or run_runtime(config)
    config = config.with_absolute_paths()
    placed = None
    rollout = None
    hosts: list[Any] = []
    teacher_hosts: list[Any] = []
    try:
        plan = PlacementPlan.for_run(config, node_resource_engines=node_resource_engines,
                                     node_resource_trainer=node_resource_trainer)
        placed = await asyncio.to_thread(plan.create)
        accelerator = config.cluster.accelerator
        hosts = [spawn(host_cls, accelerator, e, cpu, placement=placed.engine(e), max_concurrency=8)
                 for e in range(plan.engines)]
        # a distillation teacher's own engines, on devices of their own (CPU cores after the rollout's)
        teacher_hosts = [spawn(host_cls, accelerator, plan.engines + t, cpu, placement=placed.teacher(t),
                               max_concurrency=8) for t in range(plan.teacher_engines)]
        rollout = spawn(RolloutActor, config.to_dict(), env_factory, group_filter, cpu, placement=placed.rollout(),
                        max_concurrency=64)
        where_all = list(await asyncio.gather(*(h.where.remote() for h in (*hosts, *teacher_hosts))))
        where, teacher_where = where_all[:plan.engines], where_all[plan.engines:]
        rollout_node = await rollout.node_id.remote()
        shares = await _engine_shares(config, hosts)
        starters = [HostStarter(h, "127.0.0.1" if w["node"] == rollout_node else w["ip"])
                    for h, w in zip((*hosts, *teacher_hosts), where_all, strict=True)]
        # the engines boot while the train actors build the model (colocated on an accelerator: before)
        booting: Any = rollout.setup.remote(starters[:plan.engines] if hosts else None,
                                            shares.engine_fraction if shares is not None else None,
                                            starters[plan.engines:] if teacher_hosts else None)
        if _colocated_on_accelerator(config):
            await booting
        trainer = None
        rank_places: list[tuple[str, str | None]] = []
        if not rollout_only:
            threads = cpu.trainer_threads if cpu is not None else None
            env = {"OMP_NUM_THREADS": str(threads)} if threads is not None else None
            group = await asyncio.to_thread(
                TrainGroup.start, trainer_cls, config.to_dict(), threads, world_size=config.train.world_size,
                placement=placed, device=train_device or config.cluster.train_device, env_vars=env,
                rank_env=_rank_env(plan, where, accelerator))
            trainer = GroupTrainer(group)
            rank_places = group.devices(accelerator)
        device_map = None
        if trainer is not None:
            device_map = DeviceMap.from_assignments(plan, [(w["node"], w["devices"]) for w in where], rank_places,
                                                    memory=shares,
                                                    teachers=[(w["node"], w["devices"]) for w in teacher_where])
        warm: dict[str, Any] = {}
        if trainer is not None and warmup_dir is not None:
            warm = await trainer.warmup(warmup_dir)
        await booting
        sides = Sides(runtime, placed, rollout, trainer, hosts, device_map)
        sides.warmup, sides.teacher_hosts = warm, teacher_hosts
        return sides
    except BaseException:
        import ray

        if rollout is not None:
            try:
                await rollout.shutdown.remote()
            finally:
                ray.kill(rollout)
        await _stop_hosts([*hosts, *teacher_hosts])
        if placed is not None:
            placed.remove()
        runtime.shutdown()
        raise


def _rank_env(plan: PlacementPlan, where: Sequence[dict[str, Any]], accelerator: str) -> list[dict[str, str]] | None:
    """Per trainer rank, the environment that gives a colocated rank its device: the engine host
    holds the bundle's accelerators, so Ray names none to the rank; the map does."""
    if accelerator == "cpu":
        return None
    out: list[dict[str, str]] = []
    for slot in plan.trainer_slots:
        if slot.colocated_with is None:
            out.append({})
            continue
        engine, tp_rank = slot.colocated_with
        device = where[engine]["devices"][tp_rank]
        out.append({**noset_env(accelerator), **visible_devices_env(accelerator, [device])})
    return out


async def check_weights_folder(sides: Sides, folder: Path) -> None:
    """Disk weight sync needs the trainer's export folder on every engine's node, at the same path:
    trainer rank 0 writes a marker into ``folder`` and every engine host must read it back. Raises
    :class:`~agentrl.runner.loop.RunnerError` naming the engines and nodes that cannot, and the ways out.
    A no-op without launched engines or a trainer."""
    if not sides.hosts or sides.trainer is None:
        return
    marker, token = folder / ".agentrl-shared-folder", secrets.token_hex(8)
    writer = await sides.trainer.write_marker(str(marker), token)
    seen: list[bool] = await asyncio.gather(*(h.reads.remote(str(marker), token) for h in sides.hosts))
    blind = [e for e, ok in enumerate(seen) if not ok]
    if blind:
        where: list[dict[str, Any]] = await asyncio.gather(*(sides.hosts[e].where.remote() for e in blind))
        nodes = sorted({w["node"] for w in where})
        raise RunnerError(
            f"disk weight sync: engine(s) {blind} on node(s) {nodes} cannot read {str(marker)!r}, which trainer "
            f"rank 0 wrote on node {writer}; every engine loads each weight version from that folder. Expected a "
            "filesystem shared by trainer rank 0 and every engine node at the same path (put logging.run_dir on "
            "it), or a weight sync that does not go through disk")
    marker.unlink(missing_ok=True)


def _record_device_map(sides: Sides, run_dir: RunDirectory) -> None:
    if sides.device_map is None:
        return
    (run_dir.root / "device_map.json").write_bytes(orjson.dumps(sides.device_map.to_dict(), option=orjson.OPT_INDENT_2))
    for line in sides.device_map.format():
        logger.info("device map: %s", line)


async def run_on_ray(plan: RunPlan) -> RunSummary:
    """The run on Ray; with ``plan.warmup_dir`` the train group runs the config's warm-up while the engines
    boot, reporting there."""
    from agentrl.runner.api import _signals_cancel_current_task

    config = plan.config
    runtime = run_runtime(config)
    # after Ray's own start-up (which installs a SIGTERM handler that aborts the process): a signal
    # during the start-up and the warm-up cancels too, so what was started is stopped
    with _signals_cancel_current_task():
        sides = await start_sides(config, plan.env_factory, group_filter=plan.group_filter, cpu=plan.cpu,
                                  rollout_only=plan.rollout_only, warmup_dir=plan.warmup_dir, runtime=runtime)
        try:
            _record_device_map(sides, plan.run_dir)
            method = config.sync_method()
            if method == "disk":
                await check_weights_folder(sides, config.with_absolute_paths().run_dir() / "weights")
            elif sides.trainer is not None:
                await sides.rollout.set_pusher(GroupPusher(sides.trainer.group.actors))
            runner = Runner(cast("RolloutSide", sides.rollout), sides.trainer, plan.settings, run_dir=plan.run_dir,
                            checkpointer=plan.checkpointer, callbacks=plan.callbacks, resume=plan.resume,
                            warmup=sides.warmup)
            return await runner.run()
        finally:
            await sides.stop()


def run_runtime(config: RunConfig) -> RayRuntime:
    """The run's Ray: a local one with its own namespace (and a small object store), or ``cluster.ray_address``."""
    return RayRuntime.start(address=config.cluster.ray_address, namespace=f"agentrl-{config.hash()[:12]}",
                            object_store_memory=256 * 1024 * 1024 if config.cluster.ray_address is None else None)
