"""Token log-probs (and entropy) straight from hidden states and the output projection, never
building the ``[tokens, vocab]`` logits.

A causal LM's logits are ``hidden @ W.T`` (``W``: the ``[vocab, hidden]`` output embedding). For a
151,936-word vocabulary the logits and their gradient are the largest tensors of a training step
(a 32k-token micro-batch: 9.3 GiB in bfloat16, 18.5 GiB in float32). :func:`scores_from_hidden`
computes ``log softmax(hidden @ W.T / T)`` at the target ids, and optionally the entropy,
``chunk_size`` rows at a time; its backward pass recomputes each chunk's logits and produces the
gradients of ``hidden`` and ``W`` directly. Peak extra memory: two ``[chunk_size, vocab]`` float32
buffers and one float32 ``[vocab, hidden]`` gradient accumulator.

The vocabulary may be split over tensor-parallel ranks: ``W`` is then this rank's rows
``[vocab_start, vocab_start + rows)``, ``valid_vocab`` masks the padding rows, and ``all_reduce``
(``all_reduce(tensor, "max" | "sum")``, in place) combines the per-row maxima and sums over the
ranks in the forward pass. The backward pass needs no collective: the gradient of ``hidden`` is a
partial sum the caller reduces (Megatron's ``copy_to_tensor_model_parallel_region``).

Matrix products run in the dtype of ``W`` (``hidden`` is cast to it); the softmax is float32
(float64 for float64 inputs). Autocast is disabled inside. Only plain projections are supported:
no bias, no logit soft-capping or scaling (the torch backend checks a model against its own logits
before using this path).

Example::

    lp, ent = scores_from_hidden(hidden_NH, lm_head.weight, targets_N, temperature=0.7, entropy="grad")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from agentrl.algorithms.logprobs import DEFAULT_CHUNK_SIZE, _check_scalars, _is_fake
from agentrl.algorithms.logprobs import _compute_dtype as _float

__all__ = ["AllReduce", "entropy_from_hidden", "logprobs_from_hidden", "scores_from_hidden"]

AllReduce = Callable[[torch.Tensor, str], None]
"""``all_reduce(tensor, op)``: combine ``tensor`` in place over the ranks holding the vocabulary's
slices, ``op`` being ``"max"`` or ``"sum"``."""

EntropyMode = Literal["none", "metric", "grad"]
_PAD_LOGIT = -1e30  # finite: exp() gives 0 and 0 · _PAD_LOGIT stays 0 (−inf would give NaN)


def _no_autocast(device: torch.device) -> Any:
    return torch.autocast(device_type=device.type, enabled=False)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, temperature: float, valid_local: int) -> torch.Tensor:
    """``h @ W.T / T`` for one chunk of rows, in float32 (float64), padding columns set very negative."""
    z = (h.to(weight.dtype) @ weight.T).to(_float(weight.dtype)).div_(temperature)
    if valid_local < z.shape[1]:
        z[:, max(valid_local, 0):] = _PAD_LOGIT
    return z


class _FusedHead(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
        chunk_size: int, vocab_start: int, valid_vocab: int, all_reduce: AllReduce | None, entropy: EntropyMode,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = _float(weight.dtype)
        n, rows = hidden.shape[0], weight.shape[0]
        out = torch.zeros(4, n, dtype=dtype, device=hidden.device)  # logprob, entropy, lse, E[z]
        local_target = targets - vocab_start
        owned = (local_target >= 0) & (local_target < rows)
        valid_local = valid_vocab - vocab_start
        with _no_autocast(hidden.device):
            for lo in range(0, n, chunk_size):
                hi = min(lo + chunk_size, n)
                z = _chunk_logits(hidden[lo:hi], weight, temperature, valid_local)
                m = z.amax(dim=-1)
                if all_reduce is not None:
                    all_reduce(m, "max")
                z.sub_(m[:, None])
                idx = local_target[lo:hi].clamp(0, rows - 1)
                picked = torch.where(owned[lo:hi], z.gather(1, idx[:, None])[:, 0], torch.zeros_like(m))
                if entropy == "none":
                    sums = torch.stack([z.exp_().sum(-1), torch.zeros_like(m), picked])
                else:
                    e = torch.exp(z)
                    sums = torch.stack([e.sum(-1), torch.bmm(e[:, None, :], z[:, :, None])[:, 0, 0], picked])
                    del e
                del z
                if all_reduce is not None:
                    all_reduce(sums, "sum")
                log_s = sums[0].log()
                expect = sums[1] / sums[0]  # E[z] - m
                out[0, lo:hi] = sums[2] - log_s
                out[1, lo:hi] = log_s - expect
                out[2, lo:hi] = m + log_s
                out[3, lo:hi] = expect + m
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, targets, out[2].clone(), out[3].clone())
        ctx.settings = (temperature, chunk_size, vocab_start, valid_vocab)
        logprobs, ent = out[0].clone(), out[1].clone()
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        return logprobs, ent

    @staticmethod
    def backward(ctx: Any, grad_lp: torch.Tensor | None, grad_ent: torch.Tensor | None) -> tuple[Any, ...]:
        hidden, weight, targets, lse, expect = ctx.saved_tensors
        temperature, chunk_size, vocab_start, valid_vocab = ctx.settings
        dtype = lse.dtype
        rows = weight.shape[0]
        local_target = targets - vocab_start
        owned = (local_target >= 0) & (local_target < rows)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if want_w else None
        with _no_autocast(hidden.device):
            for lo in range(0, hidden.shape[0], chunk_size):
                hi = min(lo + chunk_size, hidden.shape[0])
                h = hidden[lo:hi].to(weight.dtype)
                z = _chunk_logits(h, weight, temperature, valid_vocab - vocab_start)
                p = (z - lse[lo:hi, None]).exp_()
                # dℓ/dz_v = 1[v = y] − p_v and dH/dz_v = p_v (E[z] − z_v), both times 1/T.
                if grad_ent is not None:
                    z.neg_().add_(expect[lo:hi, None]).mul_(grad_ent[lo:hi, None].to(dtype))
                    if grad_lp is not None:
                        z.sub_(grad_lp[lo:hi, None].to(dtype))
                    p.mul_(z)
                elif grad_lp is not None:
                    p.mul_(-grad_lp[lo:hi, None].to(dtype))
                else:
                    p.zero_()
                del z
                if grad_lp is not None:
                    mine = owned[lo:hi]
                    idx = local_target[lo:hi].clamp(0, rows - 1)
                    p.scatter_add_(1, idx[:, None], torch.where(mine, grad_lp[lo:hi].to(dtype), 0.0)[:, None])
                p.div_(temperature)
                if grad_h is not None:
                    grad_h[lo:hi] = (p.to(weight.dtype) @ weight).to(grad_h.dtype)
                if grad_w is not None:
                    grad_w.addmm_(p.T, h.to(dtype))
                del p
        return (grad_h, grad_w.to(weight.dtype) if grad_w is not None else None,
                None, None, None, None, None, None, None)


def _check(hidden: torch.Tensor, weight: torch.Tensor, temperature: float, chunk_size: int) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden/weight: expected [tokens, hidden] and [vocab, hidden] with the same hidden size, "
            f"got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    _check_scalars(temperature, chunk_size)


def scores_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    entropy: EntropyMode = "none",
    vocab_start: int = 0,
    valid_vocab: int | None = None,
    all_reduce: AllReduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logprobs [N], entropy [N] or None)`` of ``softmax(hidden @ weight.T / T)`` at ``targets``.

    ``entropy``: ``"none"`` (not computed), ``"metric"`` (computed, detached) or ``"grad"``
    (differentiable, for an entropy bonus). ``weight`` may be one tensor-parallel slice of the
    vocabulary (see the module doc: ``vocab_start``, ``valid_vocab``, ``all_reduce``); ``targets``
    are global ids. Differentiable with respect to ``hidden`` and ``weight``; equal (to float
    rounding) to :func:`~agentrl.algorithms.logprobs_from_logits` and
    :func:`~agentrl.algorithms.entropy_from_logits` of ``hidden @ weight.T``.
    """
    _check(hidden, weight, temperature, chunk_size)
    if entropy not in ("none", "metric", "grad"):
        raise ValueError(f"entropy: expected 'none', 'metric' or 'grad', got {entropy!r}")
    valid = (vocab_start + weight.shape[0]) if valid_vocab is None else valid_vocab
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets: expected shape {tuple(hidden.shape[:1])} (one id per row), got "
                         f"{tuple(targets.shape)}")
    targets = targets.to(device=hidden.device, dtype=torch.long)
    if all_reduce is None and targets.numel() and not _is_fake(targets):
        low, high = int(targets.min()), int(targets.max())
        if low < vocab_start or high >= valid:
            raise ValueError(f"targets: ids must lie in [{vocab_start}, {valid}) (the rows of weight), "
                             f"got min {low} and max {high}")
    lp, ent = _FusedHead.apply(hidden, weight, targets, float(temperature), int(chunk_size), int(vocab_start),
                               int(valid), all_reduce, entropy)
    return lp, (ent if entropy != "none" else None)


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
    return scores_from_hidden(hidden, weight, targets, temperature=temperature, chunk_size=chunk_size)[0]


def entropy_from_hidden(
    hidden: torch.Tensor, weight: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """Entropy of ``softmax(hidden @ weight.T / T)`` per row, for metrics: computed without
    gradient (the result is detached)."""
    targets = torch.zeros(hidden.shape[0], dtype=torch.long, device=hidden.device)
    with torch.no_grad():
        ent = scores_from_hidden(hidden, weight, targets, temperature=temperature, chunk_size=chunk_size,
                                 entropy="metric")[1]
    assert ent is not None
    return ent
