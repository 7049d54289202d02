"""The names of the RL math, without torch: estimators, policy losses, loss reductions, KL kinds,
MoE routing replay.

Configs validate against these at load time, so a config can be checked (and a typo reported)
before torch is imported. The functions that use them live beside the tensors they act on.
"""

from __future__ import annotations

from typing import Literal, get_args

from agentrl._enum import NamedEnum

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "KL_KINDS",
    "AdvantageEstimator",
    "KLKind",
    "LossAggregation",
    "PolicyLossKind",
    "RoutingReplay",
    "default_aggregation",
    "policy_loss_for",
]

DEFAULT_CHUNK_SIZE = 128
"""Rows per chunk of log-prob/entropy. 128 rows of a 151,936 vocabulary are 78 MB of float32 per temporary."""

KLKind = Literal["k1", "k2", "k3", "low_var_kl"]
KL_KINDS: tuple[str, ...] = get_args(KLKind)


class AdvantageEstimator(NamedEnum):
    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    GSPO = "gspo"
    CISPO = "cispo"
    REINFORCE_PP = "reinforce_pp"
    REINFORCE_PP_BASELINE = "reinforce_pp_baseline"
    PPO = "ppo"


class PolicyLossKind(NamedEnum):
    PPO = "ppo"
    GSPO = "gspo"
    CISPO = "cispo"


class LossAggregation(NamedEnum):
    """How per-token losses become the step objective."""

    ROLLOUT_TOKEN_MEAN = "rollout_token_mean"
    TOKEN_MEAN = "token_mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq_mean_token_sum_norm"


class RoutingReplay(NamedEnum):
    """Which experts a mixture-of-experts training forward sends each token to.

    - ``off``: the trainer's own router picks them (its top-k over its own scores);
    - ``rollout``: the experts the engine chose while sampling (the trajectory's ``routed_experts``
      channel) are replayed in every MoE layer of every training forward (policy, old-policy,
      reference, and the recompute of checkpointed activations); only the top-k index sets are
      replayed, the gate weights are recomputed from the trainer's own router scores over those
      experts, so the router still gets gradient. A dense model ignores the setting.
    """

    OFF = "off"
    ROLLOUT = "rollout"


def policy_loss_for(estimator: AdvantageEstimator | str) -> PolicyLossKind:
    """The policy loss an estimator trains with."""
    est = AdvantageEstimator(estimator)
    if est is AdvantageEstimator.GSPO:
        return PolicyLossKind.GSPO
    if est is AdvantageEstimator.CISPO:
        return PolicyLossKind.CISPO
    return PolicyLossKind.PPO


def default_aggregation(estimator: AdvantageEstimator | str) -> LossAggregation:
    """The reduction an estimator is defined with (Dr.GRPO: constant normaliser)."""
    if AdvantageEstimator(estimator) is AdvantageEstimator.DR_GRPO:
        return LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM
    return LossAggregation.ROLLOUT_TOKEN_MEAN
