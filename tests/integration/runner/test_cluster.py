"""RayRuntime, placement groups, spawn and TrainGroup on a real Ray (a two-node cluster on this machine)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
import ray
from _ray_stubs import Counter, DistStub, TinyTrainer
from _ray_support import RAY_FAKE_GPUS, RAY_HOST_A, RAY_HOST_B, RayTwoHosts, ray_processes

from agentrl.runner import ClusterSection
from agentrl.runner.cluster import RayRuntime, TrainGroup, TrainGroupError, spawn
from agentrl.runner.placement import PlacementError, PlacementPlan
from agentrl.testing import build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_LOCAL_RUN = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import psutil
    from agentrl.runner.cluster import RayRuntime

    def alive(pids):
        out = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.NoSuchProcess:
                pass
        return out

    report = []
    for temp_dir in (sys.argv[1], None):
        with RayRuntime.start(temp_dir=temp_dir, namespace="local-run", num_cpus=1,
                              object_store_memory=100 * 1024 * 1024) as runtime:
            import ray

            @ray.remote(num_cpus=0.1)
            def namespace():
                return ray.get_runtime_context().namespace

            children = psutil.Process().children(recursive=True)
            entry = {"temp_dir": str(runtime.temp_dir), "owns": runtime.owns_cluster, "start_s": runtime.start_s,
                     "namespace": ray.get(namespace.remote()),
                     "sessions": len(list(runtime.temp_dir.glob("session_2*"))),
                     "children": {p.pid: p.name() for p in children}}
        entry["shutdown_s"] = runtime.shutdown_s
        entry["alive_after"] = alive(list(entry["children"]))
        entry["temp_dir_kept"] = Path(entry["temp_dir"]).exists()
        report.append(entry)
    print("REPORT " + json.dumps(report))
""")


