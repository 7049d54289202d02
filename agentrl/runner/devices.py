"""The device map of a run: which accelerator of which node each engine and trainer rank uses.

A :class:`DeviceMap` is a plain value. It is computed from a
:class:`~agentrl.runner.placement.PlacementPlan` and either the devices Ray assigned to the run's
actors (:meth:`DeviceMap.from_assignments`, at launch) or a model of the cluster's nodes
(:meth:`DeviceMap.planned`, for ``agentrl train --dry-run``). The launcher reads it, the dry run
prints it (:meth:`DeviceMap.format`), the tests assert on it; Ray actors only carry it out.

- Nodes are Ray node ids, never IP addresses (the nodes of a test cluster share one IP).
- Devices are the ids Ray hands out (``ray.get_gpu_ids()``; for NPUs the ``NPU`` accelerator ids):
  what ``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES`` name on that node.
- An engine with tensor parallelism ``k`` holds ``k`` devices of one node. It is started with exactly
  those devices visible and ``--base-gpu-id 0 --gpu-id-step 1 --tp-size k``, so SGLang's rank *r*
  runs on the *r*-th of them (SGLang: ``gpu = base_gpu_id + tp_rank * gpu_id_step``, an index into
  the visible devices).
- Colocated: engine *e*'s TP rank *j* shares its device with trainer rank ``e·k + j``; both fit
  because the engine's ``--mem-fraction-static`` leaves room for what the trainer keeps resident
  while the engine generates (its weights; gradients and optimizer state are offloaded), and the
  engine releases its memory while the trainer trains (:func:`colocated_shares`).

Example::

    device_map = DeviceMap.planned(plan, [NodeDevices("node-0", tuple(map(str, range(8))))])
    print("\\n".join(device_map.format()))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.runner.placement import PlacementPlan

__all__ = [
    "DeviceMap", "EnginePlace", "MemoryShares", "NodeDevices", "PlacementMapError", "RankPlace", "colocated_shares",
    "nodes_from_resources", "noset_env", "visible_devices_env",
]

GIB = 1 << 30
VISIBLE_DEVICES_ENV: dict[str, str] = {"gpu": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}
_RAY_NOSET_ENV: dict[str, str] = {"gpu": "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
                                  "npu": "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"}
# What a colocated device keeps free beyond the engine's static pool and the trainer's resident
# weights: the engine's activations and CUDA graphs, both processes' contexts and allocator slack.
RESERVE_FRACTION = 0.08
RESERVE_MIN_BYTES = 4 * GIB


def visible_devices_env(accelerator: str, devices: Sequence[str]) -> dict[str, str]:
    """The environment that makes exactly ``devices`` visible to a process (``{}`` on CPU)."""
    name = VISIBLE_DEVICES_ENV.get(accelerator)
    return {} if name is None else {name: ",".join(devices)}


def noset_env(accelerator: str) -> dict[str, str]:
    """Ray's opt-out from setting the visible-devices variable of an actor (``{}`` on CPU): an actor
    that shares a device it did not reserve itself sets the variable from the device map instead."""
    name = _RAY_NOSET_ENV.get(accelerator)
    return {} if name is None else {name: "1"}


@dataclass(frozen=True)
class NodeDevices:
    """One node as the map sees it: its id, its accelerator ids, and their memory (``None``: unknown)."""

    node: str
    devices: tuple[str, ...]
    memory_bytes: int | None = None


@dataclass(frozen=True)
class MemoryShares:
    """How one colocated device is shared (see :func:`colocated_shares`)."""

    capacity_bytes: int
    engine_fraction: float
    trainer_resident_bytes: int
    reserve_bytes: int

    @property
    def engine_bytes(self) -> int:
        return int(self.capacity_bytes * self.engine_fraction)


def colocated_shares(capacity_bytes: int, trainer_resident_bytes: int, *,
                     engine_fraction: float | None = None) -> MemoryShares:
    """The engine's ``--mem-fraction-static`` on a device it shares with a trainer rank.

    While the engine generates, the trainer keeps ``trainer_resident_bytes`` on the device (its
    weights; gradients and optimizer state are offloaded). The engine's static pool (weights and KV
    cache) gets what is left after that and a reserve (``max(8%, 4 GiB)``: the engine's activations
    and graphs, the contexts, allocator slack). SGLang measures the fraction against the memory free
    when it starts, so the engines start before the trainer builds its model. ``engine_fraction``:
    a fraction asked for in the config, checked instead of computed. Raises ``ValueError`` naming the
    figures when the two do not fit.
    """
    reserve = max(int(capacity_bytes * RESERVE_FRACTION), RESERVE_MIN_BYTES)
    room = capacity_bytes - trainer_resident_bytes - reserve
    largest = room / capacity_bytes if capacity_bytes > 0 else 0.0
    if largest < 0.05:
        raise ValueError(
            f"colocated: a device of {capacity_bytes / GIB:.1f} GiB cannot hold the trainer's resident "
            f"{trainer_resident_bytes / GIB:.1f} GiB, a reserve of {reserve / GIB:.1f} GiB and an engine; expected "
            "larger accelerators (cluster.accelerator_memory_gib), a smaller model, or placement='disaggregated'")
    if engine_fraction is None:
        engine_fraction = round(min(largest, 0.9), 3)
    elif engine_fraction > largest + 1e-9:
        raise ValueError(
            f"rollout.engines.mem_fraction_static={engine_fraction}: colocated with a trainer that keeps "
            f"{trainer_resident_bytes / GIB:.1f} GiB resident on a {capacity_bytes / GIB:.1f} GiB device (reserve "
            f"{reserve / GIB:.1f} GiB), the engine can have at most {largest:.3f}; expected <= {largest:.3f} or "
            "None (computed)")
    return MemoryShares(capacity_bytes, engine_fraction, trainer_resident_bytes, reserve)


@dataclass(frozen=True)
class EnginePlace:
    """Engine ``engine`` on ``node``: its devices in TP-rank order."""

    engine: int
    node: str
    devices: tuple[str, ...]

    def launch_env(self, accelerator: str) -> dict[str, str]:
        """The engine process's visible devices: exactly its own."""
        return visible_devices_env(accelerator, self.devices)


