"""Where the engines and the trainer ranks go: a pure plan of Ray placement-group bundles.

:class:`PlacementPlan` turns a :class:`~agentrl.runner.ClusterSection` and the run's counts
(engines, accelerators per engine, trainer ranks) into bundles, without touching Ray; ``create()``
then reserves them as placement groups and waits until they are ready. Which device each actor
then holds is the run's :class:`~agentrl.runner.devices.DeviceMap`.

- **Accelerators** become Ray resources: ``gpu`` → ``GPU``, ``npu`` → a custom ``NPU`` resource
  (start Ray with ``resources={"NPU": n}``); on ``cpu`` the bundles hold CPUs only, small fractions
  by default (``cpus_per_engine``, ``cpus_per_rank``) so that a test fits a 2-core machine.
- **An engine is one bundle** holding its ``k = tp × dp`` accelerators, so Ray puts them on one
  node (a bundle never spans nodes; a plan whose engines are larger than every node is refused).
  The engine's host actor asks all ``k`` of them; Ray then names them to it, and the engine process
  is started with exactly those visible.
- **Colocated**: one group ``"colocated"``; engine ``e``'s bundle also holds trainer ranks
  ``e·k … e·k+k-1``, each on one of the engine's devices (its slot's ``colocated_with``); ranks
  beyond the engines' devices get a bundle of one accelerator each.
- **Disaggregated**: groups ``"engines"`` and ``"trainer"``; a trainer bundle holds one
  accelerator. ``node_resource_engines`` / ``node_resource_trainer`` name a custom resource a node
  carries (e.g. ``host_a``) so each group lands on its own host.
- **The rollout actor** (scheduler and router, CPUs only) gets a group ``"rollout"`` of its own,
  on the engines' node resource.
- **A distillation teacher's engines** (``teacher.kind = "engines"``) get a group ``"teacher"`` of
  their own, one bundle of ``tp × dp`` accelerators each, on the engines' node resource, in either
  placement: they score while the trainer trains, so they never share its devices.

Example::

    plan = PlacementPlan.for_run(config)
    with plan.create(timeout_s=60) as placed:
        actor = spawn(Trainer, placement=placed.trainer(0))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from agentrl.runner._sections import ClusterSection

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from agentrl.runner.config import RunConfig

__all__ = ["ActorPlacement", "BundleGroup", "PlacedGroups", "PlacementError", "PlacementPlan"]

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
ACCELERATOR_RESOURCES: dict[str, str | None] = {"cpu": None, "gpu": "GPU", "npu": "NPU"}
# Each bundle asks this much of a node-pinning resource: a node with ``{name: 1}`` takes 1000 bundles.
NODE_RESOURCE_SHARE = 0.001
CPUS_PER_ROLLOUT = 0.25
CPUS_PER_ACCELERATOR_ACTOR = 0.02


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

    ``colocated_with``: for a trainer rank sharing an engine's device, ``(engine, tp rank)``: the
    rank asks no accelerator of its own (the engine's host holds them all) and uses that device.
    ``placement_group`` is set once the plan was created (see :meth:`PlacedGroups.engine`).
    """

    group: str
    bundle: int
    resources: Mapping[str, float]
    placement_group: PlacementGroup | None = field(default=None, compare=False)
    colocated_with: tuple[int, int] | None = None


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
    """Bundles for ``engines`` engines and ``trainer_ranks`` trainer ranks; build with :meth:`build`
    (or :meth:`for_run` from a run config)."""

    placement: Literal["colocated", "disaggregated"]
    accelerator: Literal["cpu", "gpu", "npu"]
    engines: int
    accelerators_per_engine: int
    trainer_ranks: int
    groups: tuple[BundleGroup, ...]
    engine_slots: tuple[ActorPlacement, ...]
    trainer_slots: tuple[ActorPlacement, ...]
    rollout_slot: ActorPlacement = ActorPlacement("rollout", 0, {"CPU": CPUS_PER_ROLLOUT})
    teacher_slots: tuple[ActorPlacement, ...] = ()
    accelerators_per_teacher: int = 0

    @classmethod
    def for_run(cls, config: RunConfig, *, node_resource_engines: str | None = None,
                node_resource_trainer: str | None = None) -> PlacementPlan:
        """The plan of a run: ``rollout.engines.count`` engines of ``tp × dp`` accelerators each (none
        when the run attaches to ``rollout.engines.urls``: those engines run elsewhere) and one
        trainer rank per ``train.world_size``."""
        engines, on_cpu = config.rollout.engines, config.cluster.accelerator == "cpu"
        # on an accelerator an actor's CPUs are bookkeeping (its engine or rank is bound by its devices)
        cpus = 0.25 if on_cpu else CPUS_PER_ACCELERATOR_ACTOR
        teacher = config.teacher.engines if config.teacher is not None and config.teacher.kind == "engines" else None
        return cls.build(config.cluster, engines=0 if engines.urls else engines.count,
                         trainer_ranks=config.train.world_size,
                         accelerators_per_engine=None if on_cpu else engines.accelerators_per_engine,
                         cpus_per_engine=cpus, cpus_per_rank=cpus, cpus_rollout=0.25 if on_cpu else 0.1,
                         node_resource_engines=node_resource_engines, node_resource_trainer=node_resource_trainer,
                         teacher_engines=teacher.count if teacher is not None else 0,
                         accelerators_per_teacher=None if on_cpu or teacher is None else teacher.accelerators_per_engine)

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
        cpus_rollout: float = CPUS_PER_ROLLOUT,
        node_resource_engines: str | None = None,
        node_resource_trainer: str | None = None,
        strategy: Strategy = "PACK",
        teacher_engines: int = 0,
        accelerators_per_teacher: int | None = None,
    ) -> PlacementPlan:
        """Plan the bundles; ``accelerators_per_engine`` ``None``: the section's value, else 1;
        ``teacher_engines`` a distillation teacher's own engines of ``accelerators_per_teacher`` each
        (``None``: 1).

        Raises ``ValueError`` naming the field when a count is invalid, the trainer does not have one
        accelerator per rank, or the section's ``num_accelerators`` cannot hold the plan.
        """
        _check_count("engines", engines, 0)
        _check_count("trainer_ranks", trainer_ranks, 1)
        for name, value in (("cpus_per_engine", cpus_per_engine), ("cpus_per_rank", cpus_per_rank),
                            ("cpus_rollout", cpus_rollout)):
            _check_cpus(name, value)
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
        _check_count("teacher_engines", teacher_engines, 0)
        per_teacher = 0 if resource is None else (accelerators_per_teacher or 1)
        teacher_slots = tuple(ActorPlacement("teacher", t, _bundle(cpus_per_engine, resource, per_teacher, None))
                              for t in range(teacher_engines))
        if teacher_engines:
            groups = (*groups, BundleGroup("teacher", tuple(_bundle(cpus_per_engine, resource, per_teacher,
                                                                    node_resource_engines)
                                                            for _ in range(teacher_engines)), strategy))
        rollout = BundleGroup("rollout", (_bundle(cpus_rollout, None, 0, node_resource_engines),), strategy)
        plan = cls(placement=cluster.placement, accelerator=cluster.accelerator, engines=engines,
                   accelerators_per_engine=per_engine, trainer_ranks=trainer_ranks, groups=(*groups, rollout),
                   engine_slots=engine_slots, trainer_slots=trainer_slots,
                   rollout_slot=ActorPlacement("rollout", 0, {"CPU": round(cpus_rollout, 4)}),
                   teacher_slots=teacher_slots, accelerators_per_teacher=per_teacher)
        needed = plan.accelerators_needed
        if cluster.num_accelerators is not None and needed > cluster.num_accelerators:
            teachers = f" + {teacher_engines} teacher engine(s) x {per_teacher}" if teacher_engines else ""
            raise ValueError(
                f"cluster.num_accelerators={cluster.num_accelerators}: the {cluster.placement} plan needs "
                f"{needed} ({engines} engine(s) x {per_engine} + {trainer_ranks} trainer rank(s)"
                f"{', shared' if cluster.placement == 'colocated' else ''}{teachers}); expected at least {needed}")
        return plan

    @property
    def teacher_engines(self) -> int:
        """A distillation teacher's own engines (``teacher.kind = "engines"``)."""
        return len(self.teacher_slots)

    @property
    def resource(self) -> str | None:
        """The Ray resource of the accelerator (``GPU``, ``NPU``; ``None`` on CPU)."""
        return ACCELERATOR_RESOURCES[self.accelerator]

    @property
    def accelerators_needed(self) -> int:
        """Accelerators the plan reserves (0 on CPU)."""
        resource = self.resource
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
        """The bundle indices engine ``engine`` uses in its group (one: it holds all its accelerators)."""
        _check_index("engine", engine, self.engines)
        return (self.engine_slots[engine].bundle,)

    def create(self, *, timeout_s: float = 60.0) -> PlacedGroups:
        """Reserve the bundles as Ray placement groups and wait (up to ``timeout_s``) until ready.

        Ray must be initialised (:class:`~agentrl.runner.cluster.RayRuntime`). Raises :class:`PlacementError`
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
    span = max(1, per_engine)  # trainer ranks one engine's bundle holds (on CPU: one)
    shared = min(ranks, engines * span)
    bundles = []
    for e in range(engines):
        sharing = len(range(e * span, min((e + 1) * span, shared)))
        bundles.append(_bundle(cpus_engine + cpus_rank * sharing, resource, per_engine, node_resource))
    bundles += [_bundle(cpus_rank, resource, 1.0, node_resource) for _ in range(shared, ranks)]
    engine_slots = tuple(ActorPlacement("colocated", e, _bundle(cpus_engine, resource, per_engine, None))
                         for e in range(engines))
    trainer_slots = tuple(
        ActorPlacement("colocated", r // span, _bundle(cpus_rank, None, 0, None),
                       colocated_with=(r // span, r % span) if resource is not None else None)
        if r < shared else
        ActorPlacement("colocated", engines + r - shared, _bundle(cpus_rank, resource, 1.0, None))
        for r in range(ranks))
    return (BundleGroup("colocated", tuple(bundles), strategy),), engine_slots, trainer_slots


def _disaggregated(engines: int, per_engine: int, ranks: int, resource: str | None, cpus_engine: float,
                   cpus_rank: float, node_engines: str | None, node_trainer: str | None,
                   strategy: Strategy) -> Planned:
    groups = []
    if engines:
        groups.append(BundleGroup("engines", tuple(_bundle(cpus_engine, resource, per_engine, node_engines)
                                                   for _ in range(engines)), strategy))
    groups.append(BundleGroup("trainer", tuple(_bundle(cpus_rank, resource, 1.0, node_trainer)
                                              for _ in range(ranks)), strategy))
    engine_slots = tuple(ActorPlacement("engines", e, _bundle(cpus_engine, resource, per_engine, None))
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

    def teacher(self, engine: int) -> ActorPlacement:
        """The placement of teacher engine ``engine``'s host actor, bound to its placement group."""
        _check_index("teacher engine", engine, self.plan.teacher_engines)
        return self._bind(self.plan.teacher_slots[engine])

    def rollout(self) -> ActorPlacement:
        """The placement of the rollout actor (scheduler and router; CPUs only)."""
        return self._bind(self.plan.rollout_slot)

    def _bind(self, slot: ActorPlacement) -> ActorPlacement:
        if slot.group not in self.groups:
            raise PlacementError(f"placement group {slot.group!r} was removed; create the plan again")
        return dataclasses.replace(slot, placement_group=self.groups[slot.group])

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
