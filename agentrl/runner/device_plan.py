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
import re
import shutil
import subprocess
from typing import TYPE_CHECKING

from agentrl.model_folder import model_parameter_count
from agentrl.runner.devices import GIB, DeviceMap, NodeDevices
from agentrl.runner.placement import ACCELERATOR_RESOURCES, PlacementPlan

if TYPE_CHECKING:
    from agentrl.runner.config import RunConfig

__all__ = ["cluster_nodes", "local_accelerators", "local_memory_bytes", "planned_device_map", "trainer_resident_bytes"]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def trainer_resident_bytes(config: RunConfig) -> int | None:
    """A trainer rank's weights in ``train.dtype`` (``None`` when the folder's parameters cannot be counted)."""
    params = model_parameter_count(config.model.path)
    if params is None:
        return None
    return params * _DTYPE_BYTES.get(str(config.train.dtype), 4)


def local_accelerators(accelerator: str) -> list[str]:
    """The accelerator ids visible on this machine, without importing torch: the visible-devices
    variable when set, else ``nvidia-smi -L`` (GPUs) or ``npu-smi info -l`` (NPUs); ``[]`` when none
    can be found."""
    var = {"gpu": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}.get(accelerator)
    if var is None:
        return []
    visible = os.environ.get(var)
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    tool, args, pattern = (("nvidia-smi", ["-L"], r"^GPU (\d+):") if accelerator == "gpu"
                           else ("npu-smi", ["info", "-l"], r"NPU ID\s*:\s*(\d+)"))
    if shutil.which(tool) is None:
        return []
    try:
        out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return re.findall(pattern, out, flags=re.MULTILINE)


def local_memory_bytes() -> int | None:
    """The smallest total memory of this machine's GPUs (``nvidia-smi``), ``None`` when unknown."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        sizes = [int(float(line)) for line in out.split() if line.strip()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(sizes) * (1 << 20) if sizes else None  # MiB


def cluster_nodes(config: RunConfig, *, from_config: bool = False) -> tuple[list[NodeDevices], str]:
    """The nodes the run would use and where that came from: ``"ray cluster"`` (``cluster.ray_address``),
    ``"this machine"`` (its visible accelerators) or ``"config"`` (``num_accelerators``, or what the plan
    needs, split by ``accelerators_per_node``; always with ``from_config``). Each accelerator's memory
    is ``cluster.accelerator_memory_gib``, else read on this machine (``nvidia-smi``), else unknown."""
    cluster = config.cluster
    memory_bytes = int(cluster.accelerator_memory_gib * GIB) if cluster.accelerator_memory_gib is not None else None
    resource = ACCELERATOR_RESOURCES[cluster.accelerator]
    if not from_config and cluster.ray_address is not None:
        return _ray_nodes(cluster.ray_address, resource, memory_bytes), "ray cluster"
    local = [] if from_config else local_accelerators(cluster.accelerator)
    if local and cluster.accelerators_per_node is None:
        return [NodeDevices("node-0", tuple(local), memory_bytes or local_memory_bytes())], "this machine"
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
