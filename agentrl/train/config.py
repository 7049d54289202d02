"""Typed, validated configs for batching, packing, the loss and the torch backend.

Each component receives its own config; none sees a root config. All are frozen dataclasses that
check their values on construction and name the field, the value and what was expected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Literal, get_args

from annotated_types import Ge, Gt, Le

from agentrl._limits import check_limits
from agentrl.algorithms.kinds import (
    DEFAULT_CHUNK_SIZE,
    AdvantageEstimator,
    KLKind,
    LossAggregation,
    PolicyLossKind,
    RoutingReplay,
)
from agentrl.trajectory import Status

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_LORA_LR", "DEFAULT_TARGET_MODULES", "BatchingConfig", "LoraSettings", "LossConfig", "OptimizerConfig",
           "PackingConfig", "TorchBackendConfig"]




def _torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


def _enum_field(name: str, kind: type[RoutingReplay], value: object) -> RoutingReplay:
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name}: expected one of {[m.value for m in kind]}, got {value!r}") from None


def _require(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")


@dataclass(frozen=True)
class BatchingConfig:
    """Trajectories → training sequences.

    ``exclude_statuses``: trajectories that ended for infrastructure reasons are left out of the
    group statistics and the batch (reported in :attr:`TrainingBatch.excluded`, never dropped
    silently). ``max_sequence_length``: longer sequences raise instead of being truncated.
    ``std_normalize=False`` drops the std division of ``grpo`` (making it ``dr_grpo``'s advantage);
    the other estimators fix their own normalisation, so it is rejected for them.
    ``teacher_coef`` (β > 0: on-policy distillation) adds ``β · (log π_T − log μ)`` to each sampled
    token's advantage, from the trajectories' ``teacher_logprobs`` channel
    (:mod:`agentrl.algorithms.distill`); ``task_reward=False`` drops the estimator's advantage
    (distillation alone).
    """

    estimator: AdvantageEstimator = AdvantageEstimator.GRPO
    std_normalize: bool = True
    eps: float = 1e-6
    exclude_statuses: tuple[Status, ...] = (Status.ABORTED, Status.FAILED)
    max_sequence_length: int | None = None
    teacher_coef: float = 0.0
    task_reward: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "estimator", AdvantageEstimator(self.estimator))
        _require(self.estimator is not AdvantageEstimator.PPO, "estimator", self.estimator.value,
                 "a critic-free estimator (the torch backend has no value model yet)")
        _require(self.std_normalize or self.estimator in (AdvantageEstimator.GRPO, AdvantageEstimator.DR_GRPO),
                 "std_normalize", self.std_normalize,
                 f"True with estimator {self.estimator.value!r} (only 'grpo' reads it); for group centring "
                 "without the std division use estimator='dr_grpo'")
        _require(self.eps >= 0, "eps", self.eps, "a non-negative number")
        _require(self.max_sequence_length is None or self.max_sequence_length > 1, "max_sequence_length",
                 self.max_sequence_length, "None or an integer > 1")
        _require(isinstance(self.teacher_coef, (int, float)) and not isinstance(self.teacher_coef, bool)
                 and math.isfinite(self.teacher_coef) and self.teacher_coef >= 0, "teacher_coef", self.teacher_coef,
                 "a finite number >= 0 (β, the teacher's weight; 0: no distillation)")
        _require(self.task_reward or self.teacher_coef > 0, "task_reward", self.task_reward,
                 "True unless teacher_coef > 0 (without the task reward and without a teacher nothing is learned)")


@dataclass(frozen=True)
class PackingConfig:
    """Packing sequences into micro-batches of at most ``max_tokens`` input tokens each."""

    max_tokens: int = 8192
    algorithm: Literal["first_fit_decreasing", "best_fit_decreasing"] = "best_fit_decreasing"

    def __post_init__(self) -> None:
        _require(self.max_tokens > 0, "max_tokens", self.max_tokens, "a positive token budget")
        _require(self.algorithm in ("first_fit_decreasing", "best_fit_decreasing"), "algorithm", self.algorithm,
                 "'first_fit_decreasing' or 'best_fit_decreasing'")


@dataclass(frozen=True)
class LossConfig:
    """The step objective: policy loss, reduction, KL and entropy terms, mismatch correction.

    ``temperature`` must equal the rollout sampling temperature (engine logprobs are reported after
    temperature scaling). ``old_logprobs``: ``"recompute"`` (a no-grad forward at the start of the
    step), ``"rollout"`` (use the engine's), or ``"detached"`` (``sg[ℓθ]``: ratio 1, one forward
    saved; valid for one optimiser step per rollout). ``opsm_delta``: mask sequences with negative
    advantage whose policy drifted by more than this (off-policy sequence mask); None disables it.
    ``routing_replay``: ``"rollout"`` replays the engine's expert choices in every MoE forward of the
    step (:class:`~agentrl.algorithms.RoutingReplay`); ``"off"`` lets the trainer route.
    """

    policy_loss: PolicyLossKind = PolicyLossKind.PPO
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    dual_clip_c: float | None = None
    aggregation: LossAggregation = LossAggregation.ROLLOUT_TOKEN_MEAN
    constant_normalizer: float | None = None
    kl_loss_coef: float = 0.0
    kl_loss_type: KLKind = "low_var_kl"
    entropy_coef: float = 0.0
    correction: Literal["none", "tis", "mis"] = "none"
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    mis_low: float = 0.5
    mis_high: float = 2.0
    opsm_delta: float | None = None
    temperature: float = 1.0
    old_logprobs: Literal["recompute", "rollout", "detached"] = "recompute"
    routing_replay: RoutingReplay = RoutingReplay.OFF

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy_loss", PolicyLossKind(self.policy_loss))
        object.__setattr__(self, "routing_replay", _enum_field("routing_replay", RoutingReplay, self.routing_replay))
        object.__setattr__(self, "aggregation", LossAggregation(self.aggregation))
        _require(self.temperature > 0, "temperature", self.temperature, "a positive number")
        _require(self.kl_loss_coef >= 0, "kl_loss_coef", self.kl_loss_coef, "a non-negative number")
        kinds = get_args(KLKind)
        _require(self.kl_loss_type in kinds, "kl_loss_type", self.kl_loss_type,
                 "one of " + ", ".join(repr(k) for k in kinds))
        _require(self.correction in ("none", "tis", "mis"), "correction", self.correction, "'none', 'tis' or 'mis'")
        _require(self.old_logprobs in ("recompute", "rollout", "detached"), "old_logprobs", self.old_logprobs,
                 "'recompute', 'rollout' or 'detached'")
        _require(not (self.correction != "none" and self.old_logprobs == "rollout"), "correction", self.correction,
                 "'none' when old_logprobs='rollout' (the correction would always be 1)")
        _require(self.opsm_delta is None or self.opsm_delta >= 0, "opsm_delta", self.opsm_delta, "None or >= 0")
        _require(self.dual_clip_c is None or self.dual_clip_c > 1, "dual_clip_c", self.dual_clip_c, "None or > 1")
        if self.aggregation is LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM:
            _require(self.constant_normalizer is not None and self.constant_normalizer > 0, "constant_normalizer",
                     self.constant_normalizer, "a positive constant (e.g. the max response length) for Dr.GRPO")


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW settings and the learning-rate schedule; ``grad_clip`` is the max global gradient norm
    (None: no clipping).

    ``schedule``: linear warm-up over ``warmup_steps`` to ``lr``, then ``constant`` or ``cosine``
    decay to ``lr × min_lr_ratio`` at ``decay_steps`` (``None``: the run's last step, see
    :meth:`lr_at`). A train backend builds its optimiser with ``lr``; whoever drives the steps (the
    runner, the SFT loop) sets each step's rate from :meth:`lr_at`.
    """

    lr: Annotated[float, Gt(0.0)] = 1e-6
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: Annotated[float, Ge(0.0)] = 0.1
    eps: Annotated[float, Gt(0.0)] = 1e-8
    grad_clip: Annotated[float, Gt(0.0)] | None = 1.0
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: Annotated[int, Ge(0)] = 0
    decay_steps: Annotated[int, Ge(1)] | None = None
    min_lr_ratio: Annotated[float, Ge(0.0), Le(1.0)] = 0.0

    def __post_init__(self) -> None:
        check_limits(self)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"OptimizerConfig.betas={self.betas!r}: expected two values in [0, 1)")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"OptimizerConfig.schedule={self.schedule!r}: expected 'constant' or 'cosine'")
        if self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"OptimizerConfig.decay_steps={self.decay_steps}: expected more than warmup_steps="
                             f"{self.warmup_steps}")

    def lr_at(self, step: int, total_steps: int | None = None) -> float:
        """The learning rate of optimiser step ``step`` (0-based); ``total_steps`` stands in for an
        unset ``decay_steps``. Warm-up reaches ``lr`` at step ``warmup_steps``."""
        if step < 0:
            raise ValueError(f"step={step}: expected an int >= 0")
        if step < self.warmup_steps:
            return self.lr * (step + 1) / (self.warmup_steps + 1)
        if self.schedule == "constant":
            return self.lr
        end = self.decay_steps if self.decay_steps is not None else total_steps
        if end is None:
            raise ValueError("schedule='cosine' needs decay_steps or total_steps; got neither")
        span = max(end - self.warmup_steps, 1)
        progress = min((step - self.warmup_steps) / span, 1.0)
        floor = self.lr * self.min_lr_ratio
        return floor + (self.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Qwen/Llama decoder block (what SGLang calls ``all`` but the embeddings)."""

DEFAULT_LORA_LR = 1e-5
"""A LoRA run's learning rate unless one is set: about ten times full fine-tuning's RL rate (1e-6)."""


@dataclass(frozen=True)
class LoraSettings:
    """The adapter: ``rank`` r, ``alpha`` (the update is scaled by ``alpha / rank``), ``dropout``
    (0: trainer, scorer and engine agree) and the ``target_modules`` (module names, as peft and
    SGLang take them)."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoraSettings.rank={self.rank!r}: expected an int >= 1")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ValueError(f"LoraSettings.alpha={self.alpha!r}: expected a number > 0")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"LoraSettings.dropout={self.dropout!r}: expected a number in [0, 1)")
        if isinstance(self.target_modules, str) or not self.target_modules or \
                not all(isinstance(m, str) and m for m in self.target_modules):
            raise ValueError(f"LoraSettings.target_modules={self.target_modules!r}: expected a non-empty list of "
                             f"module names, e.g. {list(DEFAULT_TARGET_MODULES)}")
        object.__setattr__(self, "target_modules", tuple(self.target_modules))

    @property
    def scale(self) -> float:
        return float(self.alpha) / self.rank


