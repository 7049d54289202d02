"""Sharded data parallelism for the torch backend: PyTorch's FSDP2 (``fully_shard``).

With ``d`` data-parallel ranks each rank keeps ``1/d`` of the parameters, their gradients and the
optimizer state; a decoder layer's full parameters exist only while that layer runs (gathered in
the compute dtype) and its gradients are reduce-scattered in float32 as soon as they are complete.
For a bfloat16 model with float32 master weights the model is held in float32 (the masters) and
:class:`~torch.distributed.fsdp.MixedPrecisionPolicy` gathers it in bfloat16: per rank
``16/d`` bytes per parameter plus the layers in flight, against 18 unsharded.

Gradients are **summed** over ranks (the divide factor is 1): the backend's micro-batch losses are
already divided by the step's global counts, as in the unsharded path. Runs on CUDA (NCCL), Ascend
(HCCL) and CPU (gloo, for tests). ``offload=True`` keeps parameters, gradients and the optimizer
step on the host (``CPUOffloadPolicy``).

Every rank must run the same forward and backward calls (each gathers parameters collectively):
the backend gives ranks with fewer micro-batches padding rows.

Example::

    shard_model(model, compute_dtype=torch.bfloat16, device=torch.device("cuda", rank))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)          # over the local shards
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from agentrl.train.recompute import decoder_layers

__all__ = ["full_model_state", "full_optimizer_state", "is_sharded", "load_full_state", "reshard", "shard_model",
           "sharded_named_weights"]


def shard_model(model: torch.nn.Module, *, compute_dtype: torch.dtype | None, device: torch.device,
                offload: bool = False) -> None:
    """``fully_shard`` each decoder layer, then the whole model, over all ranks of the default process
    group; parameters are gathered in ``compute_dtype`` (``None``: their own dtype) and gradients
    reduced in float32 (float64 models: float64), summed."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if not dist.is_initialized():
        raise ValueError("sharding='fsdp': torch.distributed is not initialised; start the ranks first "
                         "(or use sharding='none' in a single process)")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    param_dtype = next(model.parameters()).dtype
    reduce_dtype = torch.float64 if param_dtype == torch.float64 else torch.float32
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype)
    offload_policy: OffloadPolicy = CPUOffloadPolicy() if offload else OffloadPolicy()
    units: list[Any] = []
    for layer in decoder_layers(model):
        units.append(fully_shard(layer, mesh=mesh, mp_policy=policy, offload_policy=offload_policy))
    units.append(fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=offload_policy))
    for unit in units:  # a plain sum, as all_reduce_gradients does (gloo has no pre-multiplied sum)
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)


def reshard(model: torch.nn.Module) -> None:
    """Free every gathered parameter (the root keeps its own gathered after a forward without
    backward, e.g. a scoring pass) so that state is read and written in shards."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded by :func:`shard_model` (its parameters are DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def sharded_named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` of every state entry, gathered on every rank (a collective: all ranks
    iterate to the end, in step). Memory: one full tensor at a time."""
    from torch.distributed.tensor import DTensor

    reshard(model)
    for name, tensor in model.state_dict().items():
        yield name, (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()


def full_model_state(model: torch.nn.Module) -> dict[str, Any]:
    """The full (unsharded) model state on the host, on rank 0 (empty elsewhere); collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    reshard(model)
    state: dict[str, Any] = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The full optimizer state (keyed by parameter name) on the host, on rank 0; collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state: dict[str, Any] = get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state


def load_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any],
                    optimizer_state: dict[str, Any]) -> None:
    """Load full states (as :func:`full_model_state` / :func:`full_optimizer_state` wrote them, read
    by every rank) into the sharded model and optimizer; collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    reshard(model)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)  # rank 0's copy is scattered
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
