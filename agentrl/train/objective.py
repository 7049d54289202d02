"""The step objective for one packed micro-batch, as a pure function of tensors.

``micro_batch_objective`` returns this micro-batch's *share* of the step loss: reduced with the
step's global counts (rollouts ``B``, trainable tokens ``N``), so summing the shares of every
micro-batch on every rank gives the step objective, whatever the packing. Metrics are reduced the
same way and add up the same way.

    loss = reduce(w ⊙ L_policy) + β_kl · reduce(k) − c_H · reduce(H)

``sft_objective`` is the supervised objective on the same micro-batches: the next-token negative
log-likelihood of the trainable (mask-1) tokens, summed and divided by the step's ``N``, so the step
loss is the mean NLL per trained token of the whole step, whatever the packing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.algorithms import (
    PolicyLossKind,
    cispo_loss,
    gspo_loss,
    kl,
    mis_weights,
    opsm_mask,
    ppo_clip_loss,
    reduce_loss,
    tis_weights,
)
from agentrl.train.config import LossConfig
from agentrl.train.packing import MicroBatch

__all__ = ["StepCounts", "micro_batch_objective", "old_logprobs_for", "sft_objective"]


@dataclass(frozen=True)
class StepCounts:
    """Global counts of one optimiser step, identical on every rank."""

    num_rollouts: int
    num_tokens: int


def old_logprobs_for(mb: MicroBatch, logprobs: torch.Tensor, config: LossConfig) -> torch.Tensor:
    """The ``ℓold`` the ratio uses, per ``config.old_logprobs``."""
    if config.old_logprobs == "detached":
        return logprobs.detach()
    if config.old_logprobs == "rollout":
        return mb.rollout_logprobs
    if mb.old_logprobs is None:
        raise ValueError("old_logprobs: 'recompute' needs the micro-batch's old logprobs; none were computed")
    return mb.old_logprobs


def _policy_loss(
    mb: MicroBatch, logprobs: torch.Tensor, old: torch.Tensor, config: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    if config.policy_loss is PolicyLossKind.GSPO:
        return gspo_loss(logprobs, old, mb.advantages, mb.loss_mask, sequence_ids=mb.sequence_ids,
                         eps_clip=config.eps_clip, eps_clip_high=config.eps_clip_high)
    if config.policy_loss is PolicyLossKind.CISPO:
        return cispo_loss(logprobs, old, mb.advantages, eps_clip=config.eps_clip, eps_clip_high=config.eps_clip_high)
    return ppo_clip_loss(logprobs, old, mb.advantages, eps_clip=config.eps_clip,
                         eps_clip_high=config.eps_clip_high, dual_clip_c=config.dual_clip_c)


def micro_batch_objective(
    mb: MicroBatch,
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    config: LossConfig,
    counts: StepCounts,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(loss_share, metric_shares)`` for one micro-batch.

    ``logprobs`` (``[N]``, with gradient) score ``mb.target_ids``; ``entropy`` (``[N]``) is needed
    when ``config.entropy_coef > 0`` (with gradient) and is otherwise only reported. Metric shares
    are detached scalars: ``pg_loss`` (in the loss's aggregation), and per-rollout token means of
    ``clipfrac``, ``ppo_kl``, ``entropy``, ``kl``, ``train_rollout_abs_diff``.
    """
    mask = mb.loss_mask.to(logprobs.dtype)
    den = mb.denominators.to(logprobs.dtype)

    def reduce(values: torch.Tensor) -> torch.Tensor:
        return reduce_loss(values, mask, den, mode=config.aggregation, num_rollouts=counts.num_rollouts,
                           num_tokens=max(counts.num_tokens, 1), constant=config.constant_normalizer)

    def mean(values: torch.Tensor) -> torch.Tensor:
        # Metrics are per-rollout token means whatever the loss aggregation: comparable across runs
        # and, like the loss, independent of the packing.
        return reduce_loss(values.detach(), mask, den, num_rollouts=counts.num_rollouts)

    old = old_logprobs_for(mb, logprobs, config).to(logprobs.dtype)
    per_token, clipped = _policy_loss(mb, logprobs, old, config)
    rollout_lp = mb.rollout_logprobs.to(logprobs.dtype)
    if config.correction == "tis":
        per_token = per_token * tis_weights(old, rollout_lp, clip=config.tis_clip, clip_low=config.tis_clip_low)
    elif config.correction == "mis":
        per_token = per_token * mis_weights(old, rollout_lp, low=config.mis_low, high=config.mis_high)
    if config.opsm_delta is not None:
        per_token = per_token * opsm_mask(logprobs, old, mb.advantages, mask, sequence_ids=mb.sequence_ids,
                                          delta=config.opsm_delta)
    pg_loss = reduce(per_token)
    loss = pg_loss
    metrics: dict[str, torch.Tensor] = {
        "pg_loss": pg_loss.detach(),
        "clipfrac": mean(clipped.to(logprobs.dtype)),
        "ppo_kl": mean(old - logprobs),
        "train_rollout_abs_diff": mean((old - rollout_lp).abs()),
    }
    if config.kl_loss_coef > 0:
        if mb.ref_logprobs is None:
            raise ValueError("ref_logprobs: kl_loss_coef > 0 needs reference logprobs; none were computed")
        kl_tokens = kl(logprobs, mb.ref_logprobs.to(logprobs.dtype), config.kl_loss_type)
        loss = loss + config.kl_loss_coef * reduce(kl_tokens)
        metrics["kl"] = mean(kl_tokens)
    if entropy is not None:
        metrics["entropy"] = mean(entropy)
        if config.entropy_coef > 0:
            loss = loss - config.entropy_coef * reduce(entropy)
    elif config.entropy_coef > 0:
        raise ValueError("entropy: entropy_coef > 0 needs the per-token entropy with gradient")
    return loss, metrics


def sft_objective(mb: MicroBatch, logprobs: torch.Tensor, counts: StepCounts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(loss_share, metric_shares)`` of supervised training for one micro-batch.

    ``loss_share = −Σ mask·logprobs / N`` with ``N = counts.num_tokens`` (the step's trainable tokens);
    the shares of every micro-batch on every rank add up to the mean NLL per trained token. Advantages,
    rollout logprobs and denominators are not read. Metric: ``nll`` (the same share, detached).
    """
    mask = mb.loss_mask.to(logprobs.dtype)
    loss = -(logprobs * mask).sum() / max(counts.num_tokens, 1)
    return loss, {"nll": loss.detach()}