@dataclass(frozen=True)
class TorchBackendConfig:
    """The plain PyTorch train backend.

    ``device``: ``"auto"``, ``"cpu"``, ``"cuda[:i]"`` or ``"npu[:i]"``. ``dtype``: the compute dtype of
    the model, ``"float32"`` by default, ``"float64"`` for exact tests. For ``"bfloat16"``/``"float16"``
    ``master_weights="float32"`` (the default) keeps float32 master weights, gradients and optimizer
    state (:mod:`agentrl.train.precision`): RL learning rates (~1e-6) are below bfloat16's resolution,
    so without them most weights would not move; ``"none"`` trains the low-precision weights directly
    (with a warning naming the smallest update they can take). ``autocast``: run forward passes of a
    float32 model in ``"bfloat16"``/``"float16"`` (the older way to mix precisions).
    ``sharding``: with data parallelism, ``"fsdp"`` shards parameters, gradients and optimizer state
    over the ranks (PyTorch FSDP2, :mod:`agentrl.train.sharding`); ``"none"`` replicates them and sums
    gradients with an all-reduce; ``"auto"`` is ``"fsdp"`` with more than one rank.
    ``optimizer_offload``: keep the optimizer state (and the master weights) in host memory and step
    there (slower steps, much less device memory).
    ``activation_checkpointing``: ``"none"``, ``"full"`` (each decoder layer keeps its input only and
    is recomputed) or ``"selective"`` (each layer's MLP is recomputed) (:mod:`agentrl.train.recompute`).
    ``attention``: how a packed row is attended (:mod:`agentrl.train.attention`): ``"auto"`` picks
    flash-attn's varlen kernel where installed, else torch's ``varlen_attn`` on CUDA, else causal
    attention per document (``"per_document"``); none builds a mask across the row. ``"model"`` keeps
    the model's own attention (transformers' dense ``[S, S]`` mask for ``sdpa``).
    ``logprob_chunk_size``: rows per chunk of the log-softmax. ``fused_lm_head``: score tokens from
    the decoder's hidden states and the output embedding inside the model's forward, never building
    the ``[tokens, vocab]`` logits (checked against the model's own logits on start); ``None`` (auto):
    on when the model's output embedding is a bias-free linear layer. ``verify_packing``: on start,
    check that the model attends within packed sequences only (a model without packed-sequence
    support would silently mix them). ``shared_prefix``: when the sequences of a micro-batch share at
    least ``shared_prefix_min_tokens`` leading tokens (a group's prompt), run that prefix once and
    reuse its keys and values for every sequence, in scoring and in the training step; plan
    micro-batches so that such sequences land together (:mod:`agentrl.train.prefix`). Exact: the same
    losses and gradients as the plain path, up to float rounding (checked on a probe on start). It is
    turned off under sharding and activation checkpointing (both need one forward per row).
    ``export_dtype``: the dtype of exported weights (``"auto"``: the compute dtype); the run sets it
    to ``model.dtype``, what the engines serve.
    ``lora``: train a LoRA adapter on the frozen model instead of the model itself
    (:mod:`agentrl.train.lora`); the base is replicated on every rank (``sharding`` ``"auto"`` means
    ``"none"`` then: only the adapter's gradients are summed).
    """

    device: str = "auto"
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = "float32"
    autocast: Literal["none", "bfloat16", "float16"] = "none"
    packing: PackingConfig = field(default_factory=PackingConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    logprob_chunk_size: int = DEFAULT_CHUNK_SIZE
    fused_lm_head: bool | None = None
    verify_packing: bool = True
    shared_prefix: bool = True
    shared_prefix_min_tokens: int = 32
    seed: int = 0
    master_weights: Literal["float32", "none"] = "float32"
    sharding: Literal["auto", "none", "fsdp"] = "auto"
    optimizer_offload: bool = False
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    attention: Literal["auto", "flash_attn", "varlen", "per_document", "model"] = "auto"
    export_dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    lora: LoraSettings | None = None

    def __post_init__(self) -> None:
        _require(self.lora is None or isinstance(self.lora, LoraSettings), "lora", self.lora,
                 "None or a LoraSettings")
        _require(self.lora is None or self.sharding != "fsdp", "sharding", self.sharding,
                 "'auto' or 'none' with lora (the frozen base is replicated; FSDP would shard a model that does "
                 "not train)")
        _require(self.dtype in ("float32", "bfloat16", "float16", "float64"), "dtype", self.dtype,
                 "'float32', 'bfloat16', 'float16' or 'float64'")
        _require(self.autocast in ("none", "bfloat16", "float16"), "autocast", self.autocast,
                 "'none', 'bfloat16' or 'float16'")
        _require(self.master_weights in ("float32", "none"), "master_weights", self.master_weights,
                 "'float32' or 'none'")
        _require(self.sharding in ("auto", "none", "fsdp"), "sharding", self.sharding, "'auto', 'none' or 'fsdp'")
        _require(self.activation_checkpointing in ("none", "full", "selective"), "activation_checkpointing",
                 self.activation_checkpointing, "'none', 'full' or 'selective'")
        _require(self.attention in ("auto", "flash_attn", "varlen", "per_document", "model"), "attention",
                 self.attention, "'auto', 'flash_attn', 'varlen', 'per_document' or 'model'")
        _require(self.export_dtype in ("auto", "bfloat16", "float16", "float32"), "export_dtype", self.export_dtype,
                 "'auto', 'bfloat16', 'float16' or 'float32'")
        _require(not (self.autocast != "none" and self.dtype in ("bfloat16", "float16")), "autocast", self.autocast,
                 f"'none' with dtype={self.dtype!r} (the model already computes in {self.dtype})")
        _require(isinstance(self.shared_prefix, bool), "shared_prefix", self.shared_prefix, "True or False")
        _require(isinstance(self.shared_prefix_min_tokens, int) and self.shared_prefix_min_tokens >= 1,
                 "shared_prefix_min_tokens", self.shared_prefix_min_tokens,
                 "a positive integer (the shortest common prefix worth running once)")
        _require(self.logprob_chunk_size > 0, "logprob_chunk_size", self.logprob_chunk_size, "a positive integer")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The parameter dtype, ``dtype`` as a ``torch.dtype``."""
        return _torch_dtype(self.dtype)

    @property
    def uses_master_weights(self) -> bool:
        """Whether float32 master weights back a low-precision model."""
        return self.dtype in ("bfloat16", "float16") and self.master_weights == "float32"

    @property
    def export_torch_dtype(self) -> torch.dtype:
        """The dtype exported weights are written in."""
        return _torch_dtype(self.dtype if self.export_dtype == "auto" else self.export_dtype)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The forward-pass dtype under mixed precision, or None when ``autocast="none"``."""
        return None if self.autocast == "none" else _torch_dtype(self.autocast)
