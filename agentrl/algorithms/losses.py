"""Per-token policy losses of the GRPO family (before reduction).

Every function returns a per-token loss of the shape of its inputs and leaves masking and the
reduction to :func:`agentrl.algorithms.reduce_loss`, so packing and fan-out never change the
objective. ``logprobs`` carry the gradient; ``old_logprobs`` and ``advantages`` are treated as
constants (they are detached here).

- :func:`ppo_clip_loss`: PPO clipped surrogate with asymmetric clip (DAPO clip-higher) and the
  optional dual clip for negative advantages.
- :func:`gspo_loss`: the same clip on a sequence-level geometric-mean ratio.
- :func:`cispo_loss`: REINFORCE weighted by a clipped, stop-gradient importance ratio, so clipped
  tokens still get gradient.
- :func:`value_loss`: clipped value-function loss for PPO with a critic.
"""

from __future__ import annotations

import torch

__all__ = ["cispo_loss", "gspo_loss", "opsm_mask", "ppo_clip_loss", "sequence_mean", "value_loss"]


def _same_shape(name: str, tensor: torch.Tensor, like: torch.Tensor) -> None:
    if tensor.shape != like.shape:
        raise ValueError(f"{name}: expected shape {tuple(like.shape)} (that of logprobs), got {tuple(tensor.shape)}")


def _clip_bounds(eps_clip: float, eps_clip_high: float | None) -> tuple[float, float]:
    high = eps_clip if eps_clip_high is None else eps_clip_high
    if eps_clip < 0 or high < 0:
        raise ValueError(f"eps_clip/eps_clip_high: expected non-negative values, got {eps_clip!r}/{high!r}")
    return 1.0 - eps_clip, 1.0 + high


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(max(-A·ρ, -A·clip(ρ, low, high)), clipped)``: clipped is true where the clipped branch won."""
    loss1 = -adv * ratio
    loss2 = -adv * torch.clamp(ratio, low, high)
    return torch.maximum(loss1, loss2), loss2 > loss1


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token: ``(per_token_loss, clipped_mask)``.

    ``ρ = exp(logprobs - old_logprobs)``; ``L = max(-A·ρ, -A·clip(ρ, 1-eps_clip, 1+eps_clip_high))``
    (``eps_clip_high`` defaults to ``eps_clip``). With ``dual_clip_c = c > 1``, tokens with ``A < 0``
    get ``L = min(L, -c·A)``. ``clipped_mask`` is a bool tensor, true where the clipped branch won
    (``-A·clip(ρ) > -A·ρ``) or the dual clip bound applied: exactly the tokens without gradient.
    """
    _same_shape("old_logprobs", old_logprobs, logprobs)
    _same_shape("advantages", advantages, logprobs)
    low, high = _clip_bounds(eps_clip, eps_clip_high)
    adv = advantages.detach()
    loss, clipped = _clipped_surrogate(torch.exp(logprobs - old_logprobs.detach()), adv, low, high)
    if dual_clip_c is not None:
        if not dual_clip_c > 1.0:
            raise ValueError(f"dual_clip_c: expected a value > 1, got {dual_clip_c!r}")
        bound = -dual_clip_c * adv
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        clipped = clipped | dual
    return loss, clipped


