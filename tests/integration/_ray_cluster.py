"""Ray for the integration tests: ONE two-node cluster for the whole session (the runner's and the
sandbox fleet's tests share it).

``ray_two_hosts`` starts a ``ray.cluster_utils.Cluster`` on this machine: a head node carrying the
custom resource ``host_a`` and eight declared GPUs (Ray hands out their ids: no device is used), and
a second node carrying ``host_b``, eight GPUs and eight NPUs (standing for two hosts), one CPU and a 100 MiB object store each, sockets and logs in a short private temp folder. Neither node runs Ray's log monitor: agentrl
connects with ``log_to_driver=False``, so nothing reads what it publishes, and on the head it polled the
log files of every worker the suite started (~28 CPU-s a run). The test process
is connected to it through :class:`agentrl.runner.cluster.RayRuntime`. At the end of the session the
cluster is shut down (never ``ray stop``) and no process that ran in its temp folder may remain.

The second node also carries ``sandbox`` (:data:`RAY_SANDBOX`), the resource that marks a sandbox
fleet's nodes; the head does not. Ray's node health check runs every second and declares a node dead
after three failed checks (defaults: 3 s and 5), so a test that removes a node it added sees the loss
within seconds; a live node answers each check at once, so nothing else notices.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _ray_support import (
    RAY_FAKE_GPUS,
    RAY_FAKE_NPUS,
    RAY_HEALTH_CHECK,
    RAY_HOST_A,
    RAY_HOST_B,
    RAY_OBJECT_STORE,
    RAY_SANDBOX,
    RayTwoHosts,
    ray_processes,
)

from agentrl.runner.cluster import QUIET_ENV, RayRuntime


@pytest.fixture(scope="session")
def ray_two_hosts() -> Iterator[RayTwoHosts]:
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    from ray.cluster_utils import Cluster

    temp_dir = Path(tempfile.mkdtemp(prefix="ray-t-", dir="/tmp"))
    # The Cluster helper writes the head's address to $RAY_TMPDIR/ray: keep it in our folder.
    (temp_dir / "ray").mkdir()
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(temp_dir)
    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 1, "num_gpus": RAY_FAKE_GPUS, "resources": {RAY_HOST_A: 1}, "object_store_memory": RAY_OBJECT_STORE,
        "include_dashboard": False, "include_log_monitor": False, "temp_dir": str(temp_dir),
        "_system_config": dict(RAY_HEALTH_CHECK)})
    try:
        cluster.add_node(num_cpus=1, num_gpus=RAY_FAKE_GPUS, resources={RAY_HOST_B: 1, "NPU": RAY_FAKE_NPUS, RAY_SANDBOX: 1},
                         object_store_memory=RAY_OBJECT_STORE, include_log_monitor=False)
        cluster.wait_for_nodes()
        runtime = RayRuntime.start(address=cluster.address, namespace="agentrl-tests")
        started = ray_processes(str(temp_dir))
        names = [p.name() for p in started]  # both nodes' processes, so the end check can see them
        assert names.count("gcs_server") == 1 and names.count("raylet") == 2, names
        import ray

        node_of = {name: n["NodeID"] for n in ray.nodes() if n["Alive"]
                   for name in (RAY_HOST_A, RAY_HOST_B) if name in n["Resources"]}
        assert set(node_of) == {RAY_HOST_A, RAY_HOST_B} and len(set(node_of.values())) == 2, ray.nodes()
        yield RayTwoHosts(runtime, cluster, temp_dir, node_of, time.perf_counter() - t0)
        runtime.shutdown()
    finally:
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        deadline = time.monotonic() + 15
        while ray_processes(str(temp_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = ray_processes(str(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"Ray processes left after cluster.shutdown(): {[(p.pid, p.name()) for p in left]}"
