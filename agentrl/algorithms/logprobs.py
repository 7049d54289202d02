"""Token log-probabilities and entropy from logits, computed in row chunks.

The naive ``log_softmax(logits / T).gather(...)`` materialises a second ``[tokens, vocab]`` float32
tensor (1.2 GB for 2,048 tokens of a 151,936-word vocabulary) and autograd keeps it alive until the
backward pass. The functions here never hold more than ``chunk_size`` rows of the vocabulary at a
time, in the forward *and* the backward pass: they save only the input logits (which the model
already holds), the targets and one log-normaliser per row, and rebuild the softmax chunk by chunk
when the gradient is needed.

Conventions (see the RL-math reference, section 7):

- ``logits[i]`` scores ``targets[i]``: callers shift, so the logits of position ``t - 1`` are paired
  with the token at position ``t``.
- Temperature scaling divides the logits by ``T`` before the softmax, which is what SGLang reports
  by default (after temperature, before top-p/top-k).
- All arithmetic is float32 or wider: bfloat16 logits are upcast one chunk at a time; float64
  logits stay float64 (the tests use that for exact comparisons).

Example::

    lp = logprobs_from_logits(logits_TV, tokens_T, temperature=0.7)      # [T], differentiable
    h = entropy_from_logits(logits_TV, temperature=0.7)                  # [T]
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algorithms.kinds import DEFAULT_CHUNK_SIZE

__all__ = ["DEFAULT_CHUNK_SIZE", "entropy_from_logits", "logprobs_from_logits"]



def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_scalars(temperature: float, chunk_size: int) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature: expected a positive number, got {temperature!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive integer, got {chunk_size!r}")


def _check(logits: torch.Tensor, temperature: float, chunk_size: int) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits: expected a 2-D [tokens, vocab] tensor, got shape {tuple(logits.shape)}")
    _check_scalars(temperature, chunk_size)


def _picked_and_lse(z: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z[i, targets[i]], logsumexp(z[i]))`` for one ``[chunk, vocab]`` block of scaled logits.
    ``z`` is consumed (shifted and exponentiated in place) so the chunk needs one buffer."""
    picked = z.gather(1, targets[:, None]).squeeze(1)
    row_max = z.amax(dim=-1, keepdim=True)
    lse = row_max.squeeze(1) + z.sub_(row_max).exp_().sum(dim=-1).log()
    return picked, lse