def sequence_mean(values: torch.Tensor, loss_mask: torch.Tensor, sequence_ids: torch.Tensor | None) -> torch.Tensor:
    """Masked mean of ``values`` per sequence, broadcast back to every token of the sequence.

    ``values``/``loss_mask`` are ``[S, T]`` (rows are sequences; ``sequence_ids`` must be None) or
    1-D packed ``[N]`` with ``sequence_ids`` ``[N]`` giving each token's sequence index (0..S-1).
    The denominator is ``max(Σ mask, 1)``, so all-masked sequences give 0.
    """
    mask = loss_mask.to(values.dtype)
    if sequence_ids is None:
        num = (values * mask).sum(-1, keepdim=True)
        den = mask.sum(-1, keepdim=True).clamp(min=1.0)
        return (num / den).expand_as(values)
    _same_shape("sequence_ids", sequence_ids, values)
    n_seq = int(sequence_ids.max()) + 1 if sequence_ids.numel() else 0
    ids = sequence_ids.long()
    num = torch.zeros(n_seq, dtype=values.dtype, device=values.device).index_add(0, ids, values * mask)
    den = torch.zeros(n_seq, dtype=values.dtype, device=values.device).index_add(0, ids, mask).clamp(min=1.0)
    return (num / den)[ids]


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    sequence_ids: torch.Tensor | None = None,
    eps_clip: float = 3e-4,
    eps_clip_high: float | None = 4e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO per token: ``(per_token_loss, clipped_mask)`` with the sequence ratio broadcast to tokens.

    ``s_i = exp(Σ_t m(ℓ - ℓold) / max(Σ_t m, 1))``; ``L = max(-A·s, -A·clip(s, 1-eps, 1+eps_high))``.
    A sequence is a row of ``[S, T]`` inputs or, for 1-D packed inputs, the tokens sharing a
    ``sequence_ids`` value. The sum is complete only if the whole sequence is in the call.
    """
    _same_shape("old_logprobs", old_logprobs, logprobs)
    _same_shape("advantages", advantages, logprobs)
    _same_shape("loss_mask", loss_mask, logprobs)
    low, high = _clip_bounds(eps_clip, eps_clip_high)
    log_ratio = sequence_mean(logprobs - old_logprobs.detach(), loss_mask, sequence_ids)
    return _clipped_surrogate(torch.exp(log_ratio), advantages.detach(), low, high)


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_clip: float = 1.0,
    eps_clip_high: float | None = 0.28,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO per token: ``(per_token_loss, clipped_mask)``.

    ``L = -sg[clip(ρ, 1-eps_clip, 1+eps_clip_high)]·A·ℓ``: every token keeps the gradient
    ``-w·A·∇ℓ``, clipped or not. The default ``eps_clip = 1`` bounds only the upper side, as
    MiniMax-M1 does. ``clipped_mask`` marks tokens whose weight was clipped.
    """
    _same_shape("old_logprobs", old_logprobs, logprobs)
    _same_shape("advantages", advantages, logprobs)
    low, high = _clip_bounds(eps_clip, eps_clip_high)
    ratio = torch.exp(logprobs.detach() - old_logprobs.detach())
    weight = torch.clamp(ratio, low, high)
    clipped = (ratio < low) | (ratio > high)
    return -weight * advantages.detach() * logprobs, clipped


def opsm_mask(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    sequence_ids: torch.Tensor | None = None,
    delta: float = 1e-4,
) -> torch.Tensor:
    """Off-policy sequence mask (OPSM): 0 for every token of a sequence with ``A < 0`` whose masked
    mean ``ℓold - ℓ`` exceeds ``delta``, else 1. Detached; multiply the per-token loss by it.

    The advantage of a sequence is read from its trainable tokens (``A`` is constant per sequence).
    """
    _same_shape("old_logprobs", old_logprobs, logprobs)
    _same_shape("advantages", advantages, logprobs)
    _same_shape("loss_mask", loss_mask, logprobs)
    drift = sequence_mean((old_logprobs - logprobs).detach(), loss_mask, sequence_ids)
    seq_adv = sequence_mean(advantages.detach(), loss_mask, sequence_ids)
    drop = (seq_adv < 0) & (drift > delta)
    return (~drop).to(logprobs.dtype)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *, clip: float = 0.2
) -> torch.Tensor:
    """Clipped value loss per token: ``max((V - R)², (V_old + clip(V - V_old, ±clip) - R)²)`` (no 1/2)."""
    _same_shape("old_values", old_values, values)
    _same_shape("returns", returns, values)
    old = old_values.detach()
    ret = returns.detach()
    clipped_v = old + torch.clamp(values - old, -clip, clip)
    return torch.maximum((values - ret) ** 2, (clipped_v - ret) ** 2)
