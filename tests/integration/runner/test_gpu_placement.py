"""Placement on accelerators, proven on the session's Ray cluster with fake devices (Ray hands out GPU
and NPU ids to actors on a machine that has none).

Each plan is started through the run's own path (``start_sides``): placement groups, one engine host
actor per engine, the rollout actor with the real sglang-router, and the train group. The engines'
``sglang.launch_server`` is a recording stand-in (``sglang_standin/``) that writes its command line
and device environment, then serves as a fake worker; the trainer ranks are recording stubs. Checked
for every plan: each engine process sees exactly its devices and its SGLang arguments select them
(``--tp-size k --base-gpu-id 0 --gpu-id-step 1``), no device is shared unless colocated (then
exactly as the map says), trainer ranks hold distinct devices, the router has every engine's URL,
and the recorded :class:`DeviceMap` agrees with what the processes saw.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import ray
from _ray_stubs import BlindHost, Counter, RecordingRank
from _ray_support import RAY_HOST_A, RAY_HOST_B, RayTwoHosts

from agentrl.runner import RunConfig
from agentrl.runner.cluster import spawn
from agentrl.runner.device_plan import cluster_nodes, planned_device_map
from agentrl.runner.devices import GIB, PlacementMapError
from agentrl.runner.envs import environment_factory
from agentrl.runner.loop import RunnerError
from agentrl.runner.ray_run import check_weights_folder, start_sides
from agentrl.testing import build_tiny_model
from agentrl.testing.runner import index_reward

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

STANDIN = Path(__file__).resolve().parent / "sglang_standin"


def _config(tmp_path: Path, *, placement: str, engines: int, tp: int, ranks: int, accelerator: str = "gpu",
            **cluster: Any) -> RunConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"".join(orjson.dumps({"question": f"What is {a} + 1?", "answer": str(a + 1)}) + b"\n" for a in range(8)))
    record = tmp_path / "engines"
    record.mkdir()
    return RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data)}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {"engines": {"count": engines, "tp_size": tp, "startup_timeout_s": 60,
                                "env": {"PYTHONPATH": str(STANDIN), "AGENTRL_STANDIN_RECORD": str(record)}}},
        "train": {"steps": 1, "data_parallel_size": ranks},
        "logging": {"run_dir": str(tmp_path / "run")},
        "cluster": {"placement": placement, "accelerator": accelerator, **cluster},
    })


async def _start(config: RunConfig, engines_on: str, trainer_on: str) -> dict[str, Any]:
    """Starts the plan's sides, reads back what every process got, stops them."""
    sides = await start_sides(config, environment_factory(config, reward=index_reward), trainer_cls=RecordingRank,
                              train_device="cpu", node_resource_engines=engines_on, node_resource_trainer=trainer_on)
    try:
        assert sides.trainer is not None and sides.device_map is not None
        ranks = await sides.trainer.group_env()
        workers = await sides.rollout.router_workers()
        versions = await sides.rollout.engine_versions()
    finally:
        await sides.stop()
    record = Path(config.rollout.engines.env["AGENTRL_STANDIN_RECORD"])
    engines = [json.loads(p.read_text()) for p in sorted(record.glob("*.json"))]
    return {"map": sides.device_map, "ranks": ranks, "workers": workers, "engines": engines, "versions": versions}


