"""PlacementPlan: bundles for engines and trainer ranks, pure (no Ray started)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from agentrl.runner import ClusterSection
from agentrl.runner.cluster import RayRuntime, spawn
from agentrl.runner.placement import ActorPlacement, PlacementError, PlacementPlan


def _cluster(placement: str = "colocated", accelerator: str = "cpu", **counts: int) -> ClusterSection:
    return ClusterSection(placement=placement, accelerator=accelerator, **counts)  # type: ignore[arg-type]


def _actors_per_bundle(plan: PlacementPlan) -> dict[tuple[str, int], list[ActorPlacement]]:
    out: dict[tuple[str, int], list[ActorPlacement]] = {}
    for slot in (*plan.engine_slots, *plan.trainer_slots):
        out.setdefault((slot.group, slot.bundle), []).append(slot)
    return out


def test_cpu_colocated_shares_bundles_and_uses_cpus_only() -> None:
    plan = PlacementPlan.build(_cluster(), engines=1, trainer_ranks=2)
    assert [g.name for g in plan.groups] == ["colocated", "rollout"]
    assert plan.groups[0].bundles == ({"CPU": 0.5}, {"CPU": 0.25})
    assert plan.engine_slots == (ActorPlacement("colocated", 0, {"CPU": 0.25}),)
    assert [(s.bundle, dict(s.resources)) for s in plan.trainer_slots] == [(0, {"CPU": 0.25}), (1, {"CPU": 0.25})]
    assert plan.rollout_slot == ActorPlacement("rollout", 0, {"CPU": 0.25})
    assert plan.accelerators_needed == 0
    assert plan.totals() == {"CPU": 1.0}


def test_cpu_disaggregated_pins_each_group_to_its_node_resource() -> None:
    plan = PlacementPlan.build(_cluster("disaggregated"), engines=2, trainer_ranks=1, cpus_per_engine=0.5,
                               node_resource_engines="host_a", node_resource_trainer="host_b")
    groups = {g.name: g.bundles for g in plan.groups}
    assert groups == {"engines": ({"CPU": 0.5, "host_a": 0.001},) * 2, "trainer": ({"CPU": 0.25, "host_b": 0.001},),
                      "rollout": ({"CPU": 0.25, "host_a": 0.001},)}
    assert [(s.group, s.bundle) for s in plan.engine_slots] == [("engines", 0), ("engines", 1)]
    assert [(s.group, s.bundle) for s in plan.trainer_slots] == [("trainer", 0)]
    # Actors ask only CPUs of their bundle: the node resource is the bundle's, not theirs.
    assert all("host_a" not in s.resources and "host_b" not in s.resources
               for s in (*plan.engine_slots, *plan.trainer_slots))


def test_gpu_colocated_engine_bundles_hold_their_accelerators_and_the_ranks_sharing_them() -> None:
    plan = PlacementPlan.build(_cluster(accelerator="gpu"), engines=2, accelerators_per_engine=2, trainer_ranks=5)
    group = plan.groups[0]
    # one bundle per engine (its 2 GPUs on one node, the CPUs of its host and of the 2 ranks on them),
    # then a bundle of one GPU for the rank beyond the engines' devices
    assert [dict(b) for b in group.bundles] == [{"CPU": 0.75, "GPU": 2}, {"CPU": 0.75, "GPU": 2},
                                                {"CPU": 0.25, "GPU": 1.0}]
    assert [s.bundle for s in plan.engine_slots] == [0, 1]
    assert plan.engine_bundles(1) == (1,)
    assert [dict(s.resources) for s in plan.engine_slots] == [{"CPU": 0.25, "GPU": 2}] * 2
    assert [(s.bundle, s.colocated_with, dict(s.resources)) for s in plan.trainer_slots] == [
        (0, (0, 0), {"CPU": 0.25}), (0, (0, 1), {"CPU": 0.25}), (1, (1, 0), {"CPU": 0.25}),
        (1, (1, 1), {"CPU": 0.25}), (2, None, {"CPU": 0.25, "GPU": 1.0})]
    assert plan.accelerators_needed == 5


def test_gpu_disaggregated_counts_both_sides_against_num_accelerators() -> None:
    plan = PlacementPlan.build(_cluster("disaggregated", "gpu"), engines=2, accelerators_per_engine=2,
                               trainer_ranks=2)
    assert plan.accelerators_needed == 6
    assert {g.name: len(g.bundles) for g in plan.groups} == {"engines": 2, "trainer": 2, "rollout": 1}
    # An engine's bundle holds all its GPUs (Ray keeps a bundle on one node); its host asks them all.
    assert [dict(b) for b in plan.groups[0].bundles] == [{"CPU": 0.25, "GPU": 2}] * 2
    assert plan.engine_slots[0].resources == {"CPU": 0.25, "GPU": 2}
    with pytest.raises(ValueError, match=r"cluster.num_accelerators=5: the disaggregated plan needs 6"):
        PlacementPlan.build(_cluster("disaggregated", "gpu", num_accelerators=5), engines=2,
                            accelerators_per_engine=2, trainer_ranks=2)
    assert PlacementPlan.build(_cluster("colocated", "gpu", num_accelerators=4), engines=2,
                               accelerators_per_engine=2, trainer_ranks=2).accelerators_needed == 4


def test_npu_is_a_custom_resource_and_section_default_per_engine() -> None:
    plan = PlacementPlan.build(_cluster("disaggregated", "npu", accelerators_per_engine=4), engines=1,
                               trainer_ranks=1)
    assert plan.accelerators_per_engine == 4
    assert plan.totals() == {"CPU": 0.75, "NPU": 5.0}


def test_train_only_plan_has_no_engine_group() -> None:
    plan = PlacementPlan.build(_cluster("disaggregated"), engines=0, trainer_ranks=2)
    assert [g.name for g in plan.groups] == ["trainer", "rollout"]
    with pytest.raises(IndexError, match=r"engine=0: expected 0 <= engine < 0"):
        plan.engine_bundles(0)


@pytest.mark.parametrize(("placement", "accelerator", "engines", "per_engine", "ranks"), [
    (p, a, e, k, r) for p, a, e, k, r in itertools.product(
        ("colocated", "disaggregated"), ("cpu", "gpu", "npu"), (0, 1, 3), (1, 2), (1, 2, 5))
    if not (a == "cpu" and k > 1)
])
def test_every_actor_fits_its_bundle(placement: str, accelerator: str, engines: int, per_engine: int,
                                     ranks: int) -> None:
    plan = PlacementPlan.build(_cluster(placement, accelerator), engines=engines, trainer_ranks=ranks,
                               accelerators_per_engine=None if accelerator == "cpu" else per_engine,
                               node_resource_engines="h", node_resource_trainer="h")
    bundles = {g.name: g.bundles for g in plan.groups}
    for (group, index), actors in _actors_per_bundle(plan).items():
        if accelerator != "cpu":  # a rank sharing an engine's device asks none of it: the host holds them
            assert all(plan.resource not in a.resources for a in actors if a.colocated_with is not None)
        bundle = bundles[group][index]
        for name in {k for a in actors for k in a.resources}:
            assert sum(a.resources.get(name, 0.0) for a in actors) <= bundle.get(name, 0.0) + 1e-9, (group, index)
    spans = [plan.engine_bundles(e) for e in range(engines)]
    assert len({b for s in spans for b in s}) == sum(len(s) for s in spans)  # engines never overlap
    if accelerator != "cpu":
        engine_acc, trainer_acc = engines * per_engine, ranks
        expected = max(engine_acc, trainer_acc) if placement == "colocated" else engine_acc + trainer_acc
        assert plan.accelerators_needed == expected
    assert all(b.get("h") == 0.001 for g in plan.groups for b in g.bundles)


@pytest.mark.parametrize(("cluster", "kwargs", "message"), [
    (_cluster(), {"engines": 1, "trainer_ranks": 0}, r"trainer_ranks=0: expected an integer >= 1"),
    (_cluster(), {"engines": -1, "trainer_ranks": 1}, r"engines=-1: expected an integer >= 0"),
    (_cluster(), {"engines": 1, "trainer_ranks": 1, "cpus_per_rank": 0}, r"cpus_per_rank=0: expected a finite"),
    (_cluster(), {"engines": 1, "trainer_ranks": 1, "accelerators_per_engine": 2},
     r"accelerators_per_engine=2 with accelerator='cpu'"),
    (_cluster(), {"engines": 1, "trainer_ranks": 1, "node_resource_engines": "a", "node_resource_trainer": "b"},
     r"node_resource_engines='a', node_resource_trainer='b' with placement='colocated'"),
    (_cluster("disaggregated", "gpu", trainer_accelerators=4), {"engines": 1, "trainer_ranks": 2},
     r"cluster.trainer_accelerators=4 with trainer_ranks=2: expected one accelerator per trainer rank"),
])
def test_bad_plans_name_field_and_expectation(cluster: ClusterSection, kwargs: dict[str, object],
                                              message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlacementPlan.build(cluster, **kwargs)  # type: ignore[arg-type]


def test_spawn_refuses_a_planned_but_not_created_placement() -> None:
    plan = PlacementPlan.build(_cluster(), engines=1, trainer_ranks=1)
    with pytest.raises(PlacementError, match=r"only planned; expected one from PlacementPlan.create"):
        spawn(dict, placement=plan.trainer_slots[0])
    with pytest.raises(TypeError, match=r"expected a plain class"):
        spawn(len)  # type: ignore[arg-type]


def test_runtime_refuses_a_temp_dir_too_long_for_unix_sockets(tmp_path: Path) -> None:
    long_dir = tmp_path / ("x" * 60)
    with pytest.raises(ValueError, match=r"temp_dir=.* characters: .*107-byte socket path limit; expected at most 43"):
        RayRuntime.start(temp_dir=long_dir)
    assert not long_dir.exists()
    with pytest.raises(ValueError, match=r"object_store_memory=1000: expected at least 78643200 bytes"):
        RayRuntime.start(object_store_memory=1000)