def _entropy_and_lse(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(entropy, logsumexp)`` per row of one ``[chunk, vocab]`` block of scaled logits. With
    ``s = z - max(z)`` and ``e = exp(s)``: ``H = log Σe - Σ e·s / Σe``. ``z`` is consumed (shifted in
    place) and ``e`` is the only other buffer."""
    row_max = z.amax(dim=-1, keepdim=True)
    s = z.sub_(row_max)
    e = torch.exp(s)
    total = e.sum(dim=-1)
    log_total = total.log()
    return log_total - e.mul_(s).sum(dim=-1) / total, row_max.squeeze(1) + log_total


def _logprob_grad_(z: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Turn one chunk of scaled logits ``z`` into ``g_i·(1[v = y_i] - p_iv)`` in place and return it.
    With ``g = grad_out / T`` that is the gradient of ``Σ grad_out·ℓ`` with respect to the unscaled
    logits: ``dℓ/dz_v = (1[v = y] - p_v) / T``."""
    z.sub_(lse[:, None]).exp_().mul_(-g[:, None])
    return z.scatter_add_(1, targets[:, None], g[:, None])


def _is_fake(tensor: torch.Tensor) -> bool:
    """Fake (shape-only) tensors have no values to check (memory measurements run on them)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def _checked_targets(targets: torch.Tensor, like: torch.Tensor, vocab: int, vocab_source: str) -> torch.Tensor:
    """``targets`` as int64 on ``like``'s device, after checking one id per row of ``like`` and every
    id in ``[0, vocab)``; ``vocab_source`` names where ``vocab`` comes from in the error."""
    if targets.shape != like.shape[:1]:
        raise ValueError(
            f"targets: expected shape {tuple(like.shape[:1])} (one id per row), got {tuple(targets.shape)}"
        )
    targets = targets.to(device=like.device, dtype=torch.long)
    if targets.numel() and not _is_fake(targets) and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(
            f"targets: ids must lie in [0, {vocab}) ({vocab_source}), "
            f"got min {int(targets.min())} and max {int(targets.max())}"
        )
    return targets


class _ChunkedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int
    ) -> torch.Tensor:
        dtype = _compute_dtype(logits.dtype)
        n = logits.shape[0]
        out = torch.empty(n, dtype=dtype, device=logits.device)
        lse = torch.empty(n, dtype=dtype, device=logits.device)
        for start in range(0, n, chunk_size):
            stop = min(start + chunk_size, n)
            # One [chunk, vocab] buffer, reused in place: scale, shift by the row max, exponentiate.
            z = logits[start:stop].to(dtype) / temperature
            picked, lse_c = _picked_and_lse(z, targets[start:stop])
            lse[start:stop] = lse_c
            out[start:stop] = picked - lse_c
            del z
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        temperature: float = ctx.temperature
        chunk_size: int = ctx.chunk_size
        dtype = lse.dtype
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], chunk_size):
            stop = min(start + chunk_size, logits.shape[0])
            g = grad_out[start:stop].to(dtype) / temperature
            # One [chunk, vocab] buffer: the scaled logits become the gradient in place.
            p = logits[start:stop].to(dtype) / temperature
            grad[start:stop] = _logprob_grad_(p, lse[start:stop], targets[start:stop], g)
            del p
        return grad, None, None, None


class _ChunkedEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, temperature: float, chunk_size: int) -> torch.Tensor:  # type: ignore[override]
        dtype = _compute_dtype(logits.dtype)
        n = logits.shape[0]
        out = torch.empty(n, dtype=dtype, device=logits.device)
        lse = torch.empty(n, dtype=dtype, device=logits.device)
        for start in range(0, n, chunk_size):
            stop = min(start + chunk_size, n)
            z = logits[start:stop].to(dtype) / temperature
            out[start:stop], lse[start:stop] = _entropy_and_lse(z)
            del z
        ctx.save_for_backward(logits, lse)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        logits, lse = ctx.saved_tensors
        temperature: float = ctx.temperature
        chunk_size: int = ctx.chunk_size
        dtype = lse.dtype
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], chunk_size):
            stop = min(start + chunk_size, logits.shape[0])
            y = logits[start:stop].to(dtype) / temperature
            p = torch.exp(y - lse[start:stop, None])
            expect = (p * y).sum(-1, keepdim=True)
            # dH/dy_v = p_v * (E_p[y] - y_v); dy/dz = 1/T
            grad_c = p * (expect - y) * (grad_out[start:stop, None].to(dtype) / temperature)
            grad[start:stop] = grad_c.to(grad.dtype)
            del y, p, grad_c
        return grad, None, None


def logprobs_from_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Return ``log softmax(logits / T)[i, targets[i]]`` for every row, shape ``[tokens]``.

    ``logits`` is ``[tokens, vocab]`` (any float dtype); ``targets`` is ``[tokens]`` of int64 ids
    in ``[0, vocab)``. The result is float32 (float64 for float64 logits) and differentiable with
    respect to ``logits``; peak extra memory is a few ``[chunk_size, vocab]`` buffers.
    """
    _check(logits, temperature, chunk_size)
    targets = _checked_targets(targets, logits, logits.shape[1], "the vocabulary of the logits")
    out: torch.Tensor = _ChunkedLogprob.apply(logits, targets, float(temperature), int(chunk_size))
    return out


def entropy_from_logits(
    logits: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """Return the entropy ``-Σ_v p_v log p_v`` of ``softmax(logits / T)`` per row, shape ``[tokens]``.

    Differentiable with respect to ``logits`` (for an entropy bonus); under ``torch.no_grad`` it
    keeps no autograd buffers at all, which is the metrics-only case.
    """
    _check(logits, temperature, chunk_size)
    out: torch.Tensor = _ChunkedEntropy.apply(logits, float(temperature), int(chunk_size))
    return out
