"""Where the engines and the trainer ranks go: a pure plan of Ray placement-group bundles.

:class:`PlacementPlan` turns a :class:`~agentrl.runner.ClusterSection` and the run's counts
(engines, accelerators per engine, trainer ranks) into bundles, without touching Ray; ``create()``
then reserves them as placement groups and waits until they are ready.

- **Accelerators** become Ray resources: ``gpu`` → ``GPU``, ``npu`` → a custom ``NPU`` resource
  (start Ray with ``resources={"NPU": n}``); on ``cpu`` the bundles hold CPUs only, small fractions
  by default (``cpus_per_engine``, ``cpus_per_rank``) so that a test fits a 2-core machine.
- **Colocated**: one group ``"colocated"`` with one bundle per accelerator; trainer rank ``r`` and
  the engine whose span starts at bundle ``r`` share it, each actor asking half the accelerator.
- **Disaggregated**: groups ``"engines"`` and ``"trainer"`` with their own bundles; each actor asks
  its whole accelerator. ``node_resource_engines`` / ``node_resource_trainer`` name a custom
  resource a node carries (e.g. ``host_a``) so each group lands on its own host.

An engine with ``k`` accelerators spans ``k`` consecutive bundles (``engine_bundles(e)``); its actor
sits on the first one (the engine process it launches uses the others).

Example::

    plan = PlacementPlan.build(config.cluster, engines=2, trainer_ranks=2)
    with plan.create(timeout_s=60) as placed:
        actor = spawn(Trainer, placement=placed.trainer(0))
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from agentrl.runner._sections import ClusterSection

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

__all__ = ["ActorPlacement", "BundleGroup", "PlacedGroups", "PlacementError", "PlacementPlan"]

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
ACCELERATOR_RESOURCES: dict[str, str | None] = {"cpu": None, "gpu": "GPU", "npu": "NPU"}
# Each bundle asks this much of a node-pinning resource: a node with ``{name: 1}`` takes 1000 bundles.
NODE_RESOURCE_SHARE = 0.001
_COLOCATED_SHARE = 0.5


class PlacementError(RuntimeError):
    """The cluster cannot hold the bundles asked for (or they were not ready before the deadline)."""


@dataclass(frozen=True)
class BundleGroup:
    """One placement group to create: ``name``, its bundles and the Ray packing strategy."""

    name: str
    bundles: tuple[Mapping[str, float], ...]
    strategy: Strategy = "PACK"


@dataclass(frozen=True)
class ActorPlacement:
    """Where one actor goes: bundle ``bundle`` of group ``group``, asking ``resources`` of it.

    ``placement_group`` is set once the plan was created (see :meth:`PlacedGroups.engine`).
    """

    group: str
    bundle: int
    resources: Mapping[str, float]
    placement_group: PlacementGroup | None = field(default=None, compare=False)


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}")


def _check_cpus(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r}: expected a finite number of CPUs > 0 (fractions allowed)")


def _bundle(cpus: float, accelerator: str | None, amount: float, node_resource: str | None) -> dict[str, float]:
    out = {"CPU": round(cpus, 4)} if cpus > 0 else {}
    if accelerator is not None and amount > 0:
        out[accelerator] = amount
    if node_resource is not None:
        out[node_resource] = NODE_RESOURCE_SHARE
    return out


@dataclass(frozen=True)
class PlacementPlan:
    """Bundles for ``engines`` engines and ``trainer_ranks`` trainer ranks; build with :meth:`build`."""

    placement: Literal["colocated", "disaggregated"]
    accelerator: Literal["cpu", "gpu", "npu"]
    engines: int
    accelerators_per_engine: int
    trainer_ranks: int
    groups: tuple[BundleGroup, ...]
    engine_slots: tuple[ActorPlacement, ...]
    trainer_slots: tuple[ActorPlacement, ...]

    @classmethod
    def build(
        cls,
        cluster: ClusterSection,
        *,
        engines: int,
        trainer_ranks: int,
        accelerators_per_engine: int | None = None,
        cpus_per_engine: float = 0.25,
        cpus_per_rank: float = 0.25,
        node_resource_engines: str | None = None,
        node_resource_trainer: str | None = None,
        strategy: Strategy = "PACK",
    ) -> PlacementPlan:
        """Plan the bundles; ``accelerators_per_engine`` ``None``: the section's value, else 1.

        Raises ``ValueError`` naming the field when a count is invalid, the trainer does not have one
        accelerator per rank, or the section's ``num_accelerators`` cannot hold the plan.
        """
        _check_count("engines", engines, 0)
        _check_count("trainer_ranks", trainer_ranks, 1)
        _check_cpus("cpus_per_engine", cpus_per_engine)
        _check_cpus("cpus_per_rank", cpus_per_rank)
        resource = ACCELERATOR_RESOURCES[cluster.accelerator]
        per_engine = 0 if resource is None else (accelerators_per_engine or cluster.accelerators_per_engine or 1)
        if resource is not None:
            _check_count("accelerators_per_engine", per_engine, 1)
        elif accelerators_per_engine:
            raise ValueError(f"accelerators_per_engine={accelerators_per_engine} with accelerator='cpu': "
                             "expected None (CPU engines hold no accelerator)")
        if resource is not None and cluster.trainer_accelerators not in (None, trainer_ranks):
            raise ValueError(f"cluster.trainer_accelerators={cluster.trainer_accelerators} with "
                             f"trainer_ranks={trainer_ranks}: expected one accelerator per trainer rank")
        if cluster.placement == "colocated":
            if node_resource_engines != node_resource_trainer:
                raise ValueError(f"node_resource_engines={node_resource_engines!r}, node_resource_trainer="
                                 f"{node_resource_trainer!r} with placement='colocated': engines and trainer "
                                 "share bundles, so expected the same node resource (or none)")
            groups, engine_slots, trainer_slots = _colocated(
                engines, per_engine, trainer_ranks, resource, cpus_per_engine, cpus_per_rank,
                node_resource_engines, strategy)
        else:
            groups, engine_slots, trainer_slots = _disaggregated(
                engines, per_engine, trainer_ranks, resource, cpus_per_engine, cpus_per_rank,
                node_resource_engines, node_resource_trainer, strategy)
        plan = cls(placement=cluster.placement, accelerator=cluster.accelerator, engines=engines,
                   accelerators_per_engine=per_engine, trainer_ranks=trainer_ranks, groups=groups,
                   engine_slots=engine_slots, trainer_slots=trainer_slots)
        needed = plan.accelerators_needed
        if cluster.num_accelerators is not None and needed > cluster.num_accelerators:
            raise ValueError(
                f"cluster.num_accelerators={cluster.num_accelerators}: the {cluster.placement} plan needs "
                f"{needed} ({engines} engine(s) x {per_engine} + {trainer_ranks} trainer rank(s)"
                f"{', shared' if cluster.placement == 'colocated' else ''}); expected at least {needed}")
        return plan

    @property
    def accelerators_needed(self) -> int:
        """Accelerators the plan reserves (0 on CPU)."""
        resource = ACCELERATOR_RESOURCES[self.accelerator]
        return 0 if resource is None else int(self.totals().get(resource, 0))

    def totals(self) -> dict[str, float]:
        """The sum of every resource over all bundles of all groups."""
        out: dict[str, float] = {}
        for group in self.groups:
            for bundle in group.bundles:
                for name, amount in bundle.items():
                    out[name] = round(out.get(name, 0.0) + amount, 4)
        return out

    def engine_bundles(self, engine: int) -> tuple[int, ...]:
        """The bundle indices engine ``engine`` spans in its group (one per accelerator; one on CPU)."""
        _check_index("engine", engine, self.engines)
        first = self.engine_slots[engine].bundle
        return tuple(range(first, first + max(1, self.accelerators_per_engine)))

    def create(self, *, timeout_s: float = 60.0) -> PlacedGroups:
        """Reserve the bundles as Ray placement groups and wait (up to ``timeout_s``) until ready.

        Ray must be initialised (:class:`~agentrl.runner.RayRuntime`). Raises :class:`PlacementError`
        naming what was asked and what the cluster has, before creating anything when the cluster's
        totals or nodes cannot hold it, or after ``timeout_s`` (the groups are then removed).
        """
        from agentrl.runner.cluster import create_groups

        return PlacedGroups(self, create_groups(self.groups, timeout_s=timeout_s))


def _check_index(name: str, index: int, count: int) -> None:
    if not 0 <= index < count:
        raise IndexError(f"{name}={index}: expected 0 <= {name} < {count}")


Planned = tuple[tuple[BundleGroup, ...], tuple[ActorPlacement, ...], tuple[ActorPlacement, ...]]


def _colocated(engines: int, per_engine: int, ranks: int, resource: str | None, cpus_engine: float,
               cpus_rank: float, node_resource: str | None, strategy: Strategy) -> Planned:
    span = max(1, per_engine)
    size = max(engines * span, ranks)
    bundles = []
    for i in range(size):
        # Bundle i holds the CPUs of the engine actor starting there and of trainer rank i; a bundle an
        # engine only spans (GPU/NPU) holds just its accelerator.
        cpus = (cpus_engine if i < engines * span and i % span == 0 else 0.0) + (cpus_rank if i < ranks else 0.0)
        bundles.append(_bundle(cpus, resource, 1.0, node_resource))
    share = _COLOCATED_SHARE if resource is not None else 0.0
    engine_slots = tuple(ActorPlacement("colocated", e * span, _bundle(cpus_engine, resource, share, None))
                         for e in range(engines))
    trainer_slots = tuple(ActorPlacement("colocated", r, _bundle(cpus_rank, resource, share, None))
                          for r in range(ranks))
    return (BundleGroup("colocated", tuple(bundles), strategy),), engine_slots, trainer_slots


def _disaggregated(engines: int, per_engine: int, ranks: int, resource: str | None, cpus_engine: float,
                   cpus_rank: float, node_engines: str | None, node_trainer: str | None,
                   strategy: Strategy) -> Planned:
    span = max(1, per_engine)
    groups = []
    if engines:
        groups.append(BundleGroup("engines", tuple(
            _bundle(cpus_engine if i % span == 0 else 0.0, resource, 1.0, node_engines)
            for i in range(engines * span)), strategy))
    groups.append(BundleGroup("trainer", tuple(_bundle(cpus_rank, resource, 1.0, node_trainer)
                                              for _ in range(ranks)), strategy))
    engine_slots = tuple(ActorPlacement("engines", e * span, _bundle(cpus_engine, resource, 1.0, None))
                         for e in range(engines))
    trainer_slots = tuple(ActorPlacement("trainer", r, _bundle(cpus_rank, resource, 1.0, None))
                          for r in range(ranks))
    return tuple(groups), engine_slots, trainer_slots


class PlacedGroups:
    """The placement groups of a created :class:`PlacementPlan`; ``remove()`` (or ``with``) frees them."""

    def __init__(self, plan: PlacementPlan, groups: Mapping[str, PlacementGroup]) -> None:
        self.plan = plan
        self.groups = dict(groups)

    def engine(self, engine: int) -> ActorPlacement:
        """The placement of engine ``engine``'s actor, bound to its placement group."""
        _check_index("engine", engine, self.plan.engines)
        return self._bind(self.plan.engine_slots[engine])

    def trainer(self, rank: int) -> ActorPlacement:
        """The placement of trainer rank ``rank``'s actor, bound to its placement group."""
        _check_index("rank", rank, self.plan.trainer_ranks)
        return self._bind(self.plan.trainer_slots[rank])

    def trainers(self) -> list[ActorPlacement]:
        return [self.trainer(r) for r in range(self.plan.trainer_ranks)]

    def _bind(self, slot: ActorPlacement) -> ActorPlacement:
        if slot.group not in self.groups:
            raise PlacementError(f"placement group {slot.group!r} was removed; create the plan again")
        return ActorPlacement(slot.group, slot.bundle, slot.resources, self.groups[slot.group])

    def remove(self) -> None:
        """Free every group (actors still placed in them are killed by Ray). Idempotent."""
        from ray.util import remove_placement_group

        for name in list(self.groups):
            remove_placement_group(self.groups.pop(name))

    def __enter__(self) -> PlacedGroups:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()
