"""Ray for a run: the runtime (:class:`RayRuntime`), actors wrapping plain objects (:func:`spawn`) and
a data-parallel group of train actors joined by ``torch.distributed`` (:class:`TrainGroup`).

Core objects stay plain classes that work without Ray; these helpers only wrap them. Ray is imported
when first used, so importing :mod:`agentrl.runner` stays cheap.

- :meth:`RayRuntime.start` starts a local Ray (per-run ``temp_dir`` and ``namespace``, no
  dashboard, a small object store if asked) or connects to ``address``; when Ray is already
  initialised in the process (a test session's cluster, a notebook) it is reused and left running.
  ``shutdown()`` stops only what this object started; it never runs ``ray stop`` (which would kill
  every Ray of the user on the host).
- :func:`spawn` turns a class into an actor placed on a bundle (:class:`ActorPlacement`), with
  environment variables for its process (thread counts) and ``max_concurrency``; a class with
  ``async def`` methods becomes an asyncio actor.
- :class:`TrainGroup` starts one actor per data-parallel rank, sets up ``torch.distributed`` (gloo on
  CPU, NCCL on CUDA, HCCL on Ascend) on a rendezvous address chosen from rank 0's node, builds the
  plain object on every rank after that, and runs ``call(method, ...)`` on all ranks.

Example::

    with RayRuntime.start(namespace="run-1", num_cpus=2, object_store_memory=128 << 20) as runtime:
        group = TrainGroup.start(Trainer, model_path, world_size=2, device="cpu")
        losses = group.call("train_step", batch)        # one result per rank
        group.teardown()
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import psutil

from agentrl._reaper import reap_with_this_process, unreap
from agentrl.runner.placement import ActorPlacement, BundleGroup, PlacedGroups, PlacementError

if TYPE_CHECKING:
    from ray.actor import ActorHandle
    from ray.util.placement_group import PlacementGroup

__all__ = ["RayRuntime", "TrainGroup", "TrainGroupError", "spawn"]

logger = logging.getLogger(__name__)

# Set (unless the user set them) before Ray is imported: no token-auth warning on every init, no usage
# reporting, and every actor's log lines kept (deduplication hides per-rank differences).
QUIET_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
# Ray puts Unix sockets at <temp_dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store: 64
# characters after the folder, and a socket path must fit in 107 bytes.
_SOCKET_SUFFIX = 64
_SOCKET_LIMIT = 107
_MIN_OBJECT_STORE = 75 * 1024 * 1024  # Ray refuses smaller stores


def _quiet_ray() -> None:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)


def _check_temp_dir(temp_dir: Path) -> None:
    limit = _SOCKET_LIMIT - _SOCKET_SUFFIX
    if len(str(temp_dir)) > limit:
        raise ValueError(
            f"temp_dir={str(temp_dir)!r} is {len(str(temp_dir))} characters: Ray's Unix sockets under it would "
            f"pass the {_SOCKET_LIMIT}-byte socket path limit; expected at most {limit} characters "
            "(e.g. tempfile.mkdtemp(prefix='ray-', dir='/tmp'), or None for such a folder)")


def _short_temp_root() -> str | None:
    """``/tmp`` where it exists: the system temp dir can be too long for sockets (macOS ``/var/folders/...``)."""
    return "/tmp" if os.path.isdir("/tmp") else None


class RayRuntime:
    """The Ray of one run. Build with :meth:`start`; use as a context manager or call :meth:`shutdown`.

    ``owns_cluster``: this object started the local Ray processes (``shutdown`` stops them);
    ``connected``: it connected this process to Ray (``shutdown`` disconnects); ``reused``: Ray was
    already initialised here (``shutdown`` leaves it alone). ``start_s``/``shutdown_s``: seconds taken.
    """

    def __init__(self, *, namespace: str, address: str, temp_dir: Path | None, owns_cluster: bool,
                 connected: bool, remove_temp_dir: bool, start_s: float) -> None:
        self.namespace = namespace
        self.address = address
        self.temp_dir = temp_dir
        self.owns_cluster = owns_cluster
        self.connected = connected
        self.reused = not connected
        self.start_s = start_s
        self.shutdown_s: float | None = None
        self._remove_temp_dir = remove_temp_dir
        self._ray_processes: list[int] = []  # the local Ray's processes this runtime started

    @classmethod
    def start(
        cls,
        *,
        address: str | None = None,
        temp_dir: Path | str | None = None,
        namespace: str = "agentrl",
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        resources: Mapping[str, float] | None = None,
        object_store_memory: int | None = None,
        log_to_driver: bool = False,
        runtime_env: Mapping[str, Any] | None = None,
    ) -> RayRuntime:
        """Start a local Ray (``address`` ``None``), connect to ``address``, or reuse the process's Ray.

        ``temp_dir`` ``None``: a fresh short folder in the system temp dir, removed by ``shutdown``.
        ``num_cpus``/``num_gpus``/``resources``/``object_store_memory`` size a local Ray (``None``: Ray
        detects them; the object store then takes ~30% of RAM, so tests should pass a small one).
        """
        _quiet_ray()
        import ray

        if object_store_memory is not None and object_store_memory < _MIN_OBJECT_STORE:
            raise ValueError(f"object_store_memory={object_store_memory}: expected at least "
                             f"{_MIN_OBJECT_STORE} bytes (Ray's minimum, 75 MiB)")
        if temp_dir is not None:
            _check_temp_dir(Path(temp_dir).absolute())
        t0 = time.perf_counter()
        if ray.is_initialized():
            if runtime_env:
                raise ValueError(f"runtime_env={dict(runtime_env)!r}: this process is already connected to Ray, "
                                 "whose job-level runtime_env is fixed; expected runtime_env=None here "
                                 "(call ray.shutdown() first, or start the run in a fresh process)")
            return cls._reuse(address, namespace, t0)
        common: dict[str, Any] = {"namespace": namespace, "logging_level": logging.WARNING,
                                  "log_to_driver": log_to_driver,
                                  "runtime_env": dict(runtime_env) if runtime_env else None}
        if address is not None:
            ray.init(address=address, **common)
            return cls(namespace=namespace, address=_gcs_address(), temp_dir=None, owns_cluster=False,
                       connected=True, remove_temp_dir=False, start_s=time.perf_counter() - t0)
        created = temp_dir is None
        folder = Path(tempfile.mkdtemp(prefix="ray-", dir=_short_temp_root())) if temp_dir is None \
            else Path(temp_dir).absolute()
        _check_temp_dir(folder)
        folder.mkdir(parents=True, exist_ok=True)
        before = {p.pid for p in psutil.Process().children()}
        try:
            # "local": a new Ray even when RAY_ADDRESS names a running one.
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus,
                     resources=dict(resources) if resources else None, object_store_memory=object_store_memory, include_dashboard=False,
                     _temp_dir=str(folder), **common)
        except BaseException:
            if created:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        runtime = cls(namespace=namespace, address=_gcs_address(), temp_dir=folder, owns_cluster=True,
                      connected=True, remove_temp_dir=created, start_s=time.perf_counter() - t0)
        # Ray's own processes (GCS, raylet and their agents): a driver killed by SIGKILL runs no
        # shutdown, and some of Ray's agents outlive it; this process's reaper stops them then
        started = [p for p in psutil.Process().children() if p.pid not in before]
        runtime._ray_processes = sorted({q.pid for p in started for q in _with_descendants(p)})
        for pid in runtime._ray_processes:
            reap_with_this_process(pid)
        return runtime

    @classmethod
    def _reuse(cls, address: str | None, namespace: str, t0: float) -> RayRuntime:
        import ray

        context = ray.get_runtime_context()
        current = _gcs_address()
        if address not in (None, "auto", current):
            raise ValueError(f"address={address!r}: this process is already connected to Ray at {current!r}; "
                             "expected that address, 'auto' or None (call ray.shutdown() first to switch)")
        if context.namespace != namespace:
            logger.info("reusing the process's Ray (namespace %r, not %r)", context.namespace, namespace)
        return cls(namespace=context.namespace, address=current, temp_dir=None, owns_cluster=False,
                   connected=False, remove_temp_dir=False, start_s=time.perf_counter() - t0)

    def cluster_resources(self) -> dict[str, float]:
        """Total resources of the cluster's alive nodes."""
        import ray

        return {k: float(v) for k, v in ray.cluster_resources().items()}

    def shutdown(self) -> None:
        """Disconnect and stop what :meth:`start` started (nothing when Ray was reused). Idempotent."""
        if not self.connected:
            return
        import ray

        t0 = time.perf_counter()
        ray.shutdown()
        for pid in self._ray_processes:
            unreap(pid)
        self.connected = False
        self.shutdown_s = time.perf_counter() - t0
        if self._remove_temp_dir and self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> RayRuntime:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()


