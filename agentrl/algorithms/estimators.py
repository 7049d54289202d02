"""Named estimators: which advantage and which policy loss each GRPO-family method uses.

=========================  ===================================  ==============  ==========================
estimator                  advantage                            policy loss     default reduction
=========================  ===================================  ==============  ==========================
``grpo``                   group centre + std                   ``ppo``         ``rollout_token_mean``
``dr_grpo``                group centre (no std)                ``ppo``         ``seq_mean_token_sum_norm``
``gspo``                   group centre + std                   ``gspo``        ``rollout_token_mean``
``cispo``                  group centre + std                   ``cispo``       ``rollout_token_mean``
``reinforce_pp``           discounted return, whitened          ``ppo``         ``rollout_token_mean``
``reinforce_pp_baseline``  group centre - β·k, whitened         ``ppo``         ``rollout_token_mean``
``ppo``                    GAE with a critic (needs ``values``) ``ppo``         ``rollout_token_mean``
=========================  ===================================  ==============  ==========================

:func:`compute_advantages` returns per-token advantages ``[S, T]`` (zero where ``loss_mask`` is 0).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from agentrl.algorithms.advantages import (
    _token_rewards,
    gae_advantages,
    group_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)
from agentrl.algorithms.kinds import AdvantageEstimator, PolicyLossKind, default_aggregation, policy_loss_for

__all__ = ["AdvantageEstimator", "PolicyLossKind", "compute_advantages", "default_aggregation", "policy_loss_for"]


def compute_advantages(
    estimator: AdvantageEstimator | str,
    rewards: torch.Tensor | Sequence[float],
    group_ids: Sequence[Hashable],
    loss_mask: torch.Tensor,
    *,
    rollout_ids: Sequence[Hashable] | None = None,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-token advantages ``[S, T]`` (float64) for ``estimator``; rows align with ``rewards``.

    ``kl`` (``[S, T]``, detached) with ``kl_coef`` shapes token rewards for the REINFORCE++ and PPO
    estimators. ``ppo`` requires ``values`` ``[S, T]`` from a critic.
    """
    est = AdvantageEstimator(estimator)
    r = rewards if isinstance(rewards, torch.Tensor) else torch.tensor(list(rewards), dtype=torch.float64)
    if loss_mask.dim() != 2 or loss_mask.shape[0] != r.shape[0]:
        raise ValueError(
            f"loss_mask: expected [S, T] with S = {r.shape[0]} (one row per reward), got {tuple(loss_mask.shape)}"
        )
    mask = loss_mask.bool()
    if est in (AdvantageEstimator.GRPO, AdvantageEstimator.GSPO, AdvantageEstimator.CISPO, AdvantageEstimator.DR_GRPO):
        per_seq = group_advantages(
            r, group_ids, std_normalize=est is not AdvantageEstimator.DR_GRPO, eps=eps, rollout_ids=rollout_ids
        ).double()
        full = per_seq[:, None].expand(mask.shape)
        return torch.where(mask, full, torch.zeros_like(full))
    if est is AdvantageEstimator.REINFORCE_PP:
        if rollout_ids is not None and len(set(rollout_ids)) != len(list(rollout_ids)):
            raise ValueError("rollout_ids: REINFORCE++ returns are per sequence; fan-out rollouts are not supported")
        return reinforce_pp_advantages(r, loss_mask, kl=kl, kl_coef=kl_coef, gamma=gamma)
    if est is AdvantageEstimator.REINFORCE_PP_BASELINE:
        return reinforce_pp_baseline_advantages(
            r, group_ids, loss_mask, rollout_ids=rollout_ids, kl=kl, kl_coef=kl_coef
        )
    if values is None:
        raise ValueError("values: estimator 'ppo' (GAE) needs critic values of shape [S, T]")
    token_rewards = _token_rewards(r, loss_mask, kl=kl, kl_coef=kl_coef)
    adv, _ = gae_advantages(token_rewards, values.double(), loss_mask, gamma=gamma, lam=lam)
    return adv
