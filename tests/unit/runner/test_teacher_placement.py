"""A distillation teacher is placed like the engines: its own engines (``teacher.kind = "engines"``) get
bundles and devices of their own in either placement, the dry run shows them in the device map and the
memory plan; a teacher the trainer holds (``kind = "model"``) is a term of the trainer's memory. Pure:
no Ray, no torch, no engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.runner import RunConfig
from agentrl.runner.device_plan import memory_plan, planned_device_map, trainer_setup
from agentrl.runner.devices import GIB, DeviceMap, NodeDevices, PlacementMapError
from agentrl.runner.placement import PlacementPlan
from agentrl.testing import build_tiny_model


def _config(tmp_path: Path, placement: str, teacher: dict[str, Any] | None) -> RunConfig:
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "What is 2 * 3?", "answer": "6"}\n')
    return RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "bfloat16"},
        "data": {"train": {"path": str(data)}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {"engines": {"count": 2, "tp_size": 2, "mem_fraction_static": 0.8},
                    "scheduler": {"groups_per_step": 4, "group_size": 2}},
        "train": {"steps": 1, "data_parallel_size": 4},
        "cluster": {"accelerator": "gpu", "placement": placement},
        "teacher": teacher,
    })


def _engines_teacher(count: int = 2, tp: int = 2) -> dict[str, Any]:
    return {"kind": "engines", "path": str(build_tiny_model(seed=1)),
            "engines": {"count": count, "tp_size": tp, "mem_fraction_static": 0.7}}


@pytest.mark.parametrize("placement", ["disaggregated", "colocated"])
def test_teacher_engines_get_devices_of_their_own(tmp_path: Path, placement: str) -> None:
    config = _config(tmp_path, placement, _engines_teacher())
    plan = PlacementPlan.for_run(config)
    assert plan.teacher_engines == 2 and plan.accelerators_per_teacher == 2
    teacher_group = next(g for g in plan.groups if g.name == "teacher")
    assert [b["GPU"] for b in teacher_group.bundles] == [2, 2]
    plain = PlacementPlan.for_run(_config(tmp_path, placement, None))
    assert plan.accelerators_needed == plain.accelerators_needed + 4   # never shared, even colocated
    device_map = planned_device_map(config, [NodeDevices("n0", tuple(map(str, range(16))), 80 * GIB)])
    teacher_devices = {(p.node, d) for p in device_map.teachers for d in p.devices}
    others = {(p.node, d) for p in device_map.engines for d in p.devices} | \
        {(r.node, r.device) for r in device_map.ranks}
    assert len(teacher_devices) == 4 and not teacher_devices & others
    text = "\n".join(device_map.format())
    assert "teacher engine 1 (tp 1)" in text
    assert device_map.to_dict()["teachers"][0]["devices"] == list(device_map.teachers[0].devices)


def test_a_map_that_shares_a_teacher_device_is_refused(tmp_path: Path) -> None:
    plan = PlacementPlan.for_run(_config(tmp_path, "disaggregated", _engines_teacher(count=1, tp=1)))
    engines = [("n0", ["0", "1"]), ("n0", ["2", "3"])]
    ranks: list[tuple[str, str | None]] = [("n0", "4"), ("n0", "5"), ("n0", "6"), ("n0", "7")]
    with pytest.raises(PlacementMapError, match="held by engine 0 and teacher engine 0"):
        DeviceMap.from_assignments(plan, engines, ranks, teachers=[("n0", ["1"])])
    ok = DeviceMap.from_assignments(plan, engines, ranks, teachers=[("n0", ["8"])])
    assert ok.teachers[0].devices == ("8",)


def test_the_memory_plan_shows_the_teacher(tmp_path: Path) -> None:
    engines = memory_plan(_config(tmp_path, "disaggregated", _engines_teacher()), 80 * GIB)
    line = next(x for x in engines.format() if x.startswith("teacher engine rank"))
    assert line.startswith("teacher engine rank (tp=2, bfloat16): weights 0.0 GiB, KV cache ")
    assert "at mem_fraction_static 0.7; on devices of its own" in line
    assert engines.teacher_kv_tokens is not None and engines.teacher_kv_tokens > 0
    held = _config(tmp_path, "disaggregated", {"kind": "model", "path": str(build_tiny_model(seed=1))})
    plain = _config(tmp_path, "disaggregated", None)
    assert trainer_setup(held).teacher_params > 0 and trainer_setup(plain).teacher_params == 0
    with_teacher, without = memory_plan(held, 80 * GIB), memory_plan(plain, 80 * GIB)
    assert with_teacher.trainer is not None and without.trainer is not None
    extra = with_teacher.trainer.terms["teacher weights"]
    assert extra == trainer_setup(held).teacher_params * 4                       # train.dtype float32, every rank
    assert with_teacher.trainer.peak - without.trainer.peak == extra
    assert with_teacher.trainer.resident - without.trainer.resident == extra     # kept while engines generate
    assert ", teacher 0.0" in with_teacher.format()[0]
