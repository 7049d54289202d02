"""A run config's device map: the nodes it would run on, and how much of a shared device the trainer
keeps resident (:mod:`agentrl.runner.devices` holds the rules; this module reads the config, the
model folder and the cluster for it).

- :func:`trainer_resident_bytes`: what a trainer rank keeps on its device while colocated engines
  generate — its weights in ``train.dtype`` (parameters counted from the model folder's safetensors
  headers; gradients and optimizer state are offloaded between steps).
- :func:`cluster_nodes`: the nodes of ``cluster.ray_address`` (each node's accelerators as Ray
  reports them) or, without one, this machine: its visible accelerators (``nvidia-smi``; no torch
  import), else ``cluster.num_accelerators`` split by ``cluster.accelerators_per_node``.
- :func:`planned_device_map`: the map ``agentrl train --dry-run`` prints.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
from typing import TYPE_CHECKING

from agentrl.model_folder import model_parameter_count
from agentrl.runner.devices import GIB, DeviceMap, NodeDevices
from agentrl.runner.placement import ACCELERATOR_RESOURCES, PlacementPlan

if TYPE_CHECKING:
    from agentrl.runner.config import RunConfig

__all__ = ["cluster_nodes", "local_accelerators", "planned_device_map", "trainer_resident_bytes"]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def trainer_resident_bytes(config: RunConfig) -> int | None:
    """A trainer rank's weights in ``train.dtype`` (``None`` when the folder's parameters cannot be counted)."""
    params = model_parameter_count(config.model.path)
    if params is None:
        return None
    return params * _DTYPE_BYTES.get(str(config.train.dtype), 4)


def local_accelerators(accelerator: str) -> list[str]:
    """The accelerator ids visible on this machine, without importing torch: the visible-devices
    variable when set, else ``nvidia-smi -L`` (GPUs); ``[]`` when none can be found."""
    var = {"gpu": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}.get(accelerator)
    if var is None:
        return []
    visible = os.environ.get(var)
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    if accelerator != "gpu" or shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU"))]


def cluster_nodes(config: RunConfig, *, memory_bytes: int | None = None) -> tuple[list[NodeDevices], str]:
    """The nodes the run would use and where that came from (``"ray cluster"``, ``"this machine"``,
    ``"config"``). ``memory_bytes``: each accelerator's memory (default ``cluster.accelerator_memory_gib``)."""
    cluster = config.cluster
    if memory_bytes is None and cluster.accelerator_memory_gib is not None:
        memory_bytes = int(cluster.accelerator_memory_gib * GIB)
    resource = ACCELERATOR_RESOURCES[cluster.accelerator]
    if cluster.ray_address is not None:
        return _ray_nodes(cluster.ray_address, resource, memory_bytes), "ray cluster"
    local = local_accelerators(cluster.accelerator)
    if local and cluster.accelerators_per_node is None:
        return [NodeDevices("node-0", tuple(local), memory_bytes)], "this machine"
    total = cluster.num_accelerators or PlacementPlan.for_run(config).accelerators_needed
    per_node = cluster.accelerators_per_node or max(total, 1)
    nodes = [NodeDevices(f"node-{i}", tuple(str(d) for d in range(min(per_node, total - i * per_node))), memory_bytes)
             for i in range(max(1, math.ceil(total / per_node)))]
    return nodes, "config"


def _ray_nodes(address: str, resource: str | None, memory_bytes: int | None) -> list[NodeDevices]:
    import ray

    connected = ray.is_initialized()
    if not connected:
        ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        return [NodeDevices(str(n["NodeID"]), tuple(str(i) for i in range(int(n["Resources"].get(resource, 0))))
                            if resource else (), memory_bytes) for n in nodes]
    finally:
        if not connected:
            ray.shutdown()


def planned_device_map(config: RunConfig, nodes: list[NodeDevices]) -> DeviceMap:
    """The device map of ``config`` on ``nodes`` (see :meth:`DeviceMap.planned_for`); raises
    :class:`~agentrl.runner.devices.PlacementMapError` for a plan they cannot hold."""
    plan = PlacementPlan.for_run(config)
    resident = trainer_resident_bytes(config) if config.cluster.placement == "colocated" else None
    return DeviceMap.planned_for(plan, nodes, trainer_resident_bytes=resident,
                                 engine_fraction=config.rollout.engines.mem_fraction_static)
