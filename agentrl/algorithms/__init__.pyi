"""Type stub: the public names of agentrl.algorithms (imported lazily at runtime, see __init__.py)."""

from .advantages import (
    gae_advantages,
    group_advantages,
    masked_whiten,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)
from .correction import (
    mis_weights,
    mismatch_metrics,
    sequence_tis_weights,
    tis_weights,
)
from .distill import (
    distillation_advantages,
    distillation_metrics,
    mix_advantages,
)
from .estimators import (
    compute_advantages,
)
from .fused_logprobs import (
    entropy_from_hidden,
    logprobs_from_hidden,
    scores_from_hidden,
)
from .kinds import (
    DEFAULT_CHUNK_SIZE,
    AdvantageEstimator,
    KLKind,
    LossAggregation,
    PolicyLossKind,
    RoutingReplay,
    default_aggregation,
    policy_loss_for,
)
from .kl import (
    kl,
)
from .logprobs import (
    entropy_from_logits,
    logprobs_from_logits,
)
from .losses import (
    cispo_loss,
    gspo_loss,
    opsm_mask,
    ppo_clip_loss,
    sequence_mean,
    value_loss,
)
from .reduce import (
    reduce_loss,
    rollout_denominators,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "AdvantageEstimator",
    "KLKind",
    "LossAggregation",
    "PolicyLossKind",
    "RoutingReplay",
    "cispo_loss",
    "compute_advantages",
    "default_aggregation",
    "distillation_advantages",
    "distillation_metrics",
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
    "mix_advantages",
    "opsm_mask",
    "policy_loss_for",
    "ppo_clip_loss",
    "reduce_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rollout_denominators",
    "scores_from_hidden",
    "sequence_mean",
    "sequence_tis_weights",
    "tis_weights",
    "value_loss",
]
