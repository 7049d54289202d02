"""Train/inference mismatch: truncated (TIS) and masked (MIS) importance weights, and metrics.

Engine log-probs (``rollout_logprobs``) and the trainer's recompute (``old_logprobs``) differ
(kernels, precision, batch variance, partial rollouts under older weights). The correction
multiplies the per-token loss by a stop-gradient weight built from ``Δ = old - rollout``.

Masking lowers the weight of a rollout instead of renormalising it: keep the reducer's
denominators as they were (computed from the original loss mask).
"""

from __future__ import annotations

import torch

__all__ = ["mis_weights", "mismatch_metrics", "sequence_tis_weights", "tis_weights"]


def _check_pair(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor) -> None:
    if old_logprobs.shape != rollout_logprobs.shape:
        raise ValueError(
            f"rollout_logprobs: expected the shape of old_logprobs {tuple(old_logprobs.shape)}, "
            f"got {tuple(rollout_logprobs.shape)}"
        )


def tis_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, *, clip: float = 2.0, clip_low: float = 0.0
) -> torch.Tensor:
    """Token TIS weights ``clamp(exp(old - rollout), clip_low, clip)``, detached, same shape."""
    _check_pair(old_logprobs, rollout_logprobs)
    if not 0.0 <= clip_low <= clip:
        raise ValueError(f"clip_low/clip: expected 0 <= clip_low <= clip, got {clip_low!r}/{clip!r}")
    ratio = torch.exp(old_logprobs.detach() - rollout_logprobs.detach())
    return torch.clamp(ratio, clip_low, clip)


def mis_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    *,
    low: float = 0.5,
    high: float = 2.0,
    keep_ratio: bool = False,
) -> torch.Tensor:
    """Masked IS (icepop): ``1[low <= exp(old - rollout) <= high]``, times the ratio if ``keep_ratio``.

    Tokens outside ``[low, high]`` get weight 0 (dropped, not truncated); others 1 (or their ratio).
    """
    _check_pair(old_logprobs, rollout_logprobs)
    if not 0.0 <= low <= high:
        raise ValueError(f"low/high: expected 0 <= low <= high, got {low!r}/{high!r}")
    ratio = torch.exp(old_logprobs.detach() - rollout_logprobs.detach())
    keep = ((ratio >= low) & (ratio <= high)).to(ratio.dtype)
    return keep * ratio if keep_ratio else keep


def sequence_tis_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip: float = 2.0,
    geometric: bool = False,
) -> torch.Tensor:
    """Sequence TIS for ``[S, T]`` rows: ``min(exp(Σ_t m·Δ), clip)`` (or of the masked mean if
    ``geometric``), broadcast to every token of the row."""
    _check_pair(old_logprobs, rollout_logprobs)
    mask = loss_mask.to(old_logprobs.dtype)
    delta = (old_logprobs.detach() - rollout_logprobs.detach()) * mask
    total = delta.sum(-1, keepdim=True)
    if geometric:
        total = total / mask.sum(-1, keepdim=True).clamp(min=1.0)
    return torch.clamp(torch.exp(total), max=clip).expand_as(old_logprobs)


def mismatch_metrics(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, loss_mask: torch.Tensor, *, clip: float = 2.0
) -> dict[str, float]:
    """Masked statistics of the train/rollout mismatch: mean ``|Δ|``, mean/max of ``exp(Δ)``, the
    fraction of tokens whose ratio is above ``clip``, and the k3 KL estimate. Empty masks give 0."""
    _check_pair(old_logprobs, rollout_logprobs)
    mask = loss_mask.bool()
    n = int(mask.sum())
    if n == 0:
        return {"mismatch/abs_diff": 0.0, "mismatch/ratio_mean": 0.0, "mismatch/ratio_max": 0.0,
                "mismatch/clip_frac": 0.0, "mismatch/k3": 0.0}
    delta = (old_logprobs.detach() - rollout_logprobs.detach())[mask].double()
    ratio = torch.exp(delta)
    return {
        "mismatch/abs_diff": float(delta.abs().mean()),
        "mismatch/ratio_mean": float(ratio.mean()),
        "mismatch/ratio_max": float(ratio.max()),
        "mismatch/clip_frac": float((ratio > clip).double().mean()),
        "mismatch/k3": float((torch.expm1(delta) - delta).mean()),
    }
