"""A run config's device map: the nodes it would run on, and how much of a shared device the trainer
keeps resident (:mod:`agentrl.runner.devices` holds the rules; this module reads the config, the
model folder and the cluster for it).

- :func:`trainer_resident_bytes`: what a trainer rank keeps on its device while colocated engines
  generate — the memory planner's resident figure (its weights in the compute dtype, the float32
  shards of a sharded model, a reference model; gradients, optimizer state and master weights are
  offloaded between steps), else its weights in ``train.dtype`` counted from the safetensors headers.
- :func:`memory_plan`: the planner's figures per device (:mod:`agentrl.train.memory_plan`) for the
  run's model, layout, precision, checkpointing and micro-batch size, the table the dry run prints
  and the problems it refuses (a trainer rank or an engine over the device's capacity, dense
  attention that would build ``[S, S]`` scores on an accelerator).
- :func:`cluster_nodes`: the nodes of ``cluster.ray_address`` (each node's accelerators as Ray
  reports them) or, without one, this machine: its visible accelerators (``nvidia-smi``; no torch
  import), else ``cluster.num_accelerators`` split by ``cluster.accelerators_per_node``.
- :func:`planned_device_map`: the map ``agentrl train --dry-run`` prints.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.model_folder import model_parameter_count
from agentrl.runner.devices import GIB, RESERVE_FRACTION, RESERVE_MIN_BYTES, DeviceMap, NodeDevices
from agentrl.runner.placement import ACCELERATOR_RESOURCES, PlacementPlan
from agentrl.train.memory_plan import (
    ModelShape,
    TrainerMemory,
    TrainerSetup,
    UnmodelledModel,
    engine_adapter_bytes,
    engine_kv_tokens,
    engine_weight_bytes,
    plan_trainer_memory,
)

if TYPE_CHECKING:
    from agentrl.runner.config import RunConfig

__all__ = ["MemoryPlan", "cluster_nodes", "local_accelerators", "local_memory_bytes", "memory_plan",
           "planned_device_map", "trainer_resident_bytes", "trainer_setup"]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8}
DENSE_SCORES_LIMIT = 256 << 20
"""Dense attention on an accelerator is refused when its ``[S, S]`` tensors would exceed this (per layer)."""


def _model_shape(config: RunConfig) -> ModelShape:
    """The model folder's shape (:class:`UnmodelledModel` when it cannot be read or modelled)."""
    try:
        meta = json.loads((Path(config.model.path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UnmodelledModel(f"model.path={config.model.path!r}: no readable config.json ({type(exc).__name__})") from None
    if not isinstance(meta, dict):
        raise UnmodelledModel(f"model.path={config.model.path!r}: config.json is not an object")
    return ModelShape.from_config(meta)


def _teacher_shape(config: RunConfig) -> ModelShape | None:
    """The shape of a distillation teacher with a folder of its own (``None``: none; unreadable raises
    :class:`UnmodelledModel`)."""
    teacher = config.teacher
    if teacher is None or teacher.path is None:
        return None
    try:
        meta = json.loads((Path(teacher.path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UnmodelledModel(f"teacher.path={teacher.path!r}: no readable config.json ({type(exc).__name__})") from None
    return ModelShape.from_config(meta)


def trainer_setup(config: RunConfig) -> TrainerSetup:
    """What the planner needs of the run's train section (and the KL loss's reference model, and a
    distillation teacher the trainer holds)."""
    train, accel = config.train, config.cluster.accelerator
    # a LoRA run replicates its frozen base: ``sharding="auto"`` means no sharding then
    sharded = train.backend == "torch" and train.lora is None and (
        train.sharding == "fsdp" or (train.sharding == "auto" and train.data_parallel_size > 1))
    return TrainerSetup(
        backend=train.backend, dtype=train.dtype, master_weights=train.master_weights == "float32",
        data_parallel=train.data_parallel_size, tensor_parallel=train.tensor_parallel_size,
        pipeline_parallel=train.pipeline_parallel_size, sharded=sharded, distributed_optimizer=accel != "cpu",
        optimizer_offload=train.optimizer_offload, activation_checkpointing=train.activation_checkpointing,
        micro_batch_tokens=train.max_tokens_per_micro_batch,
        attention="dense" if train.attention in ("model", "dense") else "packed",
        kernel_copies_output=accel == "cpu", fused_lm_head=train.fused_lm_head is not False,
        logprob_chunk_size=train.logprob_chunk_size,
        reference_model=config.algorithm.kl_coef > 0 and train.lora is None,  # LoRA: the base, adapter disabled
        fused_optimizer=accel == "gpu" and not sharded, lora=train.lora,
        teacher_params=_teacher_params(config), expert_parallel=train.expert_parallel_size)


def _teacher_params(config: RunConfig) -> int:
    if config.teacher is None or not config.teacher.on_trainer:
        return 0
    shape = _teacher_shape(config)
    return shape.params if shape is not None else 0


def trainer_resident_bytes(config: RunConfig) -> int | None:
    """What a trainer rank keeps on its device while colocated engines generate: the planner's resident
    figure, else (a model the planner does not model) its weights in ``train.dtype`` counted from the
    safetensors headers; ``None`` when neither can be read."""
    try:
        return plan_trainer_memory(_model_shape(config), trainer_setup(config)).resident
    except UnmodelledModel:
        pass
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


@dataclass
class MemoryPlan:
    """The planner's figures for a run, per device: ``trainer`` (None when ``unmodelled`` says why),
    ``engine_weights``, ``engine_adapters`` (a LoRA run's adapter slots) and ``engine_kv_tokens`` per
    engine rank (None: the fraction is SGLang's
    choice), against ``capacity`` (bytes of one accelerator; None: unknown)."""

    config: RunConfig
    trainer: TrainerMemory | None
    capacity: int | None
    engine_weights: int | None = None
    engine_adapters: int = 0
    engine_kv_tokens: int | None = None
    engine_fraction: float | None = None
    teacher_weights: int | None = None  # a distillation teacher's own engines: one rank's weights
    teacher_kv_tokens: int | None = None
    unmodelled: str | None = None
    problems: list[str] = field(default_factory=list)

    def format(self) -> list[str]:
        """The dry run's table, one line per item."""
        if self.trainer is None:
            return [f"not planned: {self.unmodelled}"]
        train, t = self.config.train, self.trainer
        cap = f"{self.capacity / GIB:.1f} GiB" if self.capacity else "unknown capacity"
        setup = trainer_setup(self.config)
        precision = train.dtype + (" + float32 master weights" if setup.uses_masters else "")
        if setup.lora is not None:
            precision = (f"{train.dtype} frozen base + LoRA rank {setup.lora.rank}, {t.adapter_params / 1e6:.1f}M "
                         f"float{8 * setup.adapter_bytes} parameters")
        shard = (f", FSDP over {setup.data_parallel}" if setup.sharded else f", distributed optimizer over "
                 f"{setup.data_parallel}" if setup.backend == "megatron" and setup.distributed_optimizer else "")
        if setup.expert_parallel > 1:
            shard += f", experts over {setup.expert_parallel}"
        g = {k: v / GIB for k, v in t.terms.items()}
        acts = t.activations_by_mode
        weights = f"{g['weights']:.1f} GiB"
        if setup.lora is not None:
            adapter = t.adapter_params * setup.adapter_bytes / GIB
            weights += f" (frozen base {g['weights'] - adapter:.1f}, adapter {adapter:.1f})"
        lines = [f"trainer rank ({train.backend}, {precision}{shard}): weights {weights}, gradients "
                 f"{g['gradients']:.1f}, master weights {g['master weights']:.1f}, optimizer state "
                 f"{g['optimizer state']:.1f}" + (f", reference {g['reference weights']:.1f}"
                                                  if t.terms["reference weights"] else "")
                 + (f", teacher {g['teacher weights']:.1f}" if t.terms["teacher weights"] else ""),
                 f"  activations at {train.max_tokens_per_micro_batch} tokens {g['activations']:.1f} GiB "
                 f"(checkpointing {train.activation_checkpointing}; full {acts['full'] / GIB:.1f}, selective "
                 f"{acts['selective'] / GIB:.1f}, none {acts['none'] / GIB:.1f}), recomputed layer "
                 f"{g['recomputed layer']:.1f}, logits working set {g['logits working set']:.1f}"
                 + (f", attention scores {g['attention scores']:.1f}" if t.terms["attention scores"] else "")
                 + (f", routing {t.terms['routing'] / (1 << 20):.1f} MiB" if t.terms["routing"] else ""),
                 f"  peak ~{t.peak / GIB:.1f} GiB of {cap}; resident between steps {t.resident / GIB:.1f} GiB"
                 + "".join(f"; {n}" for n in t.notes)]
        if self.engine_weights is not None:
            kv = (f"KV cache {self.engine_kv_tokens:,} tokens at mem_fraction_static {self.engine_fraction:g}"
                  if self.engine_kv_tokens is not None else "KV cache: the rest of SGLang's static pool")
            engines, lora = self.config.rollout.engines, self.config.engine_lora()
            slots = (f", LoRA slots {self.engine_adapters / GIB:.1f} GiB ({lora.max_loras_per_batch} adapters of rank "
                     f"{lora.max_rank})" if lora is not None else "")
            lines.append(f"engine rank (tp={engines.tp_size}, {self.config.model.dtype}): weights "
                         f"{self.engine_weights / GIB:.1f} GiB{slots}, {kv}")
        teacher = self.config.teacher
        if self.teacher_weights is not None and teacher is not None:
            kv = (f"KV cache {self.teacher_kv_tokens:,} tokens at mem_fraction_static "
                  f"{teacher.engines.mem_fraction_static:g}" if self.teacher_kv_tokens is not None
                  else "KV cache: the rest of SGLang's static pool")
            lines.append(f"teacher engine rank (tp={teacher.engines.tp_size}, {self.config.model.dtype}): weights "
                         f"{self.teacher_weights / GIB:.1f} GiB, {kv}; on devices of its own")
        return lines


_ADVICE = {
    "optimizer state": "shard it: train.sharding='fsdp' with train.data_parallel_size > 1, or "
                       "train.optimizer_offload=true",
    "master weights": "shard them: train.sharding='fsdp' with train.data_parallel_size > 1, or "
                      "train.optimizer_offload=true",
    "gradients": "shard them: train.sharding='fsdp' with train.data_parallel_size > 1",
    "weights": "shard them: train.sharding='fsdp' with train.data_parallel_size > 1",
    "logits working set": "train.fused_lm_head=true, or a smaller train.logprob_chunk_size",
    "attention scores": "train.attention='auto' (packed attention per document, no [S, S] scores)",
    "reference weights": "algorithm.kl_coef=0 (no reference model), or more ranks to shard it",
    "teacher weights": "teacher.kind='engines' (the teacher on SGLang engines of its own)",
}
_MEGATRON_ADVICE = {
    "optimizer state": "a larger train.data_parallel_size (the distributed optimizer shards it) or "
                       "train.tensor_parallel_size",
    "master weights": "a larger train.data_parallel_size (the distributed optimizer shards them)",
    "gradients": "a larger train.tensor_parallel_size or train.pipeline_parallel_size",
    "weights": "a larger train.tensor_parallel_size or train.pipeline_parallel_size",
}


_MOE_ADVICE = ("more ranks: a larger train.data_parallel_size and train.expert_parallel_size (the experts are split "
               "over EP ranks, their optimizer state over DP / EP; tensor parallelism is not available with a "
               "mixture of experts), or larger accelerators")


def _advice(term: str, config: RunConfig, *, moe: bool = False) -> str:
    train = config.train
    if train.lora is not None and term == "weights":
        return ("larger accelerators or a smaller model (a LoRA run holds the whole frozen base on every rank; "
                "FSDP does not shard it)")
    if term in ("activations", "recomputed layer"):
        if train.activation_checkpointing != "full":
            return "train.activation_checkpointing='full'"
        return f"a smaller train.max_tokens_per_micro_batch (now {train.max_tokens_per_micro_batch})"
    if train.backend == "megatron" and moe and term in _MEGATRON_ADVICE:
        return _MOE_ADVICE
    if train.backend == "megatron" and term in _MEGATRON_ADVICE:
        return _MEGATRON_ADVICE[term]
    return _ADVICE.get(term, "a smaller model or larger accelerators")


def memory_plan(config: RunConfig, capacity: int | None, *, engine_fraction: float | None = None) -> MemoryPlan:
    """The planner's figures for ``config`` on accelerators of ``capacity`` bytes, with the problems
    that stop the run: a trainer rank whose peak exceeds the device (less the reserve the device map
    keeps for contexts and allocator slack), an engine whose weights fill its static pool, dense
    attention whose ``[S, S]`` scores exceed :data:`DENSE_SCORES_LIMIT` per layer on an accelerator."""
    engines, lora = config.rollout.engines, config.engine_lora()
    dtype_bytes = _DTYPE_BYTES.get(config.model.dtype, 2)
    try:
        shape = _model_shape(config)
        setup = trainer_setup(config)
        trainer = plan_trainer_memory(shape, setup)
        adapters = 0 if lora is None or setup.lora is None else engine_adapter_bytes(
            shape, setup.lora, slots=lora.max_loras_per_batch, dtype_bytes=dtype_bytes, tensor_parallel=engines.tp_size)
    except UnmodelledModel as exc:
        return MemoryPlan(config, None, capacity, unmodelled=str(exc))
    plan = MemoryPlan(config, trainer, capacity, engine_weights=engine_weight_bytes(shape, dtype_bytes, engines.tp_size),
                      engine_adapters=adapters, engine_fraction=engine_fraction or engines.mem_fraction_static)
    if capacity and plan.engine_fraction:
        plan.engine_kv_tokens = engine_kv_tokens(shape, capacity_bytes=capacity, mem_fraction=plan.engine_fraction,
                                                 tensor_parallel=engines.tp_size, dtype_bytes=dtype_bytes,
                                                 adapter_bytes=adapters)
    _plan_teacher_engines(config, plan, capacity, dtype_bytes)
    if config.cluster.accelerator != "cpu" and trainer.terms["attention scores"] > DENSE_SCORES_LIMIT:
        plan.problems.append(
            f"train.attention={config.train.attention!r}: dense attention at train.max_tokens_per_micro_batch="
            f"{setup.micro_batch_tokens} builds [S, S] attention tensors of {trainer.terms['attention scores'] / GIB:.1f} "
            "GiB on the accelerator; expected train.attention='auto' (packed attention per document, "
            "memory linear in the row) or a much smaller micro-batch")
    if capacity and config.cluster.accelerator != "cpu":
        usable = capacity - max(int(capacity * RESERVE_FRACTION), RESERVE_MIN_BYTES)
        if trainer.peak > usable:
            term = trainer.largest
            plan.problems.append(
                f"memory: a trainer rank needs ~{trainer.peak / GIB:.1f} GiB at its peak but an accelerator has "
                f"{capacity / GIB:.1f} GiB ({usable / GIB:.1f} usable after the reserve); the largest term is "
                f"{term} ({trainer.terms[term] / GIB:.1f} GiB): expected {_advice(term, config, moe=shape.is_moe)}")
        if plan.engine_kv_tokens == 0:
            plan.problems.append(
                f"memory: an engine rank's weights ({(plan.engine_weights or 0) / GIB:.1f} GiB"
                + (f", LoRA slots {plan.engine_adapters / GIB:.1f} GiB" if plan.engine_adapters else "")
                + ") fill its static pool "
                f"(rollout.engines.mem_fraction_static={plan.engine_fraction} of {capacity / GIB:.1f} GiB); expected "
                "a larger mem_fraction_static or rollout.engines.tp_size")
    return plan


def _plan_teacher_engines(config: RunConfig, plan: MemoryPlan, capacity: int | None, dtype_bytes: int) -> None:
    """A distillation teacher's own engines (``teacher.kind = "engines"``): one rank's weights and KV cache,
    and the problem when the weights fill the static pool."""
    teacher = config.teacher
    if teacher is None or teacher.kind != "engines":
        return
    try:
        shape = _teacher_shape(config)
    except UnmodelledModel as exc:
        plan.problems.append(str(exc))
        return
    if shape is None:
        return
    tp, fraction = teacher.engines.tp_size, teacher.engines.mem_fraction_static
    plan.teacher_weights = engine_weight_bytes(shape, dtype_bytes, tp)
    if capacity and fraction:
        plan.teacher_kv_tokens = engine_kv_tokens(shape, capacity_bytes=capacity, mem_fraction=fraction,
                                                  tensor_parallel=tp, dtype_bytes=dtype_bytes)
        if plan.teacher_kv_tokens == 0 and config.cluster.accelerator != "cpu":
            plan.problems.append(
                f"memory: a teacher engine rank's weights ({plan.teacher_weights / GIB:.1f} GiB) fill its static pool "
                f"(teacher.engines.mem_fraction_static={fraction} of {capacity / GIB:.1f} GiB); expected a larger "
                "mem_fraction_static or teacher.engines.tp_size")
