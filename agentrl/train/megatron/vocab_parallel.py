"""Token log-probs and entropy from logits split over the vocabulary (tensor parallelism).

Rank ``r`` holds the logits of its vocabulary slice ``[start, start + V/P)``. Per chunk of rows:

1. ``m = AllReduce_MAX(max_local z)`` (a shift only);
2. ``AllReduce_SUM`` of three per-row sums at once: ``S = Σ exp(z − m)``, ``Σ exp(z − m)·z`` and the
   target's shifted logit (non-zero only on the rank that owns the target id);
3. ``ℓ = (z_y − m) − log S`` and ``H = m + log S − E`` with ``E = Σ p·z``.

``z`` are the logits divided by the temperature. Columns at or beyond ``valid_vocab`` (Megatron's
padding rows) are ``−inf`` before step 1, so they never get probability. The backward pass
recomputes ``p = exp(z − m − log S)`` chunk by chunk from the saved logits and per-row scalars, so
the full-vocabulary softmax exists at most once per chunk and is never stored:
``∂ℓ/∂z_v = 1[v = y] − p_v`` and ``∂H/∂z_v = p_v (E − z_v)``, both times ``1/T``.
Entropy is non-differentiable unless asked for. No collective runs in the backward pass.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["vocab_parallel_logprobs"]


def _all_reduce(tensor: torch.Tensor, op: dist.ReduceOp.RedOpType, group: dist.ProcessGroup | None) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


_PAD_LOGIT = -1e30  # finite: exp() gives 0 and 0 · _PAD_LOGIT stays 0 (−inf would give NaN)


def _shifted(chunk: torch.Tensor, temperature: float, start: int, valid_vocab: int) -> torch.Tensor:
    """A fresh float32 (float64) copy of logits / T, with padding columns set to a huge negative."""
    z = chunk.to(torch.float64 if chunk.dtype == torch.float64 else torch.float32) / temperature
    valid_local = valid_vocab - start
    if valid_local < z.shape[-1]:
        z[..., max(valid_local, 0):] = _PAD_LOGIT
    return z


class _VocabParallelLogProbEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, start: int, valid_vocab: int,
                temperature: float, chunk_size: int, group: dist.ProcessGroup | None, entropy_grad: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        n, local = logits.shape
        float_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        rows = torch.empty(5, n, dtype=float_dtype, device=logits.device)
        logprobs, entropy, shift, log_sum, expect = rows.unbind(0)
        local_target = target - start
        owned = (local_target >= 0) & (local_target < local)
        for lo in range(0, n, chunk_size):
            hi = min(lo + chunk_size, n)
            z = _shifted(logits[lo:hi], temperature, start, valid_vocab)
            m = z.max(dim=-1).values
            _all_reduce(m, dist.ReduceOp.MAX, group)
            z.sub_(m[:, None])  # z − m in place: with exp(z − m), two [chunk, V/P] buffers in all
            idx = local_target[lo:hi].clamp(0, local - 1)
            zt = torch.where(owned[lo:hi], z.gather(1, idx[:, None])[:, 0], torch.zeros_like(m))
            e = z.exp()
            ez = torch.bmm(e[:, None, :], z[:, :, None])[:, 0, 0]
            sums = torch.stack([e.sum(-1), ez, zt])
            _all_reduce(sums, dist.ReduceOp.SUM, group)
            log_s = sums[0].log()
            e_shifted = sums[1] / sums[0]  # E − m
            logprobs[lo:hi] = sums[2] - log_s
            entropy[lo:hi] = log_s - e_shifted
            shift[lo:hi], log_sum[lo:hi], expect[lo:hi] = m, log_s, e_shifted + m
        ctx.save_for_backward(logits, target, shift, log_sum, expect)
        ctx.settings = (start, valid_vocab, temperature, chunk_size)
        out_logprobs, out_entropy = logprobs.clone(), entropy.clone()  # not views of one buffer
        if not entropy_grad:
            ctx.mark_non_differentiable(out_entropy)
        return out_logprobs, out_entropy

    @staticmethod
    def backward(ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, ...]:
        logits, target, shift, log_sum, expect = ctx.saved_tensors
        start, valid_vocab, temperature, chunk_size = ctx.settings
        n, local = logits.shape
        grad = torch.empty_like(logits)
        local_target = target - start
        owned = (local_target >= 0) & (local_target < local)
        for lo in range(0, n, chunk_size):
            hi = min(lo + chunk_size, n)
            z = _shifted(logits[lo:hi], temperature, start, valid_vocab)
            p = (z - (shift[lo:hi] + log_sum[lo:hi])[:, None]).exp_()
            if grad_entropy is not None:  # p · (g_H (E − z) − g_ℓ), built in z's buffer
                z.neg_().add_(expect[lo:hi][:, None]).mul_(grad_entropy[lo:hi].to(z.dtype)[:, None])
                if grad_logprobs is not None:
                    z.sub_(grad_logprobs[lo:hi].to(z.dtype)[:, None])
                p.mul_(z)
            elif grad_logprobs is not None:
                p.mul_(-grad_logprobs[lo:hi].to(p.dtype)[:, None])
            else:
                p.zero_()
            if grad_logprobs is not None:
                mine = torch.nonzero(owned[lo:hi])[:, 0]
                p[mine, local_target[lo:hi][mine]] += grad_logprobs[lo:hi][mine].to(p.dtype)
            grad[lo:hi] = (p / temperature).to(logits.dtype)
        return grad, None, None, None, None, None, None, None


def vocab_parallel_logprobs(
    logits: torch.Tensor, target: torch.Tensor, *, vocab_start: int, valid_vocab: int,
    group: dist.ProcessGroup | None = None,
    temperature: float = 1.0, chunk_size: int = 1024, entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs [N], entropy [N])`` of ``target`` under temperature-scaled logits split over ``group``.

    ``logits``: ``[N, V/P]``, this rank's vocabulary slice starting at global id ``vocab_start``;
    ``target``: ``[N]`` global token ids; ids ``>= valid_vocab`` (padding) get no probability.
    ``group``: the tensor-parallel process group (``None``: not split). ``entropy_grad``: make the
    entropy differentiable (an entropy bonus); otherwise it is a metric only. Float32 (float64 for
    float64 logits) whatever the logits' dtype.
    """
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"logits/target: expected [N, V/P] and [N], got {tuple(logits.shape)} and "
                         f"{tuple(target.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature: expected a positive number, got {temperature!r}")
    out: tuple[torch.Tensor, torch.Tensor] = _VocabParallelLogProbEntropy.apply(
        logits, target, vocab_start, valid_vocab, temperature, chunk_size, group, entropy_grad)
    return out
