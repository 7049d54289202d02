"""DeviceMap: which device of which node each engine (TP rank) and trainer rank holds; the rules it
checks and the colocated memory shares. Pure: no Ray, no torch."""

from __future__ import annotations

import pytest

from agentrl.runner import ClusterSection
from agentrl.runner.devices import (
    GIB,
    DeviceMap,
    NodeDevices,
    PlacementMapError,
    colocated_shares,
    noset_env,
    visible_devices_env,
)
from agentrl.runner.placement import PlacementPlan


def _node(name: str, count: int = 8, memory_gib: float | None = None) -> NodeDevices:
    return NodeDevices(name, tuple(str(i) for i in range(count)),
                       None if memory_gib is None else int(memory_gib * GIB))


def _plan(placement: str, engines: int, tp: int, ranks: int, accelerator: str = "gpu") -> PlacementPlan:
    return PlacementPlan.build(ClusterSection(placement=placement, accelerator=accelerator),  # type: ignore[arg-type]
                               engines=engines, trainer_ranks=ranks, accelerators_per_engine=tp)


def _devices_of(device_map: DeviceMap) -> tuple[list[set[tuple[str, str]]], list[tuple[str, str | None]]]:
    engines = [{(p.node, d) for d in p.devices} for p in device_map.engines]
    return engines, [(r.node, r.device) for r in device_map.ranks]


@pytest.mark.parametrize(("placement", "engines", "tp", "ranks"), [
    ("disaggregated", 4, 1, 4), ("disaggregated", 2, 2, 4), ("disaggregated", 1, 4, 4),
    ("colocated", 8, 1, 8), ("colocated", 4, 2, 8),
])
def test_one_node_of_eight_gpus(placement: str, engines: int, tp: int, ranks: int) -> None:
    device_map = DeviceMap.planned_for(_plan(placement, engines, tp, ranks), [_node("n0")])
    engine_sets, rank_devices = _devices_of(device_map)
    assert all(len(s) == tp for s in engine_sets)
    held = [d for s in engine_sets for d in s]
    assert len(held) == len(set(held))                          # no device in two engines
    assert len(set(rank_devices)) == ranks                      # each rank its own device
    if placement == "colocated":
        for rank in device_map.ranks:                           # rank e*k+j on engine e's TP rank j
            assert rank.engine == rank.rank // tp and rank.engine_rank == rank.rank % tp
            assert rank.device == device_map.engines[rank.engine].devices[rank.engine_rank]
    else:
        assert not set(held) & set(rank_devices)                # nothing shared unless colocated
    lines = [line for line in device_map.format() if line.startswith("node ")]
    assert len(lines) == len(set(held) | set(rank_devices))     # one line per device
    if tp > 1:
        assert "engine 0 (tp 1)" in "\n".join(lines)


def test_two_nodes_put_the_engines_on_one_and_the_trainer_on_the_other() -> None:
    device_map = DeviceMap.planned_for(_plan("disaggregated", 4, 2, 8), [_node("a"), _node("b")])
    assert {p.node for p in device_map.engines} == {"a"}
    assert {r.node for r in device_map.ranks} == {"b"}
    assert device_map.nodes == ("a", "b")
    assert [p.devices for p in device_map.engines] == [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]


def test_a_tensor_parallel_engine_larger_than_every_node_is_refused() -> None:
    with pytest.raises(PlacementMapError, match=r"an engine with 4 accelerators .* fits on no node.*largest 2.*"
                                                r"expected rollout.engines.tp_size x dp_size <= the accelerators"):
        DeviceMap.planned_for(_plan("disaggregated", 1, 4, 1), [_node("a", 2), _node("b", 2), _node("c", 2)])
    with pytest.raises(PlacementMapError, match=r"the disaggregated plan needs 16 GPU .* the nodes have 8 \(n0: 8\)"):
        DeviceMap.planned_for(_plan("disaggregated", 8, 1, 8), [_node("n0")])


