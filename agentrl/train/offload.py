"""Giving a colocated device back between steps: the trainer's optimizer state to host memory, its
gradients freed, and back before the next step.

Colocated, an engine and a trainer rank share one accelerator: while the engine generates, the
trainer keeps only its weights there (the probe and the weight export still need them); its
optimizer state (Adam's two moments: 8 bytes per parameter in fp32, more than the bf16 weights
themselves) and its float32 master weights (``extra``: 4 bytes per parameter) wait in pinned host
memory, and its gradients are released. :func:`offload` and :func:`onload` move every tensor of the
optimizer's state (for Megatron's optimizer wrappers, the torch optimizers inside them; sharded
FSDP state moves its local shards) and return what moved. On a CPU trainer both are no-ops.

Example::

    moved = offload(backend.model.parameters(), backend.optimizer, backend.device)  # before engines resume
    onload(backend.optimizer, backend.device)                            # before the next train step
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import ModuleType

import torch

from agentrl.train.device import device_module

__all__ = ["OffloadReport", "offload", "onload", "torch_optimizers"]

OffloadReport = dict[str, float]


def torch_optimizers(optimizer: object) -> Iterator[torch.optim.Optimizer]:
    """The torch optimizers that hold state: ``optimizer`` itself, or those inside a wrapper
    (Megatron's ``.optimizer``, a chained optimizer's ``.chained_optimizers``)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        yield optimizer
        return
    for inner in getattr(optimizer, "chained_optimizers", None) or ():
        yield from torch_optimizers(inner)
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and inner is not optimizer:
        yield from torch_optimizers(inner)


def _moved(value: torch.Tensor, target: torch.device, pin: bool) -> torch.Tensor:
    copy = value.to(target, non_blocking=True)
    if pin and target.type == "cpu" and not hasattr(copy, "to_local"):  # a DTensor's shard cannot be pinned
        copy = copy.pin_memory()
    return copy


def _nbytes(value: torch.Tensor) -> int:
    local = value.to_local() if hasattr(value, "to_local") else value
    return int(local.numel() * local.element_size())


def _move_state(optimizer: object, target: torch.device, *, pin: bool, extra: Iterable[torch.Tensor] = ()) -> int:
    moved = 0
    for opt in torch_optimizers(optimizer):
        for state in opt.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device != target:
                    state[key] = _moved(value, target, pin)
                    moved += _nbytes(value)
    for tensor in extra:  # optimizer parameters that are not the model's (master weights): in place
        if tensor.device != target:
            tensor.data = _moved(tensor.data, target, pin)
            moved += _nbytes(tensor)
    return moved


def offload(params: Iterable[torch.nn.Parameter], optimizer: object, device: torch.device, *,
            extra: Iterable[torch.Tensor] = ()) -> OffloadReport:
    """Frees the gradients of ``params`` and moves the optimizer state and the ``extra`` tensors (the
    master weights) to host memory (pinned); empties the device's cache. Returns bytes moved and the
    device's allocated/reserved bytes before and after."""
    module = device_module(device)
    if module is None:
        return {"offload/bytes": 0.0}
    before = _memory(module)
    for param in params:
        param.grad = None
    moved = _move_state(optimizer, torch.device("cpu"), pin=True, extra=extra)
    module.synchronize()
    module.empty_cache()
    after = _memory(module)
    return {"offload/bytes": float(moved), **{f"offload/{k}_before": v for k, v in before.items()},
            **{f"offload/{k}_after": v for k, v in after.items()}}


def onload(optimizer: object, device: torch.device, *, extra: Iterable[torch.Tensor] = ()) -> OffloadReport:
    """Moves the optimizer state and the ``extra`` tensors back to ``device`` (a no-op on CPU);
    returns the bytes moved."""
    module = device_module(device)
    if module is None:
        return {"onload/bytes": 0.0}
    moved = _move_state(optimizer, device, pin=False, extra=extra)
    module.synchronize()
    return {"onload/bytes": float(moved)}


def _memory(module: ModuleType) -> dict[str, float]:
    return {"allocated": float(module.memory_allocated()), "reserved": float(module.memory_reserved())}
