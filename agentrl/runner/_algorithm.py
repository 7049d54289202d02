"""The ``algorithm`` section: advantage estimator, policy loss, clipping, KL, entropy, mismatch correction.

Which policy losses fit which estimator is one table, :data:`ESTIMATOR_LOSSES` (the first loss of
each row is the estimator's own, used when ``policy_loss`` is unset):

=========================  ==================  ==============================================================
estimator                  losses              why
=========================  ==================  ==============================================================
``grpo``                   ``ppo``             GRPO with the GSPO/CISPO loss is estimator ``gspo``/``cispo``
``dr_grpo``                ``ppo``             Dr.GRPO is defined with the PPO token loss
``gspo``                   ``gspo``            the sequence-ratio loss is what makes it GSPO
``cispo``                  ``cispo``           the clipped stop-gradient IS weight is what makes it CISPO
``reinforce_pp``           ``ppo``, ``cispo``  token-level returns: any token loss; not GSPO's sequence ratio
``reinforce_pp_baseline``  ``ppo``, ``cispo``  as ``reinforce_pp``
``ppo``                    (none)              GAE needs a critic; no train backend has a value model yet
=========================  ==================  ==============================================================

Clip ranges default to the loss's own (:data:`LOSS_CLIP_DEFAULTS`): a GSPO ratio is a geometric mean
over a sequence and is clipped ~1000× tighter than a PPO token ratio.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentrl._config import Section
from agentrl.algorithms import (
    AdvantageEstimator,
    KLKind,
    LossAggregation,
    PolicyLossKind,
    RoutingReplay,
    default_aggregation,
)
from agentrl.train.config import BatchingConfig, LossConfig

__all__ = ["ESTIMATOR_LOSSES", "LOSS_CLIP_DEFAULTS", "AlgorithmSection"]

_E, _L = AdvantageEstimator, PolicyLossKind

ESTIMATOR_LOSSES: dict[AdvantageEstimator, tuple[PolicyLossKind, ...]] = {
    _E.GRPO: (_L.PPO,),
    _E.DR_GRPO: (_L.PPO,),
    _E.GSPO: (_L.GSPO,),
    _E.CISPO: (_L.CISPO,),
    _E.REINFORCE_PP: (_L.PPO, _L.CISPO),
    _E.REINFORCE_PP_BASELINE: (_L.PPO, _L.CISPO),
    _E.PPO: (),
}
"""Per estimator, the policy losses it trains with; the first is its default."""

LOSS_CLIP_DEFAULTS: dict[PolicyLossKind, tuple[float, float | None]] = {
    _L.PPO: (0.2, None),
    _L.GSPO: (3e-4, 4e-4),
    _L.CISPO: (1.0, 0.28),
}
"""``(eps_clip, eps_clip_high)`` per loss when the section leaves them unset (``None`` high: symmetric)."""


def _names(values: tuple[PolicyLossKind, ...]) -> str:
    return " or ".join(repr(v.value) for v in values)


class AlgorithmSection(Section):
    """The RL objective. ``None`` fields take the estimator's (or the loss's) own value.

    - ``policy_loss``: must fit the estimator (:data:`ESTIMATOR_LOSSES`); ``None``: its own.
    - ``aggregation``: ``None``: the estimator's reduction (``seq_mean_token_sum_norm`` for Dr.GRPO,
      which then needs ``constant_normalizer``, e.g. the max response length).
    - ``kl_coef``/``kl_kind``: a KL-to-reference loss term (needs a reference model).
    - ``correction``: train/inference mismatch weights, ``tis`` (truncated, ``tis_clip_low..tis_clip``)
      or ``mis`` (masked outside ``mis_low..mis_high``).
    - ``old_logprobs``: the ratio's denominator: ``recompute``, the engine's (``rollout``), ``detached``.
    - ``routing_replay``: for a mixture-of-experts model, ``rollout`` trains every token through the
      experts the engine routed it to while sampling (rollout routing replay; the engines are asked
      for their routing); ``off`` (default) lets the trainer's router choose
      (:class:`~agentrl.algorithms.RoutingReplay`, docs/training.md "MoE").
    """

    estimator: AdvantageEstimator = AdvantageEstimator.GRPO
    policy_loss: PolicyLossKind | None = None
    std_normalize: bool = True
    advantage_eps: float = Field(default=1e-6, ge=0.0)
    eps_clip: float | None = Field(default=None, ge=0.0)
    eps_clip_high: float | None = Field(default=None, ge=0.0)
    dual_clip_c: float | None = Field(default=None, gt=1.0)
    aggregation: LossAggregation | None = None
    constant_normalizer: float | None = Field(default=None, gt=0.0)
    kl_coef: float = Field(default=0.0, ge=0.0)
    kl_kind: KLKind = "low_var_kl"
    entropy_coef: float = Field(default=0.0, ge=0.0)
    correction: Literal["none", "tis", "mis"] = "none"
    tis_clip: float = Field(default=2.0, gt=0.0)
    tis_clip_low: float = Field(default=0.0, ge=0.0)
    mis_low: float = Field(default=0.5, ge=0.0)
    mis_high: float = Field(default=2.0, gt=0.0)
    opsm_delta: float | None = Field(default=None, ge=0.0)
    old_logprobs: Literal["recompute", "rollout", "detached"] = "recompute"
    routing_replay: RoutingReplay = RoutingReplay.OFF

    @property
    def resolved_policy_loss(self) -> PolicyLossKind:
        if self.policy_loss is not None:
            return self.policy_loss
        losses = ESTIMATOR_LOSSES[self.estimator]
        return losses[0] if losses else PolicyLossKind.PPO

    @property
    def resolved_aggregation(self) -> LossAggregation:
        return self.aggregation if self.aggregation is not None else default_aggregation(self.estimator)

    @property
    def resolved_clip(self) -> tuple[float, float | None]:
        """``(eps_clip, eps_clip_high)`` after the loss's defaults."""
        low, high = LOSS_CLIP_DEFAULTS[self.resolved_policy_loss]
        return (self.eps_clip if self.eps_clip is not None else low,
                self.eps_clip_high if self.eps_clip_high is not None else high)

    def to_batching_config(self, *, max_sequence_length: int | None = None) -> BatchingConfig:
        return BatchingConfig(estimator=self.estimator, std_normalize=self.std_normalize, eps=self.advantage_eps,
                              max_sequence_length=max_sequence_length)

    def to_loss_config(self, *, temperature: float = 1.0) -> LossConfig:
        """The :class:`LossConfig`; ``temperature`` is the rollout sampling temperature."""
        eps_clip, eps_clip_high = self.resolved_clip
        return LossConfig(
            policy_loss=self.resolved_policy_loss, eps_clip=eps_clip, eps_clip_high=eps_clip_high,
            dual_clip_c=self.dual_clip_c, aggregation=self.resolved_aggregation,
            constant_normalizer=self.constant_normalizer, kl_loss_coef=self.kl_coef, kl_loss_type=self.kl_kind,
            entropy_coef=self.entropy_coef, correction=self.correction, tis_clip=self.tis_clip,
            tis_clip_low=self.tis_clip_low, mis_low=self.mis_low, mis_high=self.mis_high,
            opsm_delta=self.opsm_delta, temperature=temperature, old_logprobs=self.old_logprobs,
            routing_replay=self.routing_replay,
        )

    @model_validator(mode="after")
    def _consistent(self) -> AlgorithmSection:
        problems = self._problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.to_batching_config()
        self.to_loss_config()
        return self

    def _problems(self) -> list[str]:
        out: list[str] = []
        est, losses = self.estimator, ESTIMATOR_LOSSES[self.estimator]
        if not losses:
            out.append(f"estimator={est.value!r}: GAE needs a critic and no train backend has a value model "
                       f"yet; expected one of {[e.value for e, ls in ESTIMATOR_LOSSES.items() if ls]}")
        elif self.policy_loss is not None and self.policy_loss not in losses:
            hint = {_L.GSPO: " (for GSPO use estimator='gspo')", _L.CISPO: " (for CISPO use estimator='cispo')"}
            out.append(f"policy_loss={self.policy_loss.value!r} does not fit estimator={est.value!r}: expected "
                       f"{_names(losses)}{hint.get(self.policy_loss, '') if est is _E.GRPO else ''}")
        if not self.std_normalize and est not in (_E.GRPO, _E.DR_GRPO):
            out.append(f"std_normalize=False with estimator={est.value!r}: only 'grpo' reads it (for group "
                       "centring without the std division use estimator='dr_grpo')")
        if self.dual_clip_c is not None and self.resolved_policy_loss is not _L.PPO:
            out.append(f"dual_clip_c={self.dual_clip_c} applies to the 'ppo' loss only, got policy loss "
                       f"{self.resolved_policy_loss.value!r}: expected None")
        if self.resolved_aggregation is LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM and self.constant_normalizer is None:
            out.append(f"constant_normalizer=None with aggregation 'seq_mean_token_sum_norm' (estimator "
                       f"{est.value!r}): expected a positive constant, e.g. the max response length")
        if self.tis_clip_low > self.tis_clip:
            out.append(f"tis_clip_low={self.tis_clip_low} > tis_clip={self.tis_clip}: expected tis_clip_low <= tis_clip")
        if self.mis_low > self.mis_high:
            out.append(f"mis_low={self.mis_low} > mis_high={self.mis_high}: expected mis_low <= mis_high")
        if self.correction != "none" and self.old_logprobs == "rollout":
            out.append(f"correction={self.correction!r} with old_logprobs='rollout': the weight would always be "
                       "1; expected correction='none' or old_logprobs='recompute'")
        return out