def test_npu_plans_name_ascend_devices() -> None:
    device_map = DeviceMap.planned_for(_plan("disaggregated", 2, 2, 2, accelerator="npu"), [_node("n0")])
    assert device_map.engines[1].launch_env("npu") == {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}
    assert noset_env("npu") == {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}
    assert visible_devices_env("gpu", ["3"]) == {"CUDA_VISIBLE_DEVICES": "3"} and visible_devices_env("cpu", []) == {}
    assert device_map.format()[0] == "node 0 NPU 0: engine 0 (tp 0)"


def test_colocated_memory_shares_leave_room_for_the_trainer() -> None:
    shares = colocated_shares(141 * GIB, 8 * GIB)        # an H200 and Qwen3-4B's bf16 weights
    reserve = int(141 * GIB * 0.08)
    assert shares.reserve_bytes == reserve
    assert shares.engine_bytes + 8 * GIB + reserve <= 141 * GIB
    assert shares.engine_fraction == round((141 * GIB - 8 * GIB - reserve) / (141 * GIB), 3)
    small = colocated_shares(24 * GIB, 8 * GIB)           # the reserve is at least 4 GiB
    assert small.reserve_bytes == 4 * GIB and small.engine_fraction == round(12 / 24, 3)
    assert colocated_shares(80 * GIB, 16 * GIB, engine_fraction=0.5).engine_fraction == 0.5
    with pytest.raises(ValueError, match=r"mem_fraction_static=0.9: colocated with a trainer that keeps 16.0 GiB"):
        colocated_shares(80 * GIB, 16 * GIB, engine_fraction=0.9)
    with pytest.raises(ValueError, match=r"a device of 16.0 GiB cannot hold the trainer's resident 16.0 GiB"):
        colocated_shares(16 * GIB, 16 * GIB)


def test_planned_colocated_map_prints_the_shares_or_says_they_are_unknown() -> None:
    plan = _plan("colocated", 2, 1, 2)
    known = DeviceMap.planned_for(plan, [_node("n0", 2, memory_gib=80)], trainer_resident_bytes=8 * GIB)
    assert known.memory is not None and known.engine_fraction == known.memory.engine_fraction
    assert "engine static pool 0.820" in known.format()[-1]
    unknown = DeviceMap.planned_for(plan, [_node("n0", 2)], trainer_resident_bytes=8 * GIB)
    assert unknown.memory is None and "set cluster.accelerator_memory_gib" in unknown.format()[-1]


def test_assigned_maps_that_break_a_rule_are_refused() -> None:
    apart = _plan("disaggregated", 2, 2, 2)
    good = DeviceMap.from_assignments(apart, [("a", ["0", "1"]), ("a", ["2", "3"])], [("b", "0"), ("b", "1")])
    assert good.holders()["a"]["3"] == ["engine 1 (tp 1)"]
    with pytest.raises(PlacementMapError, match=r"device 1 of node a is held by engine 0 and engine 1"):
        DeviceMap.from_assignments(apart, [("a", ["0", "1"]), ("a", ["1", "2"])], [("b", "0"), ("b", "1")])
    with pytest.raises(PlacementMapError, match=r"engine 0 holds devices \['0'\] on node a; expected 2 distinct"):
        DeviceMap.from_assignments(apart, [("a", ["0"]), ("a", ["2", "3"])], [("b", "0"), ("b", "1")])
    with pytest.raises(PlacementMapError, match=r"held by engine 0 and trainer rank 0 with placement='disaggregated'"):
        DeviceMap.from_assignments(apart, [("a", ["0", "1"]), ("a", ["2", "3"])], [("a", "0"), ("b", "1")])
    with pytest.raises(PlacementMapError, match=r"held by trainer ranks 0 and 1"):
        DeviceMap.from_assignments(apart, [("a", ["0", "1"]), ("a", ["2", "3"])], [("b", "0"), ("b", "0")])
    shared = _plan("colocated", 1, 2, 2)
    DeviceMap.from_assignments(shared, [("a", ["4", "5"])], [("a", "4"), ("a", "5")])
    with pytest.raises(PlacementMapError, match=r"trainer rank 0 is on device 5 of node a; colocated, expected "
                                                r"engine 0's TP rank 0 device 4"):
        DeviceMap.from_assignments(shared, [("a", ["4", "5"])], [("a", "5"), ("a", "4")])