def _check(seen: dict[str, Any], *, accelerator: str, engines: int, tp: int, ranks: int, colocated: bool) -> None:
    var = {"gpu": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}[accelerator]
    device_map = seen["map"]
    launched = {e["port"]: e for e in seen["engines"]}
    assert len(launched) == engines and len(seen["versions"]) == engines
    assert sorted(u.rsplit(":", 1)[1] for u in seen["workers"]) == sorted(str(p) for p in launched)
    by_devices = {}
    for entry in launched.values():
        argv = entry["argv"]
        flags = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
        assert flags["--tp-size"] == str(tp) and flags["--base-gpu-id"] == "0" and flags["--gpu-id-step"] == "1"
        assert flags["--device"] == {"gpu": "cuda", "npu": "npu"}[accelerator]
        visible = entry["env"][var].split(",")
        assert len(visible) == tp == len(set(visible))            # exactly its own devices, in TP order
        by_devices[tuple(visible)] = entry
    assert sorted(by_devices) == sorted(p.devices for p in device_map.engines)  # the map says what ran
    held = [(p.node, d) for p in device_map.engines for d in p.devices]
    assert len(held) == len(set(held)) == engines * tp               # no device in two engines
    rank_devices = [(r.node, r.device) for r in device_map.ranks]
    assert len(rank_devices) == len(set(rank_devices)) == ranks      # each rank its own device
    assert [env[var] for env in seen["ranks"]] == [r.device for r in device_map.ranks]  # what the rank sees
    if colocated:
        for rank in device_map.ranks:
            engine = device_map.engines[rank.rank // tp]
            assert (rank.node, rank.device) == (engine.node, engine.devices[rank.rank % tp])
    else:
        assert not set(held) & set(rank_devices)


# Three of the five one-node plans that tests/unit/runner/test_devices.py plans: TP 1, 2 (colocated) and 4.
# The other two (disaggregated 2x2 and colocated 8x1) are carried out by the same code as these (the two-node
# test below runs TP 2 disaggregated); starting their 12 and 17 actors cost 25-42 s of the suite.
@pytest.mark.parametrize(("placement", "engines", "tp", "ranks"), [
    ("disaggregated", 4, 1, 4), ("disaggregated", 1, 4, 4), ("colocated", 4, 2, 8),
])
async def test_one_node_of_eight_gpus(tmp_path: Path, ray_two_hosts: RayTwoHosts, placement: str, engines: int,
                                      tp: int, ranks: int) -> None:
    extra = {"accelerator_memory_gib": 80} if placement == "colocated" else {}
    config = _config(tmp_path, placement=placement, engines=engines, tp=tp, ranks=ranks, **extra)
    seen = await _start(config, RAY_HOST_A, RAY_HOST_A)
    _check(seen, accelerator="gpu", engines=engines, tp=tp, ranks=ranks, colocated=placement == "colocated")
    node = ray_two_hosts.node_of[RAY_HOST_A]
    assert {p.node for p in seen["map"].engines} | {r.node for r in seen["map"].ranks} == {node}
    if placement == "colocated":  # the device map's share reaches the engines: 80 GiB, a tiny trainer
        assert seen["map"].memory is not None and seen["map"].memory.capacity_bytes == 80 * GIB
        assert all(e["argv"][e["argv"].index("--mem-fraction-static") + 1] == "0.9" for e in seen["engines"])
        assert all("--enable-memory-saver" in e["argv"] for e in seen["engines"])


async def test_two_nodes_engines_on_one_trainer_on_the_other(tmp_path: Path, ray_two_hosts: RayTwoHosts) -> None:
    config = _config(tmp_path, placement="disaggregated", engines=4, tp=2, ranks=8)
    seen = await _start(config, RAY_HOST_A, RAY_HOST_B)
    _check(seen, accelerator="gpu", engines=4, tp=2, ranks=8, colocated=False)
    assert {p.node for p in seen["map"].engines} == {ray_two_hosts.node_of[RAY_HOST_A]}
    assert {r.node for r in seen["map"].ranks} == {ray_two_hosts.node_of[RAY_HOST_B]}
    # the rollout actor runs on the engines' node: they serve on loopback
    assert {e["host"] for e in seen["engines"]} == {"127.0.0.1"}


async def test_npu_plan_names_ascend_devices(tmp_path: Path, ray_two_hosts: RayTwoHosts) -> None:
    config = _config(tmp_path, placement="disaggregated", engines=2, tp=2, ranks=2, accelerator="npu")
    seen = await _start(config, RAY_HOST_B, RAY_HOST_B)
    _check(seen, accelerator="npu", engines=2, tp=2, ranks=2, colocated=False)
    assert all(e["env"]["CUDA_VISIBLE_DEVICES"] is None for e in seen["engines"])


async def test_relative_paths_reach_the_actors_absolute_and_an_unshared_export_folder_stops_the_run(
        tmp_path: Path, ray_two_hosts: RayTwoHosts, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver works in ``tmp_path`` with relative paths; Ray's workers do not (checked). The engine
    still starts on the right model folder, and a node that cannot read the trainer's export folder is
    named before step 1 (the fake nodes share one disk, so the engine host is told not to see it)."""
    config = _config(tmp_path, placement="disaggregated", engines=1, tp=1, ranks=1)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(build_tiny_model())
    relative = config.to_dict()
    relative["model"]["path"] = "models/tiny"
    relative["data"]["train"]["path"] = "rows.jsonl"
    relative["logging"]["run_dir"] = "run"
    monkeypatch.chdir(tmp_path)
    config = RunConfig.from_dict(relative)
    worker_cwd = ray.get(spawn(Counter, num_cpus=0.01).cwd.remote())
    assert Path(worker_cwd).resolve() != tmp_path.resolve()  # a relative path would miss there
    sides = await start_sides(config, environment_factory(config, reward=index_reward), trainer_cls=RecordingRank,
                              train_device="cpu", node_resource_engines=RAY_HOST_A, node_resource_trainer=RAY_HOST_B,
                              host_cls=BlindHost)
    try:
        with pytest.raises(RunnerError, match=r"disk weight sync: engine\(s\) \[0\] on node\(s\) \['[0-9a-f]+'\] "
                                              r"cannot read .*run/weights/.agentrl-shared-folder', which trainer rank "
                                              r"0 wrote on node [0-9a-f]+.*Expected a filesystem shared by trainer "
                                              r"rank 0 and every engine node"):
            await check_weights_folder(sides, config.with_absolute_paths().run_dir() / "weights")
    finally:
        await sides.stop()
    (entry,) = [json.loads(p.read_text()) for p in (tmp_path / "engines").glob("*.json")]
    argv = entry["argv"]
    assert argv[argv.index("--model-path") + 1] == str(tmp_path.resolve() / "models" / "tiny")


async def test_the_dry_run_map_reads_the_cluster_nodes(tmp_path: Path, ray_two_hosts: RayTwoHosts) -> None:
    """With ``cluster.ray_address`` the pre-flight places the plan on the cluster's nodes (8 GPUs each
    here), not on this machine: a plan that needs both nodes fits, an engine larger than a node does not."""
    config = _config(tmp_path, placement="disaggregated", engines=4, tp=2, ranks=8,
                     ray_address=ray_two_hosts.cluster.address)
    nodes, source = cluster_nodes(config)
    assert source == "ray cluster" and sorted(len(n.devices) for n in nodes) == [8, 8]
    assert {n.node for n in nodes} == set(ray_two_hosts.node_of.values())
    device_map = planned_device_map(config, nodes)
    assert len({p.node for p in device_map.engines}) == 1 and len({r.node for r in device_map.ranks}) == 1
    big = _config(tmp_path / "big", placement="disaggregated", engines=1, tp=12, ranks=1,
                  ray_address=ray_two_hosts.cluster.address)
    with pytest.raises(PlacementMapError, match=r"an engine with 12 accelerators .* fits on no node.*largest 8"):
        planned_device_map(big, cluster_nodes(big)[0])