def test_local_runtime_runs_in_its_temp_dir_and_shutdown_leaves_no_process() -> None:
    temp_dir = tempfile.mkdtemp(prefix="ray-l-", dir="/tmp")
    try:
        out = subprocess.run([sys.executable, "-c", _LOCAL_RUN, temp_dir], capture_output=True, text=True,
                             timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        given, default = json.loads(out.stdout.split("REPORT ", 1)[1])
        print("RAY_LOCAL", json.dumps({k: given[k] for k in ("start_s", "shutdown_s")}),
              json.dumps({k: default[k] for k in ("start_s", "shutdown_s")}))
        for entry in (given, default):
            assert entry["owns"] and entry["namespace"] == "local-run" and entry["sessions"] == 1
            assert {"gcs_server", "raylet"} <= set(entry["children"].values()), entry["children"]
            assert entry["alive_after"] == [], entry
        assert given["temp_dir"] == temp_dir and given["temp_dir_kept"]      # the caller's folder stays
        assert default["temp_dir"] != temp_dir and not default["temp_dir_kept"]  # a made-up one is removed
        assert ray_processes(temp_dir) == []
    finally:
        subprocess.run(["rm", "-rf", temp_dir], check=False)


def test_runtime_reuses_the_process_ray_and_leaves_it_running(ray_two_hosts: RayTwoHosts) -> None:
    with RayRuntime.start(namespace="another", num_cpus=8) as runtime:
        assert runtime.reused and not runtime.owns_cluster
        assert runtime.namespace == "agentrl-tests" and runtime.address == ray_two_hosts.runtime.address
        assert runtime.cluster_resources()["CPU"] == 2.0 and runtime.cluster_resources()["GPU"] == 2 * RAY_FAKE_GPUS
    assert ray.is_initialized()
    with pytest.raises(ValueError, match=r"address='10.0.0.1:6379': this process is already connected to Ray"):
        RayRuntime.start(address="10.0.0.1:6379")
    # a job-level runtime_env cannot reach a Ray this process already joined: refused, not dropped
    with pytest.raises(ValueError, match=r"runtime_env=\{'env_vars': \{'A': '1'\}\}: this process is already connected"):
        RayRuntime.start(runtime_env={"env_vars": {"A": "1"}})
    assert ray.get(spawn(Counter, 1, num_cpus=0.1).add.remote(1)) == 2  # still usable


def test_spawn_sets_env_vars_names_actors_and_runs_async_methods_concurrently(ray_two_hosts: RayTwoHosts) -> None:
    actor = spawn(Counter, 10, name="counter-under-test", num_cpus=0.1, env_vars={"AGENTRL_PROBE": "42"},
                  max_concurrency=8)
    try:
        assert ray.get(actor.add.remote(5)) == 15
        assert ray.get(actor.env.remote("AGENTRL_PROBE")) == "42"
        assert ray.get(ray.get_actor("counter-under-test").add.remote(1)) == 16  # named in the namespace
        # meet(6) returns only when six calls are inside together: proof of concurrent async calls.
        assert sorted(ray.get([actor.meet.remote(6) for _ in range(6)], timeout=30)) == [6] * 6
    finally:
        ray.kill(actor)
    serial = spawn(Counter, num_cpus=0.1, max_concurrency=1)
    try:
        refs = [serial.meet.remote(2) for _ in range(2)]
        ready, _ = ray.wait(refs, num_returns=2, timeout=2)
        assert ready == []  # one call at a time: the first waits for a second that cannot enter
    finally:
        ray.kill(serial)


def _two_host_plan(**kwargs: float) -> PlacementPlan:
    return PlacementPlan.build(ClusterSection(placement="disaggregated"), engines=1, trainer_ranks=1,
                               node_resource_engines=RAY_HOST_A, node_resource_trainer=RAY_HOST_B, **kwargs)


def test_placement_refuses_what_the_cluster_cannot_hold(ray_two_hosts: RayTwoHosts) -> None:
    with pytest.raises(PlacementError, match=r"short of CPU \(asked 5.5, has 2.0\)"):
        _two_host_plan(cpus_per_rank=5).create(timeout_s=5)
    with pytest.raises(PlacementError, match=r"short of host_c \(asked 0.001, has 0.0\)"):
        PlacementPlan.build(ClusterSection(placement="disaggregated"), engines=1, trainer_ranks=1,
                            node_resource_trainer="host_c").create(timeout_s=5)
    with pytest.raises(PlacementError, match=r"bundle \{'CPU': 1.5\} fits on no single node"):
        PlacementPlan.build(ClusterSection(), engines=0, trainer_ranks=1, cpus_per_rank=1.5).create(timeout_s=5)


def test_placement_not_ready_by_the_deadline_is_removed_and_explained(ray_two_hosts: RayTwoHosts) -> None:
    def live_groups() -> int:
        return sum(1 for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED")

    before = live_groups()
    with _two_host_plan(cpus_per_engine=0.6, cpus_per_rank=0.6).create(timeout_s=30) as held:
        assert live_groups() == before + 3
        t0 = time.perf_counter()
        with pytest.raises(PlacementError, match=r"were not ready within 2.0 s; the cluster has .*available now"):
            _two_host_plan(cpus_per_engine=0.6, cpus_per_rank=0.6).create(timeout_s=2.0)
        assert time.perf_counter() - t0 < 10
        assert live_groups() == before + 3
        assert set(held.groups) == {"engines", "trainer", "rollout"}
    assert live_groups() == before


def test_train_group_all_reduces_over_gloo_and_names_a_failing_rank(ray_two_hosts: RayTwoHosts) -> None:
    t0 = time.perf_counter()
    group = TrainGroup.start(DistStub, "dp", world_size=2, num_cpus=0.25, env_vars={"OMP_NUM_THREADS": "1"})
    start_s = time.perf_counter() - t0
    try:
        info = group.call("info")
        assert [i["rank"] for i in info] == [0, 1] and {i["backend"] for i in info} == {"gloo"}
        assert {i["world_size"] for i in info} == {2} and {i["threads"] for i in info} == {1}
        assert group.call("all_reduce", [1.0, 2.0]) == [[3.0], [3.0]]
        assert group.call("async_rank") == [0, 1]
        with pytest.raises(TrainGroupError, match=r"fail_on failed on rank 1: ValueError: rank 1 fails on purpose$"):
            group.call("fail_on", 1)
        assert group.call("all_reduce", [0.5, 0.25]) == [[0.75], [0.75]]  # the group still works
        with pytest.raises(IndexError, match=r"rank=2: expected 0 <= rank < 2"):
            group.call_rank(2, "info")
        print("RAY_TRAIN_GROUP", json.dumps({"start_s": start_s, **group.timings,
                                             "init_s": [r["init_s"] for r in group.ranks]}))
    finally:
        group.teardown()
    with pytest.raises(TrainGroupError, match=r"the group was torn down"):
        group.call("info")


def test_two_hosts_engine_and_trainer_apart_and_a_train_step_runs(ray_two_hosts: RayTwoHosts) -> None:
    model_path = build_tiny_model()
    plan = _two_host_plan()
    with plan.create(timeout_s=30) as placed:
        engine = spawn(Counter, placement=placed.engine(0))
        t0 = time.perf_counter()
        group = TrainGroup.start(TinyTrainer, str(model_path), world_size=1, placement=placed,
                                 env_vars={"OMP_NUM_THREADS": "1"})
        start_s = time.perf_counter() - t0
        try:
            engine_node = ray.get(engine.where.remote())["node_id"]
            (trainer_where,) = group.call("where")
            assert engine_node == ray_two_hosts.node_of[RAY_HOST_A]
            assert trainer_where["node_id"] == group.node_ids[0] == ray_two_hosts.node_of[RAY_HOST_B]
            assert engine_node != trainer_where["node_id"]
            (step,) = group.call("train_step", 0, timeout_s=120)
            assert group.call_rank(0, "where")["pid"] == trainer_where["pid"]
            assert math.isfinite(step["loss"]) and step["param_abs_change"] > 0, step
            print("RAY_TWO_HOSTS", json.dumps({"cluster_start_s": ray_two_hosts.start_s, "group_start_s": start_s,
                                               **group.timings,
                                               "engine_node": engine_node[:8],
                                               "trainer_node": trainer_where["node_id"][:8], **step}))
        finally:
            group.teardown()
            ray.kill(engine)


def test_gpu_plans_give_an_engine_all_its_accelerators_and_nothing_to_a_rank_sharing_them(
        ray_two_hosts: RayTwoHosts) -> None:
    def gpu_ids(actor: object) -> list[str]:
        return list(ray.get(actor.where.remote())["gpu_ids"])  # type: ignore[attr-defined]

    colocated = PlacementPlan.build(ClusterSection(accelerator="gpu"), engines=1, accelerators_per_engine=2,
                                    trainer_ranks=2, node_resource_engines=RAY_HOST_A,
                                    node_resource_trainer=RAY_HOST_A)
    with colocated.create(timeout_s=30) as placed:
        engine = spawn(Counter, placement=placed.engine(0))
        ranks = [spawn(Counter, placement=slot) for slot in placed.trainers()]
        try:
            # the engine's host reserves both GPUs of its bundle; the ranks on them ask none of Ray
            # (the run gives each its device through the device map)
            assert len(set(gpu_ids(engine))) == 2 and [gpu_ids(r) for r in ranks] == [[], []]
        finally:
            for actor in (engine, *ranks):
                ray.kill(actor)
    apart = PlacementPlan.build(ClusterSection(placement="disaggregated", accelerator="gpu"), engines=1,
                                trainer_ranks=1)
    with apart.create(timeout_s=30) as placed:
        engine, trainer = spawn(Counter, placement=placed.engine(0)), spawn(Counter, placement=placed.trainer(0))
        try:
            # each gets one GPU of its own: another id on the same host, or any id on another host
            # (Ray numbers a host's GPUs from 0, so both may hold "0" on two hosts)
            where_engine, where_trainer = (ray.get(a.where.remote()) for a in (engine, trainer))
            assert len(where_engine["gpu_ids"]) == len(where_trainer["gpu_ids"]) == 1
            assert ((where_engine["node_id"], where_engine["gpu_ids"][0])
                    != (where_trainer["node_id"], where_trainer["gpu_ids"][0]))
        finally:
            ray.kill(engine)
            ray.kill(trainer)
    with pytest.raises(PlacementError, match=r"short of .*GPU \(asked 17.0, has 16.0\)"):
        PlacementPlan.build(ClusterSection(placement="disaggregated", accelerator="gpu"), engines=16,
                            trainer_ranks=1).create(timeout_s=5)
    with pytest.raises(PlacementError, match=r"bundle \{'CPU': 0.25, 'GPU': 9\} fits on no single node"):
        PlacementPlan.build(ClusterSection(placement="disaggregated", accelerator="gpu"), engines=1,
                            accelerators_per_engine=9, trainer_ranks=1).create(timeout_s=5)
