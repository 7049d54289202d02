"""GRPO-family RL math as pure functions of tensors.

Advantages (:func:`group_advantages`, REINFORCE++, GAE), per-token policy losses
(:func:`ppo_clip_loss`, :func:`gspo_loss`, :func:`cispo_loss`), KL estimators (:func:`kl`),
train/inference mismatch weights (:func:`tis_weights`, :func:`mis_weights`), the packing-invariant
reducer (:func:`reduce_loss`) and chunked log-probs/entropy from logits. No module here holds
state, touches a model, or talks to another process; the formulas follow the RL-math reference.
"""

from agentrl.algorithms.advantages import (
    gae_advantages,
    group_advantages,
    masked_whiten,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)
from agentrl.algorithms.correction import mis_weights, mismatch_metrics, sequence_tis_weights, tis_weights
from agentrl.algorithms.estimators import (
    AdvantageEstimator,
    PolicyLossKind,
    compute_advantages,
    default_aggregation,
    policy_loss_for,
)
from agentrl.algorithms.fused_logprobs import entropy_from_hidden, logprobs_from_hidden
from agentrl.algorithms.kl import KLKind, kl
from agentrl.algorithms.logprobs import DEFAULT_CHUNK_SIZE, entropy_from_logits, logprobs_from_logits
from agentrl.algorithms.losses import (
    cispo_loss,
    gspo_loss,
    opsm_mask,
    ppo_clip_loss,
    sequence_mean,
    value_loss,
)
from agentrl.algorithms.reduce import LossAggregation, reduce_loss, rollout_denominators

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "AdvantageEstimator",
    "KLKind",
    "LossAggregation",
    "PolicyLossKind",
    "cispo_loss",
    "compute_advantages",
    "default_aggregation",
    "entropy_from_hidden",
    "entropy_from_logits",
    "gae_advantages",
    "group_advantages",
    "gspo_loss",
    "kl",
    "logprobs_from_hidden",
    "logprobs_from_logits",
    "masked_whiten",
    "mis_weights",
    "mismatch_metrics",
    "opsm_mask",
    "policy_loss_for",
    "ppo_clip_loss",
    "reduce_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rollout_denominators",
    "sequence_mean",
    "sequence_tis_weights",
    "tis_weights",
    "value_loss",
]
