"""Shared by the Ray tests (the runner's, the sandbox fleet's): the session cluster's shape and a finder for a Ray session's processes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from agentrl.runner.cluster import RayRuntime

RAY_HOST_A = "host_a"
RAY_HOST_B = "host_b"
RAY_OBJECT_STORE = 100 * 1024 * 1024
RAY_FAKE_GPUS = 8  # declared on each node so GPU plans can be placed; no CUDA device is touched
RAY_FAKE_NPUS = 8  # declared on host_b (Ray's NPU accelerator: ids and ASCEND_RT_VISIBLE_DEVICES, no device)
RAY_SANDBOX = "sandbox"  # declared on host_b: the resource that marks a sandbox fleet's nodes
# a node is declared dead after 3 failed health checks 1 s apart (Ray's defaults: 5, 3 s apart): the fleet's
# node-loss test removes a node and waits for its executors' calls to fail
RAY_HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@dataclass
class RayTwoHosts:
    runtime: RayRuntime
    cluster: Any  # ray.cluster_utils.Cluster
    temp_dir: Path
    node_of: dict[str, str]  # host resource -> node id
    start_s: float


def ray_processes(marker: str) -> list[psutil.Process]:
    """Live processes whose command line names ``marker`` (a Ray session's temp folder)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or ()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found
