"""Reducing per-token losses to the step objective, packing- and fan-out-invariantly.

Default (``"rollout_token_mean"``): every rollout weighs the same, and inside a rollout every
trainable token weighs the same. Each token's term is divided by its *rollout's* full mask sum
``D`` (computed once over all the rollout's segments, before any split), so

    J = (1/B) Σ_{micro-batches b} Σ_{tokens in b} m·L / max(D, 1)

does not depend on how segments are packed into micro-batches or ranks. Reduce each micro-batch
with the step's global ``num_rollouts`` and the pieces add up to ``J``.

Other modes:

- ``"token_mean"`` (DAPO): ``Σ m·L / N`` with ``N`` the step's trainable-token count
  (``num_tokens``; defaults to the tokens in this call).
- ``"seq_mean_token_sum_norm"`` (Dr.GRPO): ``Σ m·L / (C·B)`` with a constant ``C`` fixed for the run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.algorithms.kinds import LossAggregation

__all__ = ["LossAggregation", "reduce_loss", "rollout_denominators"]


def rollout_denominators(loss_masks: Sequence[Sequence[int]], rollout_ids: Sequence[str]) -> list[float]:
    """Per sequence, the total mask sum of all sequences sharing its rollout id (``D_s``)."""
    if len(loss_masks) != len(rollout_ids):
        raise ValueError(
            f"rollout_ids: expected one id per loss mask ({len(loss_masks)}), got {len(rollout_ids)}"
        )
    totals: dict[str, float] = {}
    for mask, rid in zip(loss_masks, rollout_ids, strict=True):
        totals[rid] = totals.get(rid, 0.0) + float(sum(mask))
    return [totals[rid] for rid in rollout_ids]


def _broadcast_denominators(denominators: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if denominators.shape == like.shape:
        return denominators
    if like.dim() == 2 and denominators.shape == like.shape[:1]:
        return denominators[:, None].expand_as(like)
    raise ValueError(
        f"denominators: expected shape {tuple(like.shape)} (per token) or {tuple(like.shape[:1])} "
        f"(per sequence row), got {tuple(denominators.shape)}"
    )


def reduce_loss(
    per_token_loss: torch.Tensor,
    loss_mask: torch.Tensor,
    denominators: torch.Tensor | None = None,
    *,
    mode: LossAggregation | str = LossAggregation.ROLLOUT_TOKEN_MEAN,
    num_rollouts: float | None = None,
    num_tokens: float | None = None,
    constant: float | None = None,
) -> torch.Tensor:
    """Reduce ``per_token_loss`` (``[S, T]`` rows or 1-D packed ``[N]``) to a scalar.

    ``loss_mask`` has the loss's shape. ``denominators`` (rollout mode) are the per-rollout mask
    sums ``D``, per sequence row (``[S]``) or per token. ``num_rollouts`` is ``B``; when omitted it
    is inferred as ``Σ m/D``, which counts the rollouts with trainable tokens and is exact when this
    call sees all of them. Masked positions never contribute, even if their loss is NaN-free garbage.
    """
    mode = LossAggregation(mode)
    if loss_mask.shape != per_token_loss.shape:
        raise ValueError(
            f"loss_mask: expected the shape of per_token_loss {tuple(per_token_loss.shape)}, "
            f"got {tuple(loss_mask.shape)}"
        )
    mask = loss_mask.to(per_token_loss.dtype)
    # where() rather than a product, so masked NaN/inf (e.g. padding) cannot leak into the sum.
    masked = torch.where(mask > 0, per_token_loss * mask, torch.zeros_like(per_token_loss))
    if mode is LossAggregation.ROLLOUT_TOKEN_MEAN:
        if denominators is None:
            raise ValueError("denominators: required for mode 'rollout_token_mean' (per-rollout mask sums)")
        den = _broadcast_denominators(denominators.to(per_token_loss.dtype), per_token_loss).clamp(min=1.0)
        total = (masked / den).sum()
        count = float((mask / den).sum()) if num_rollouts is None else float(num_rollouts)
        return total / max(count, 1.0) if num_rollouts is None else total / _positive("num_rollouts", count)
    if mode is LossAggregation.TOKEN_MEAN:
        count = float(mask.sum()) if num_tokens is None else _positive("num_tokens", float(num_tokens))
        return masked.sum() / max(count, 1.0)
    if constant is None or not constant > 0:
        raise ValueError(f"constant: mode 'seq_mean_token_sum_norm' needs a positive constant C, got {constant!r}")
    if num_rollouts is None:
        if denominators is None:
            raise ValueError("num_rollouts: required for 'seq_mean_token_sum_norm' when denominators are not given")
        den = _broadcast_denominators(denominators.to(per_token_loss.dtype), per_token_loss).clamp(min=1.0)
        count = max(float((mask / den).sum()), 1.0)
    else:
        count = _positive("num_rollouts", float(num_rollouts))
    return masked.sum() / (constant * count)


def _positive(name: str, value: float) -> float:
    if not value > 0:
        raise ValueError(f"{name}: expected a positive count, got {value!r}")
    return value
