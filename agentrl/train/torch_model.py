"""Preparing a Hugging Face model for the torch backend: dtype, packed attention, activation
checkpointing, the switchable output head, sharding, and what the optimizer updates.

:func:`prepare_model` applies, in order (each step composes with the next):

1. the dtype the model is *held* in: the compute dtype, except a sharded low-precision model with
   master weights, which is held in float32 (FSDP gathers it in the compute dtype);
2. the LoRA adapter when ``config.lora`` is set (:func:`~agentrl.train.lora.attach_lora`: peft
   layers injected in place, the base frozen);
3. packed attention (:func:`~agentrl.train.attention.use_packed_attention`; ``"auto"`` keeps the
   model's own attention when the model cannot take it, an explicit kernel raises);
4. activation checkpointing (:mod:`agentrl.train.recompute`);
5. the output head switch (:class:`~agentrl.train.lm_head.HeadSwitch`) when the fused head is on
   or automatic and the head is a bias-free linear layer;
6. FSDP2 sharding (:mod:`agentrl.train.sharding`).

:func:`update_parameters` builds the optimizer's parameters: the model's own, or float32
:class:`~agentrl.train.precision.MasterWeights` of an unsharded low-precision model (not for a LoRA
adapter, which peft keeps in float32 already).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import torch

from agentrl.train.attention import use_packed_attention
from agentrl.train.config import TorchBackendConfig
from agentrl.train.lm_head import HeadSwitch
from agentrl.train.lora import LoraAdapter, attach_lora
from agentrl.train.precision import MasterWeights, pure_precision_warning
from agentrl.train.recompute import apply_activation_checkpointing
from agentrl.train.sharding import shard_model

__all__ = ["PreparedModel", "prepare_model", "update_parameters"]

log = logging.getLogger(__name__)


@dataclass
class PreparedModel:
    """A model ready for the backend: ``attention`` is the kernel in use (``"model"``: its own),
    ``head`` the output-head switch (None: the model's logits only), ``adapter`` the LoRA adapter
    (None: the model itself trains)."""

    model: torch.nn.Module
    attention: str
    head: HeadSwitch | None
    adapter: LoraAdapter | None = None


def held_dtype(config: TorchBackendConfig, sharded: bool) -> torch.dtype:
    """The dtype the trainable model's parameters are stored in."""
    if sharded and config.uses_master_weights:
        return torch.float32
    return config.torch_dtype


def _attention(model: torch.nn.Module, kernel: str) -> str:
    if kernel == "model":
        return "model"
    try:
        return use_packed_attention(model, kernel)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        if kernel != "auto":
            raise
        log.info("attention='auto': keeping the model's own attention (%s)", exc)
        return "model"


def _head(model: torch.nn.Module, fused: bool | None) -> HeadSwitch | None:
    if fused is False:
        return None
    try:
        return HeadSwitch(model)
    except ValueError:
        if fused:
            raise
        return None


def prepare_model(model: torch.nn.Module, config: TorchBackendConfig, device: torch.device, *, sharded: bool,
                  trainable: bool) -> PreparedModel:
    """Apply the steps of the module doc to ``model`` (in place) and return it prepared. A frozen
    (reference) model is held in the compute dtype and never checkpointed."""
    dtype = held_dtype(config, sharded) if trainable else config.torch_dtype
    # Eval mode for good: dropout would make the training forward differ from the scoring forward,
    # so the PPO ratio would not be 1 on-policy. Gradients flow the same in eval mode.
    if any(p.device != device or (p.is_floating_point() and p.dtype != dtype) for p in model.parameters()):
        model = model.to(device=device, dtype=dtype)  # (a fake-tensor model already in place cannot be moved)
    model = model.eval()
    if not trainable:
        model.requires_grad_(False)
    adapter = attach_lora(model, config.lora, seed=config.seed) if trainable and config.lora is not None else None
    attention = _attention(model, config.attention)
    if trainable:
        apply_activation_checkpointing(model, config.activation_checkpointing)
    head = _head(model, config.fused_lm_head)
    if sharded:
        compute = config.torch_dtype if dtype != config.torch_dtype else None
        # On a CPU trainer everything is in host memory already: offloading means nothing there.
        offload = config.optimizer_offload and trainable and device.type != "cpu"
        shard_model(model, compute_dtype=compute, device=device, offload=offload)
    return PreparedModel(model=model, attention=attention, head=head, adapter=adapter)


def update_parameters(model: torch.nn.Module, config: TorchBackendConfig, *, sharded: bool
                      ) -> tuple[list[torch.Tensor], MasterWeights | None]:
    """What the optimizer steps: float32 master weights of an unsharded low-precision model (on the
    host with ``optimizer_offload``), else the model's trainable parameters. Warns for pure low
    precision (``master_weights="none"``), naming the smallest update the weights can take."""
    if config.dtype in ("bfloat16", "float16") and config.master_weights == "none":
        warnings.warn(pure_precision_warning(config.torch_dtype, config.optimizer.lr), stacklevel=3)
    trainable: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    if config.uses_master_weights and not sharded and any(p.dtype != torch.float32 for p in trainable):
        device = torch.device("cpu") if config.optimizer_offload else None  # (a no-op on a CPU trainer)
        masters = MasterWeights(model.named_parameters(), device=device)
        return masters.params, masters
    return trainable, None