def _with_descendants(proc: psutil.Process) -> list[psutil.Process]:
    """``proc`` and its descendants now (Ray's agents are the raylet's children, and outlive it)."""
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _gcs_address() -> str:
    import ray

    return str(ray.get_runtime_context().gcs_address)


def _resource_options(resources: Mapping[str, float]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    custom = {}
    for name, amount in resources.items():
        if name == "CPU":
            options["num_cpus"] = amount
        elif name == "GPU":
            options["num_gpus"] = amount
        else:
            custom[name] = amount
    if custom:
        options["resources"] = custom
    return options


def spawn(
    cls: type,
    *args: Any,
    placement: ActorPlacement | PlacementGroup | None = None,
    bundle: int | None = None,
    name: str | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    resources: Mapping[str, float] | None = None,
    env_vars: Mapping[str, str] | None = None,
    max_concurrency: int | None = None,
    **kwargs: Any,
) -> ActorHandle[Any]:
    """Start ``cls(*args, **kwargs)`` as a Ray actor and return its handle.

    ``placement``: an :class:`ActorPlacement` from :class:`PlacedGroups` (its bundle and resources),
    or a placement group with ``bundle``. ``num_cpus``/``num_gpus``/``resources`` override the
    placement's; without either, Ray's defaults. ``env_vars`` are set in the actor's process (a new
    worker process is started for it). ``name`` registers it in the runtime's namespace.
    ``max_concurrency``: calls running at once (asyncio actors: ``None`` → Ray's 1000; others: 1).
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not inspect.isclass(cls) or isinstance(cls, ray.actor.ActorClass):
        raise TypeError(f"cls={cls!r}: expected a plain class (spawn applies ray.remote itself)")
    options: dict[str, Any] = {}
    group: PlacementGroup | None
    if isinstance(placement, ActorPlacement):
        if placement.placement_group is None:
            raise PlacementError(f"placement {placement.group!r}[{placement.bundle}] is only planned; "
                                 "expected one from PlacementPlan.create() (PlacedGroups.engine/trainer)")
        if bundle is not None and bundle != placement.bundle:
            raise ValueError(f"bundle={bundle} with a placement on bundle {placement.bundle}: expected one of them")
        options.update(_resource_options(placement.resources))
        group, bundle = placement.placement_group, placement.bundle
    else:
        group = placement
    if group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=-1 if bundle is None else bundle)
    elif bundle is not None:
        raise ValueError(f"bundle={bundle} without a placement group: expected placement=...")
    explicit = {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": dict(resources) if resources else None,
                "name": name, "max_concurrency": max_concurrency}
    options.update({k: v for k, v in explicit.items() if v is not None})
    if env_vars:
        options["runtime_env"] = {"env_vars": {str(k): str(v) for k, v in env_vars.items()}}
    return cast("ActorHandle[Any]", ray.remote(cls).options(**options).remote(*args, **kwargs))


class TrainGroupError(RuntimeError):
    """A rank of a :class:`TrainGroup` failed (setup or a call); the message names rank and method."""


class _RankWorker:
    """The actor of one data-parallel rank: joins the process group, then holds the plain object."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        # set before anything initialises a device: a colocated rank's visible device (a variable given
        # to this process alone, so Ray need not build a runtime environment per rank)
        os.environ.update(env or {})
        self.obj: Any = None
        self.rank = -1
        self.store: Any = None

    def rendezvous(self) -> dict[str, Any]:
        """This node's IP, the node id, and the accelerators this rank uses: the ids Ray gave it, else
        the visible devices set for it."""
        import ray

        from agentrl.runner.devices import VISIBLE_DEVICES_ENV

        context = ray.get_runtime_context()
        ids = context.get_accelerator_ids()
        assigned = {kind: [str(d) for d in ids.get(resource, [])] for kind, resource in (("gpu", "GPU"), ("npu", "NPU"))}
        visible = {kind: os.environ.get(var) for kind, var in VISIBLE_DEVICES_ENV.items()}
        return {"ip": ray.util.get_node_ip_address(), "node": str(context.get_node_id()),
                "assigned": assigned, "visible": visible}

    def host_store(self, world_size: int, timeout_s: float) -> int:
        """Rank 0: starts the group's TCP store on a port the OS picks as it binds, and returns the port.
        (A port found free and bound later can be taken in between by another process: EADDRINUSE.)"""
        from agentrl.train.distributed import host_tcp_store

        self.store = host_tcp_store(world_size, timeout_s)
        return int(self.store.port)

    def setup(self, rank: int, world_size: int, master: tuple[str, int], device: str,
              timeout_s: float) -> dict[str, Any]:
        from agentrl.train.device import distributed_backend, resolve_device
        from agentrl.train.distributed import init_process_group

        resolved = resolve_device(device)
        backend = distributed_backend(resolved)
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0",
                           "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1])})
        t0 = time.perf_counter()
        # every rank, rank 0 included, joins the store rank 0 hosts (host_store) as a client
        init_process_group(rank, world_size, master[1], resolved, timeout_s=timeout_s, hosted=True,
                           address=master[0])
        self.rank = rank
        return {"rank": rank, "backend": backend, "pid": os.getpid(), "init_s": time.perf_counter() - t0}

    def build(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.obj = cls(*args, **kwargs)

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = getattr(self.obj, method)(*args, **kwargs)
        return asyncio.run(result) if inspect.iscoroutine(result) else result

    def teardown(self) -> None:
        import torch.distributed as dist

        self.obj = None
        if dist.is_initialized():
            dist.destroy_process_group()


def _gather(refs: Sequence[Any], what: str, timeout_s: float | None, ranks: Sequence[int] | None = None) -> list[Any]:
    """Results of ``refs`` (one per rank of ``ranks``, default 0..n-1) in order; the first failure raises."""
    import ray

    labels = list(range(len(refs))) if ranks is None else list(ranks)
    index = {ref: rank for rank, ref in zip(labels, refs, strict=True)}
    results: dict[int, Any] = {}
    pending = list(refs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not done:
            missing = sorted(index[r] for r in pending)
            raise TrainGroupError(f"{what}: rank(s) {missing} did not finish within {timeout_s} s")
        for ref in done:
            try:
                results[index[ref]] = ray.get(ref)
            except Exception as err:
                cause = getattr(err, "cause", None) or err  # a RayTaskError carries the rank's exception
                raise TrainGroupError(f"{what} failed on rank {index[ref]}: {type(cause).__name__}: {cause}") from err
    return [results[r] for r in labels]


class TrainGroup:
    """``world_size`` train actors (one per data-parallel rank) joined by ``torch.distributed``.

    Build with :meth:`start`; :meth:`call` runs a method of the plain object on every rank with the
    same arguments and returns the results in rank order; :meth:`teardown` leaves the process group
    and kills the actors. ``ranks``: per rank, its backend, pid, node id and process-group init time;
    ``timings``: seconds :meth:`start` spent starting the actors, joining the group, building objects.
    """

    def __init__(self, actors: Sequence[ActorHandle[Any]], ranks: Sequence[Mapping[str, Any]],
                 timings: Mapping[str, float] | None = None) -> None:
        self.actors = list(actors)
        self.ranks = [dict(r) for r in ranks]
        self.timings = dict(timings or {})

    @property
    def world_size(self) -> int:
        return len(self.actors)

    @property
    def node_ids(self) -> list[str]:
        return [str(r["node_id"]) for r in self.ranks]

    def devices(self, accelerator: str) -> list[tuple[str, str | None]]:
        """Per rank, ``(node id, device)``: the ``accelerator`` id Ray gave the rank, else the one its
        visible-devices variable names (a colocated rank), else ``None`` (CPU)."""
        out: list[tuple[str, str | None]] = []
        for rank in self.ranks:
            assigned = list(rank.get("assigned", {}).get(accelerator, []))
            visible = rank.get("visible", {}).get(accelerator)
            device = assigned[0] if len(assigned) == 1 else (visible if visible and "," not in visible else None)
            out.append((str(rank["node_id"]), device))
        return out

    @classmethod
    def start(
        cls,
        plain_cls: type,
        *args: Any,
        world_size: int,
        placement: PlacedGroups | Sequence[ActorPlacement] | None = None,
        device: str = "cpu",
        num_cpus: float | None = None,
        env_vars: Mapping[str, str] | None = None,
        rank_env: Sequence[Mapping[str, str]] | None = None,
        timeout_s: float = 120.0,
        **kwargs: Any,
    ) -> TrainGroup:
        """Start the ranks, join them in a process group, then build ``plain_cls(*args, **kwargs)`` on each.

        ``placement``: the created plan (its trainer slots) or one placement per rank; ``None``: Ray
        schedules the actors (``num_cpus`` each). ``device``: ``cpu`` (gloo), ``cuda`` (NCCL), ``npu``
        (HCCL), resolved inside each actor. ``rank_env``: per rank, more environment variables (a
        colocated rank's visible device). Every setup call is issued before any is waited on (the
        rendezvous blocks until all ranks joined). On failure the started actors are killed.
        """
        import ray

        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r}: expected an integer >= 1")
        slots = placement.trainers() if isinstance(placement, PlacedGroups) else placement
        if slots is not None and len(slots) != world_size:
            raise ValueError(f"placement has {len(slots)} trainer slot(s) with world_size={world_size}: "
                             "expected one per rank")
        if rank_env is not None and len(rank_env) != world_size:
            raise ValueError(f"rank_env has {len(rank_env)} entries with world_size={world_size}: expected one per rank")
        actors = [spawn(_RankWorker, None if rank_env is None else dict(rank_env[r]),
                        placement=None if slots is None else slots[r], num_cpus=num_cpus, env_vars=env_vars)
                  for r in range(world_size)]
        try:
            t0 = time.perf_counter()
            where = _gather([a.rendezvous.remote() for a in actors], "rendezvous", timeout_s)
            t1 = time.perf_counter()
            port = _gather([actors[0].host_store.remote(world_size, timeout_s)], "rendezvous store", timeout_s)[0]
            # One host: loopback, which every rank can reach whatever the host's interfaces are.
            master = ("127.0.0.1" if len({w["ip"] for w in where}) == 1 else where[0]["ip"], port)
            setups = [a.setup.remote(r, world_size, master, device, timeout_s) for r, a in enumerate(actors)]
            ranks = _gather(setups, "torch.distributed setup", timeout_s + 30)
            t2 = time.perf_counter()
            for rank, found in zip(ranks, where, strict=True):
                rank.update(node_id=found["node"], assigned=found["assigned"], visible=found["visible"])
            _gather([a.build.remote(plain_cls, args, kwargs) for a in actors], f"{plain_cls.__name__}()", None)
            timings = {"actors_s": t1 - t0, "setup_s": t2 - t1, "build_s": time.perf_counter() - t2}
        except BaseException:
            for actor in actors:
                ray.kill(actor)
            raise
        return cls(actors, ranks, timings)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Issue ``method`` on every rank without waiting; returns the ObjectRefs in rank order."""
        if not self.actors:
            raise TrainGroupError(f"{method}: the group was torn down")
        return [a.call.remote(method, args, kwargs) for a in self.actors]

    def call(self, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> list[Any]:
        """Run ``method(*args, **kwargs)`` on every rank; the results in rank order."""
        return _gather(self.submit(method, *args, **kwargs), method, timeout_s)

    def call_rank(self, rank: int, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """Run ``method`` on one rank only (no collective in it!), e.g. an export on rank 0."""
        if not 0 <= rank < len(self.actors):
            raise IndexError(f"rank={rank}: expected 0 <= rank < {len(self.actors)} (world size)")
        (result,) = _gather([self.actors[rank].call.remote(method, args, kwargs)], method, timeout_s, [rank])
        return result

    def teardown(self, *, timeout_s: float = 30.0) -> None:
        """Leave the process group on every rank (waiting up to ``timeout_s``), then kill the actors.

        A rank that cannot leave (stuck in a collective, dead) is logged and killed all the same.
        """
        import ray

        actors, self.actors = self.actors, []
        try:
            if actors:
                _gather([a.teardown.remote() for a in actors], "teardown", timeout_s)
        except TrainGroupError as err:
            logger.warning("TrainGroup teardown: %s; killing the actors", err)
        finally:
            for actor in actors:
                ray.kill(actor)


def create_groups(groups: Sequence[BundleGroup], *, timeout_s: float) -> dict[str, PlacementGroup]:
    """Create ``groups`` as placement groups and wait until ready (see :meth:`PlacementPlan.create`)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    if not ray.is_initialized():
        raise PlacementError("placement: Ray is not initialised; expected RayRuntime.start() first")
    asked = [dict(b) for g in groups for b in g.bundles]
    _check_feasible(asked)
    created = {g.name: placement_group([dict(b) for b in g.bundles], strategy=g.strategy) for g in groups}
    ready, _ = ray.wait([pg.ready() for pg in created.values()], num_returns=len(created), timeout=timeout_s)
    if len(ready) < len(created):
        for pg in created.values():
            remove_placement_group(pg)
        raise PlacementError(
            f"placement: bundles {asked} were not ready within {timeout_s} s; the cluster has "
            f"{_describe(ray.cluster_resources())}, available now {_describe(ray.available_resources())}")
    return created


def _describe(resources: Mapping[str, float]) -> dict[str, float]:
    return {k: round(float(v), 4) for k, v in sorted(resources.items())
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")}


def _check_feasible(asked: list[dict[str, float]]) -> None:
    import ray

    total: dict[str, float] = {}
    for bundle in asked:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0.0) + amount
    have = _describe(ray.cluster_resources())
    short = {k: v for k, v in total.items() if have.get(k, 0.0) + 1e-9 < v}
    if short:
        raise PlacementError(
            f"placement: the bundles ask {_describe(total)} in all; the cluster has {have}; short of "
            + ", ".join(f"{k} (asked {round(v, 4)}, has {have.get(k, 0.0)})" for k, v in short.items()))
    nodes = [_describe(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    for bundle in asked:
        if not any(all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()) for node in nodes):
            raise PlacementError(f"placement: bundle {bundle} fits on no single node; the nodes have {nodes}")
