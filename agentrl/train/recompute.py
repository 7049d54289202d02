"""Activation checkpointing for Hugging Face decoder models: keep less of the forward pass, recompute
it in the backward pass.

A decoder layer of Qwen3-4B keeps ~190 kB per token for its backward pass (bf16, Hugging Face's
modelling: norms in float32, q/k norms, RoPE, the attention's inputs and output, SwiGLU's gate, up
and product); a 32k-token micro-batch over 36 layers is ~200 GiB. Modes
(``TorchBackendConfig.activation_checkpointing``):

- ``"full"``: each decoder layer keeps only its input (``2·hidden`` bytes per token in bf16) and
  runs its forward again when its backward starts;
- ``"selective"``: each layer's MLP keeps only its input and is recomputed; attention keeps its
  activations (~40% less memory than none, far less recomputation than full);
- ``"none"``.

Checkpointing is non-reentrant (``torch.utils.checkpoint``, ``use_reentrant=False``) and wraps the
module's ``forward`` in place (the module tree and parameter names are unchanged, so it composes
with FSDP, applied after it). Without autograd (scoring), or with a key/value cache (which the
forward updates, so it cannot run twice), the forward runs plain. Recomputation
runs the same operations on the same inputs, so gradients equal those without checkpointing: a
mixture-of-experts forward that replays the engine's routing (:mod:`agentrl.train.moe`) replays the
same routing when it is recomputed (the routing bound at forward time is restored around the
recompute).

Example::

    apply_activation_checkpointing(model, "full")
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from agentrl.train.moe import recompute_binding

__all__ = ["CHECKPOINTING_MODES", "apply_activation_checkpointing", "decoder_layers"]

CHECKPOINTING_MODES = ("none", "full", "selective")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated decoder layers: the modules whose class the model names in
    ``_no_split_modules`` (Hugging Face's convention), in order. ``ValueError`` when there are none."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"model: found no decoder layers (no module of a class in _no_split_modules={sorted(names)}); "
                         "activation checkpointing and sharding need a Hugging Face decoder model")
    return layers


def _contexts() -> tuple[contextlib.AbstractContextManager[object], contextlib.AbstractContextManager[object]]:
    """Called as a checkpointed forward starts: nothing around it, and around its recompute the
    state it ran with (the MoE routing binding)."""
    return contextlib.nullcontext(), recompute_binding()


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> object:
        # A key/value cache is updated by the forward: recomputing it would append twice.
        if not torch.is_grad_enabled() or kwargs.get("past_key_values") is not None:
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=_contexts, **kwargs)

    run.agentrl_checkpointed = True  # type: ignore[attr-defined]
    return run


def apply_activation_checkpointing(model: torch.nn.Module, mode: str) -> int:
    """Checkpoint each decoder layer (``"full"``) or each layer's ``mlp`` (``"selective"``) of
    ``model`` in place; ``"none"`` does nothing. Returns how many modules were wrapped. Applying it
    twice wraps nothing more."""
    if mode not in CHECKPOINTING_MODES:
        raise ValueError(f"activation_checkpointing: expected one of {list(CHECKPOINTING_MODES)}, got {mode!r}")
    if mode == "none":
        return 0
    wrapped = 0
    for layer in decoder_layers(model):
        target = layer if mode == "full" else getattr(layer, "mlp", None)
        if not isinstance(target, torch.nn.Module):
            raise ValueError(f"activation_checkpointing='selective': decoder layer {type(layer).__name__} has no "
                             "'mlp' submodule to recompute; use 'full'")
        if getattr(target.forward, "agentrl_checkpointed", False):
            continue
        target.forward = _checkpointed(target.forward)  # type: ignore[method-assign]
        wrapped += 1
    return wrapped
