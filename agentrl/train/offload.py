"""Giving a colocated device back between steps: the trainer's optimizer state to host memory, its
gradients freed, and back before the next step.

Colocated, an engine and a trainer rank share one accelerator: while the engine generates, the
trainer keeps only its weights there (the probe and the weight export still need them); its
optimizer state (Adam's two moments: 8 bytes per parameter in fp32, more than the bf16 weights
themselves) waits in pinned host memory, and its gradients are released. :func:`offload` and
:func:`onload` move every tensor of the optimizer's state (for Megatron's optimizer wrappers, the
torch optimizers inside them) and return what moved. On a CPU trainer both are no-ops.

Example::

    moved = offload(backend.model.parameters(), backend.optimizer, backend.device)  # before engines resume
    onload(backend.optimizer, backend.device)                            # before the next train step
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from agentrl.train.device import device_module

__all__ = ["OffloadReport", "offload", "onload", "torch_optimizers"]

OffloadReport = dict[str, float]


def torch_optimizers(optimizer: Any) -> Iterator[torch.optim.Optimizer]:
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


def _move_state(optimizer: Any, target: torch.device, *, pin: bool) -> int:
    moved = 0
    for opt in torch_optimizers(optimizer):
        for state in opt.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device != target:
                    copy = value.to(target, non_blocking=True)
                    if pin and target.type == "cpu":
                        copy = copy.pin_memory()
                    state[key] = copy
                    moved += value.numel() * value.element_size()
    return moved


def offload(params: Iterable[torch.nn.Parameter], optimizer: Any, device: torch.device) -> OffloadReport:
    """Frees the gradients of ``params`` and moves the optimizer state to host memory (pinned); empties
    the device's cache. Returns bytes moved and the device's allocated/reserved bytes before and after."""
    module = device_module(device)
    if module is None:
        return {"offload/bytes": 0.0}
    before = _memory(module)
    for param in params:
        param.grad = None
    moved = _move_state(optimizer, torch.device("cpu"), pin=True)
    module.synchronize()
    module.empty_cache()
    after = _memory(module)
    return {"offload/bytes": float(moved), **{f"offload/{k}_before": v for k, v in before.items()},
            **{f"offload/{k}_after": v for k, v in after.items()}}


def onload(optimizer: Any, device: torch.device) -> OffloadReport:
    """Moves the optimizer state back to ``device`` (a no-op on CPU); returns the bytes moved."""
    module = device_module(device)
    if module is None:
        return {"onload/bytes": 0.0}
    moved = _move_state(optimizer, device, pin=False)
    module.synchronize()
    return {"onload/bytes": float(moved)}


def _memory(module: Any) -> dict[str, float]:
    return {"allocated": float(module.memory_allocated()), "reserved": float(module.memory_reserved())}