@dataclass(frozen=True)
class RankPlace:
    """Trainer rank ``rank`` on ``node`` and ``device`` (``None`` on CPU); ``engine``/``engine_rank``:
    the engine (and its TP rank) it shares the device with when colocated."""

    rank: int
    node: str
    device: str | None
    engine: int | None = None
    engine_rank: int | None = None


class PlacementMapError(ValueError):
    """A device map that breaks a placement rule (a device shared outside colocation, an engine
    spread over nodes, a plan the nodes cannot hold); the message names what was asked and what is there."""


@dataclass(frozen=True)
class DeviceMap:
    """Engines and trainer ranks on devices; ``memory``: the colocated shares (``None``: not colocated
    on an accelerator, or the device memory is unknown). ``planned``: computed for a dry run, not read
    from the devices Ray assigned."""

    accelerator: str
    placement: str
    engines: tuple[EnginePlace, ...]
    ranks: tuple[RankPlace, ...]
    memory: MemoryShares | None = None
    planned: bool = False
    engine_fraction: float | None = None
    nodes: tuple[str, ...] = field(default=())
    teachers: tuple[EnginePlace, ...] = ()  # a distillation teacher's own engines (never shared)

    # -- building ------------------------------------------------------------------------------------
    @classmethod
    def from_assignments(cls, plan: PlacementPlan, engines: Sequence[tuple[str, Sequence[str]]],
                         ranks: Sequence[tuple[str, str | None]], *, memory: MemoryShares | None = None,
                         engine_fraction: float | None = None,
                         teachers: Sequence[tuple[str, Sequence[str]]] = ()) -> DeviceMap:
        """The map of a launched run: per engine (and teacher engine) its host's ``(node, devices)``, per
        trainer rank its ``(node, device)`` as Ray assigned them. Raises :class:`PlacementMapError` when
        they break a rule."""
        if len(engines) != plan.engines or len(ranks) != plan.trainer_ranks or len(teachers) != plan.teacher_engines:
            raise PlacementMapError(f"device map: {len(engines)} engine(s), {len(ranks)} rank(s) and {len(teachers)} "
                                    f"teacher engine(s) reported for a plan of {plan.engines}, {plan.trainer_ranks} "
                                    f"and {plan.teacher_engines}")
        places = tuple(EnginePlace(e, node, tuple(devices)) for e, (node, devices) in enumerate(engines))
        teacher_places = tuple(EnginePlace(t, node, tuple(devices)) for t, (node, devices) in enumerate(teachers))
        rank_places = []
        for r, (node, device) in enumerate(ranks):
            shared = plan.trainer_slots[r].colocated_with
            rank_places.append(RankPlace(r, node, device, *(shared or (None, None))))
        out = cls(plan.accelerator, plan.placement, places, tuple(rank_places), memory=memory,
                  engine_fraction=engine_fraction if memory is None else memory.engine_fraction,
                  nodes=_node_order(places, rank_places, teacher_places), teachers=teacher_places)
        out.check(plan.accelerators_per_engine, plan.accelerators_per_teacher)
        return out

    @classmethod
    def planned_for(cls, plan: PlacementPlan, nodes: Sequence[NodeDevices], *,
                    trainer_resident_bytes: int | None = None, engine_fraction: float | None = None) -> DeviceMap:
        """The map a dry run expects: the plan's bundles placed on ``nodes`` in order, first fit (what
        Ray's ``PACK`` strategy does when the cluster is empty; the run records the real map).

        Raises :class:`PlacementMapError` when a bundle fits no node (e.g. a TP engine larger than
        every node) or the nodes hold too few devices."""
        if plan.accelerator == "cpu":
            where = nodes[0].node if nodes else "local"
            return cls(plan.accelerator, plan.placement, tuple(EnginePlace(e, where, ()) for e in range(plan.engines)),
                       tuple(RankPlace(r, where, None) for r in range(plan.trainer_ranks)), planned=True,
                       nodes=tuple(n.node for n in nodes[:1]),
                       teachers=tuple(EnginePlace(t, where, ()) for t in range(plan.teacher_engines)))
        free = {n.node: list(n.devices) for n in nodes}
        largest = max((len(n.devices) for n in nodes), default=0)
        have = sum(len(n.devices) for n in nodes)
        if plan.accelerators_needed > have:
            raise PlacementMapError(
                f"placement: the {plan.placement} plan needs {plan.accelerators_needed} {plan.resource} "
                f"({plan.engines} engine(s) x {plan.accelerators_per_engine} and {plan.trainer_ranks} trainer "
                f"rank(s){', shared' if plan.placement == 'colocated' else ''}); the nodes have {have} "
                f"({', '.join(f'{n.node}: {len(n.devices)}' for n in nodes)})")
        taken: dict[tuple[str, int], tuple[str, list[str]]] = {}
        for group in plan.groups:
            for index, bundle in enumerate(group.bundles):
                need = int(bundle.get(plan.resource or "", 0))
                if need == 0:
                    continue
                node = next((n.node for n in nodes if len(free[n.node]) >= need), None)
                if node is None:
                    what = (f"an engine with {need} accelerators (tensor parallel across one node)" if need > 1
                            else "one accelerator")
                    raise PlacementMapError(
                        f"placement: {what} fits on no node; the nodes have "
                        f"{', '.join(f'{n.node}: {len(n.devices)}' for n in nodes)} {plan.resource} in all "
                        f"(largest {largest}), and the plan needs {plan.accelerators_needed}"
                        + ("; expected rollout.engines.tp_size x dp_size <= the accelerators of one node"
                           if need > largest else ""))
                taken[(group.name, index)] = (node, free[node][:need])
                del free[node][:need]
        engines: list[EnginePlace] = []
        for e, slot in enumerate(plan.engine_slots):
            node, devices = taken[(slot.group, slot.bundle)]
            engines.append(EnginePlace(e, node, tuple(devices)))
        ranks: list[RankPlace] = []
        for r, slot in enumerate(plan.trainer_slots):
            node, devices = taken[(slot.group, slot.bundle)]
            if slot.colocated_with is not None:
                e, j = slot.colocated_with
                ranks.append(RankPlace(r, node, devices[j], e, j))
            else:
                ranks.append(RankPlace(r, node, devices[0]))
        teachers = tuple(EnginePlace(t, *_node_devices(taken[(slot.group, slot.bundle)]))
                         for t, slot in enumerate(plan.teacher_slots))
        memory = None
        capacity = min((n.memory_bytes for n in nodes if n.memory_bytes), default=None)
        shared = plan.placement == "colocated" and any(r.engine is not None for r in ranks)
        if shared and capacity and trainer_resident_bytes is not None:
            memory = colocated_shares(capacity, trainer_resident_bytes, engine_fraction=engine_fraction)
        out = cls(plan.accelerator, plan.placement, tuple(engines), tuple(ranks), memory=memory, planned=True,
                  engine_fraction=engine_fraction if memory is None else memory.engine_fraction,
                  nodes=_node_order(engines, ranks, teachers), teachers=teachers)
        out.check(plan.accelerators_per_engine, plan.accelerators_per_teacher)
        return out

    # -- rules ---------------------------------------------------------------------------------------
    def check(self, per_engine: int, per_teacher: int = 0) -> None:
        """Raises :class:`PlacementMapError` unless: each engine holds ``per_engine`` distinct devices of
        one node (each teacher engine ``per_teacher``); no device is held by two engines; trainer ranks
        hold distinct devices; a device is shared by an engine and a rank only when colocated, and then
        as the plan says; a teacher engine shares its devices with nothing."""
        if self.accelerator == "cpu":
            return
        owners: dict[tuple[str, str], str] = {}
        places = [(f"engine {p.engine}", p, per_engine) for p in self.engines]
        places += [(f"teacher engine {p.engine}", p, per_teacher) for p in self.teachers]
        for name, place, count in places:
            if len(place.devices) != count or len(set(place.devices)) != count:
                raise PlacementMapError(f"{name} holds devices {list(place.devices)} on node "
                                        f"{place.node}; expected {count} distinct devices of one node")
            for device in place.devices:
                key = (place.node, device)
                if key in owners:
                    raise PlacementMapError(f"device {device} of node {place.node} is held by {owners[key]} and "
                                            f"{name}; expected one engine per device")
                owners[key] = name
        seen: dict[tuple[str, str], int] = {}
        for rank in self.ranks:
            if rank.device is None:
                raise PlacementMapError(f"trainer rank {rank.rank} on node {rank.node} holds no {self.accelerator}")
            key = (rank.node, rank.device)
            if key in seen:
                raise PlacementMapError(f"device {rank.device} of node {rank.node} is held by trainer ranks "
                                        f"{seen[key]} and {rank.rank}; expected one device per rank")
            seen[key] = rank.rank
            holder = owners.get(key)
            if holder is not None and (rank.engine is None or holder.startswith("teacher")):
                raise PlacementMapError(f"device {rank.device} of node {rank.node} is held by {holder} and trainer "
                                        f"rank {rank.rank} with placement={self.placement!r}; expected a device "
                                        "shared only when colocated")
            if rank.engine is not None:
                engine = self.engines[rank.engine]
                assert rank.engine_rank is not None
                if engine.node != rank.node or engine.devices[rank.engine_rank] != rank.device:
                    raise PlacementMapError(
                        f"trainer rank {rank.rank} is on device {rank.device} of node {rank.node}; colocated, "
                        f"expected engine {rank.engine}'s TP rank {rank.engine_rank} device "
                        f"{engine.devices[rank.engine_rank]} of node {engine.node}")

    # -- reading -------------------------------------------------------------------------------------
    def holders(self) -> dict[str, dict[str, list[str]]]:
        """Per node, per device: who holds it (``engine 0 (tp 1)``, ``trainer rank 3``)."""
        out: dict[str, dict[str, list[str]]] = {}
        for prefix, places in (("engine", self.engines), ("teacher engine", self.teachers)):
            for place in places:
                for j, device in enumerate(place.devices):
                    tp = f" (tp {j})" if len(place.devices) > 1 else ""
                    out.setdefault(place.node, {}).setdefault(device, []).append(f"{prefix} {place.engine}{tp}")
        for rank in self.ranks:
            if rank.device is not None:
                out.setdefault(rank.node, {}).setdefault(rank.device, []).append(f"trainer rank {rank.rank}")
        return out

    def format(self) -> list[str]:
        """The map as lines: one per device, grouped by node, with the memory shares."""
        if self.accelerator == "cpu":
            teachers = f", {len(self.teachers)} teacher engine(s)" if self.teachers else ""
            return [f"cpu: {len(self.engines)} engine(s){teachers} and {len(self.ranks)} trainer rank(s) on the CPU "
                    "cores"]
        kind = {"gpu": "GPU", "npu": "NPU"}.get(self.accelerator, self.accelerator)
        label = {node: f"node {i}" + ("" if self.planned else f" ({node[:12]})")
                 for i, node in enumerate(self.nodes)}
        lines = []
        holders = self.holders()
        for node in self.nodes:
            for device in sorted(holders.get(node, {}), key=_device_key):
                lines.append(f"{label[node]} {kind} {device}: {', '.join(holders[node][device])}")
        if self.memory is not None:
            m = self.memory
            lines.append(f"memory per shared {kind}: {m.capacity_bytes / GIB:.1f} GiB = engine static pool "
                         f"{m.engine_fraction:.3f} ({m.engine_bytes / GIB:.1f} GiB, --mem-fraction-static) + trainer "
                         f"resident {m.trainer_resident_bytes / GIB:.1f} GiB + reserve {m.reserve_bytes / GIB:.1f} "
                         "GiB; the engine releases its memory while the trainer trains")
        elif self.engine_fraction is not None:
            lines.append(f"engine --mem-fraction-static {self.engine_fraction}")
        elif self.placement == "colocated" and any(r.engine is not None for r in self.ranks):
            lines.append(f"memory per shared {kind}: unknown here (set cluster.accelerator_memory_gib to see the "
                         "engine's and the trainer's shares)")
        return lines

    def to_dict(self) -> dict[str, object]:
        return {
            "accelerator": self.accelerator, "placement": self.placement, "planned": self.planned,
            "engines": [{"engine": p.engine, "node": p.node, "devices": list(p.devices)} for p in self.engines],
            "ranks": [{"rank": r.rank, "node": r.node, "device": r.device, "engine": r.engine,
                       "engine_rank": r.engine_rank} for r in self.ranks],
            "engine_fraction": self.engine_fraction,
            "teachers": [{"engine": p.engine, "node": p.node, "devices": list(p.devices)} for p in self.teachers],
            "memory": None if self.memory is None else {
                "capacity_bytes": self.memory.capacity_bytes, "engine_fraction": self.memory.engine_fraction,
                "trainer_resident_bytes": self.memory.trainer_resident_bytes,
                "reserve_bytes": self.memory.reserve_bytes},
        }


def _device_key(device: str) -> tuple[int, str]:
    return (int(device), device) if device.isdigit() else (1 << 30, device)


def _node_order(engines: Sequence[EnginePlace], ranks: Sequence[RankPlace],
                teachers: Sequence[EnginePlace] = ()) -> tuple[str, ...]:
    order: dict[str, None] = {}
    for node in (*(p.node for p in engines), *(r.node for r in ranks), *(p.node for p in teachers)):
        order.setdefault(node, None)
    return tuple(order)


def _node_devices(taken: tuple[str, list[str]]) -> tuple[str, tuple[str, ...]]:
    node, devices = taken
    return node, tuple(devices)


def nodes_from_resources(per_node: Mapping[str, Mapping[str, float]], resource: str | None,
                         memory_bytes: int | None = None) -> list[NodeDevices]:
    """Nodes as :meth:`DeviceMap.planned_for` reads them, from Ray's per-node resource totals
    (``{node_id: {"GPU": 8.0, ...}}``): devices numbered from 0 on each node."""
    out = []
    for node, resources in per_node.items():
        count = int(resources.get(resource, 0)) if resource else 0
        out.append(NodeDevices(node, tuple(str(i) for i in range(count)), memory_bytes))
    return out
