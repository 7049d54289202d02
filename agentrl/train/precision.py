"""Mixed precision that learns: low-precision compute, float32 master weights and optimizer state.

bfloat16 keeps 8 significant bits, so round-to-nearest drops any update below half a unit in the
last place of the weight: for ``|w| = 0.02`` that is ``2^-14 ≈ 6.1e-5``, and an AdamW step at the
RL learning rate ``1e-6`` moves such a weight by about ``1e-6`` — ``bf16(0.02) + 1e-6 ==
bf16(0.02)``: most weights never move. :class:`MasterWeights` keeps a float32 copy of every
trainable parameter of a bfloat16/float16 model; gradients are accumulated into float32 as they
arrive (a hook per parameter frees the low-precision gradient at once), the optimizer steps the
float32 copies, and the model's weights are then rounded from them. Per parameter: 2 bytes of
weights, 4 of master weights, 4 of gradient and 8 of Adam moments (18 bytes; the low-precision
gradient exists one parameter at a time).

With data parallelism the torch backend shards instead (FSDP2, :mod:`agentrl.train.sharding`): the
model itself is float32 there and FSDP's mixed-precision policy gathers it in bfloat16.

:func:`smallest_update` is what pure low precision can still represent; the backend warns with it
when ``master_weights="none"`` is asked for.

Example::

    masters = MasterWeights(model.named_parameters())              # model already in bfloat16
    optimizer = torch.optim.AdamW(masters.params, lr=1e-6)
    loss.backward(); optimizer.step(); masters.copy_to_model(); masters.zero_grad()
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["MasterWeights", "pure_precision_warning", "smallest_update"]

_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}


def smallest_update(dtype: torch.dtype, magnitude: float = 0.02) -> float:
    """The smallest change a weight of ``magnitude`` stored in ``dtype`` can take: half a unit in the
    last place (anything smaller rounds back to the weight). bfloat16 at 0.02: ``2^-14 ≈ 6.1e-5``."""
    if dtype not in _MANTISSA_BITS:
        raise ValueError(f"dtype: expected a floating dtype among {sorted(map(str, _MANTISSA_BITS))}, got {dtype}")
    if magnitude <= 0:
        raise ValueError(f"magnitude: expected a positive number, got {magnitude!r}")
    exponent = math.floor(math.log2(magnitude))
    return float(2.0 ** (exponent - _MANTISSA_BITS[dtype] - 1))


def pure_precision_warning(dtype: torch.dtype, lr: float) -> str:
    """The warning for training ``dtype`` weights without master weights at learning rate ``lr``."""
    name = str(dtype).removeprefix("torch.")
    return (f"master_weights='none': the optimizer updates {name} weights directly; an update smaller than "
            f"{smallest_update(dtype):.2g} (half a unit in the last place of a weight of 0.02; {name} keeps "
            f"{_MANTISSA_BITS[dtype] + 1} significant bits) is rounded away, and AdamW moves a weight by about "
            f"lr={lr:g} per step, so most weights will not move. Use master_weights='float32' (the default) unless "
            "this is what you want")


class MasterWeights:
    """Float32 copies of a low-precision model's trainable parameters (see the module doc).

    ``params``: the master tensors, in the order of the model's parameters (give these to the
    optimizer). Gradients reaching a model parameter are added to its master's ``.grad`` (float32)
    and the model's own ``.grad`` is freed. ``device``: where the masters (and so the optimizer
    state) live; another device than the model's is the optimizer CPU offload.
    """

    def __init__(self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]], *,
                 dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> None:
        self.names: list[str] = []
        self.model_params: list[torch.nn.Parameter] = []
        self.params: list[torch.Tensor] = []
        self._master_of: dict[int, torch.Tensor] = {}
        self._hooks: list[Any] = []
        for name, param in named_parameters:
            if not param.requires_grad or id(param) in self._master_of:
                continue
            master = param.detach().to(device=device or param.device, dtype=dtype, copy=True)
            self.names.append(name)
            self.model_params.append(param)
            self.params.append(master)
            self._master_of[id(param)] = master
            self._hooks.append(param.register_post_accumulate_grad_hook(self._accumulate))

    def _accumulate(self, param: torch.Tensor) -> None:
        grad = param.grad
        if grad is None:
            return
        master = self._master_of[id(param)]
        if master.grad is None:
            master.grad = grad.to(device=master.device, dtype=master.dtype)
        elif grad.device == master.device:
            master.grad.add_(grad)  # mixed-dtype in place: no float32 copy of the gradient
        else:
            master.grad.add_(grad.to(master.device))
        param.grad = None

    def copy_to_model(self) -> None:
        """Round the masters into the model's weights (after each optimizer step)."""
        with torch.no_grad():
            for param, master in zip(self.model_params, self.params, strict=True):
                param.copy_(master.to(param.device))

    def zero_grad(self) -> None:
        for master in self.params:
            master.grad = None
        for param in self.model_params:
            param.grad = None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The masters by parameter name (what a checkpoint must hold to resume exactly)."""
        return dict(zip(self.names, self.params, strict=True))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = sorted(set(self.names) - set(state))
        if missing:
            raise ValueError(f"master weights: the checkpoint lacks {missing[:5]}")
        with torch.no_grad():
            for name, master in zip(self.names, self.params, strict=True):
                master.copy_(state[name])

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
