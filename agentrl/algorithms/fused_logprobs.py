"""Token log-probs straight from hidden states and the output projection, never building logits.

A causal LM's logits are ``hidden @ W.T`` (``W``: the ``[vocab, hidden]`` output embedding). For a
151,936-word vocabulary the ``[tokens, vocab]`` logits and their gradient are the largest tensors
of a training step. :func:`logprobs_from_hidden` computes ``log softmax(hidden @ W.T / T)`` at the
target ids ``chunk_size`` rows at a time, and its backward pass recomputes each chunk's logits to
produce the gradients of ``hidden`` and ``W`` directly: peak extra memory is a few
``[chunk_size, vocab]`` buffers plus one float32 ``[vocab, hidden]`` gradient accumulator.

Matrix products run in the dtype of ``W`` (``hidden`` is cast to it); the softmax is float32
(float64 for float64 inputs). Autocast is disabled inside, so results do not depend on the caller's
autocast state. Only plain projections are supported: no bias, no logit soft-capping or scaling
(the torch backend checks a model against its own logits before using this path).

Example::

    lp = logprobs_from_hidden(hidden_NH, lm_head.weight, targets_N, temperature=0.7)
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algorithms.logprobs import (
    DEFAULT_CHUNK_SIZE,
    _check_scalars,
    _checked_targets,
    _entropy_and_lse,
    _logprob_grad_,
    _picked_and_lse,
)
from agentrl.algorithms.logprobs import _compute_dtype as _float

__all__ = ["entropy_from_hidden", "logprobs_from_hidden"]


def _no_autocast(device: torch.device) -> Any:
    return torch.autocast(device_type=device.type, enabled=False)


class _FusedLinearLogprob(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
        chunk_size: int,
    ) -> torch.Tensor:
        dtype = _float(weight.dtype)
        n = hidden.shape[0]
        out = torch.empty(n, dtype=dtype, device=hidden.device)
        lse = torch.empty(n, dtype=dtype, device=hidden.device)
        with _no_autocast(hidden.device):
            for start in range(0, n, chunk_size):
                stop = min(start + chunk_size, n)
                z = (hidden[start:stop].to(weight.dtype) @ weight.T).to(dtype).div_(temperature)
                picked, lse_c = _picked_and_lse(z, targets[start:stop])
                lse[start:stop] = lse_c
                out[start:stop] = picked - lse_c
                del z
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors
        temperature: float = ctx.temperature
        chunk_size: int = ctx.chunk_size
        dtype = lse.dtype
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if want_w else None
        with _no_autocast(hidden.device):
            for start in range(0, hidden.shape[0], chunk_size):
                stop = min(start + chunk_size, hidden.shape[0])
                h = hidden[start:stop].to(weight.dtype)
                g = grad_out[start:stop].to(dtype) / temperature
                # The gradient with respect to the logits h W^T, built in the logits' buffer.
                p = _logprob_grad_((h @ weight.T).to(dtype).div_(temperature), lse[start:stop], targets[start:stop], g)
                if grad_h is not None:
                    grad_h[start:stop] = (p.to(weight.dtype) @ weight).to(grad_h.dtype)
                if grad_w is not None:
                    grad_w.addmm_(p.T, h.to(dtype))
                del p
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None, None


def _check(hidden: torch.Tensor, weight: torch.Tensor, temperature: float, chunk_size: int) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden/weight: expected [tokens, hidden] and [vocab, hidden] with the same hidden size, "
            f"got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    _check_scalars(temperature, chunk_size)


def logprobs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """``log softmax(hidden @ weight.T / T)[i, targets[i]]`` per row, shape ``[tokens]``.

    Differentiable with respect to ``hidden`` and ``weight``; equal (to float rounding) to
    :func:`logprobs_from_logits` applied to ``hidden @ weight.T``.
    """
    _check(hidden, weight, temperature, chunk_size)
    targets = _checked_targets(targets, hidden, weight.shape[0], "the rows of weight")
    out: torch.Tensor = _FusedLinearLogprob.apply(hidden, weight, targets, float(temperature), int(chunk_size))
    return out


def entropy_from_hidden(
    hidden: torch.Tensor, weight: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """Entropy of ``softmax(hidden @ weight.T / T)`` per row, for metrics: computed without
    gradient (the result is detached)."""
    _check(hidden, weight, temperature, chunk_size)
    dtype = _float(weight.dtype)
    out = torch.empty(hidden.shape[0], dtype=dtype, device=hidden.device)
    with torch.no_grad(), _no_autocast(hidden.device):
        for start in range(0, hidden.shape[0], chunk_size):
            stop = min(start + chunk_size, hidden.shape[0])
            z = (hidden[start:stop].to(weight.dtype) @ weight.T).to(dtype).div_(temperature)
            out[start:stop] = _entropy_and_lse(z)[0]
            del z
    return out
