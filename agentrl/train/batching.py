"""Trajectories → training sequences with per-token advantages and per-rollout denominators.

One trajectory becomes one :class:`TrainSequence`; several trajectories may share a rollout id
(fan-out: forks of one episode). Group statistics count each rollout once, and every sequence
carries its rollout's full trainable-token count ``denominator`` so any packing or split of the
batch reduces to the same objective (see :mod:`agentrl.algorithms.reduce`).

All per-token lists of a :class:`TrainSequence` are aligned to ``tokens`` positions: entry ``t``
describes token ``t`` (prompt positions have mask 0, logprob 0, advantage 0).

Example::

    batch = build_training_batch(trajectories, BatchingConfig(estimator="grpo"))
    batch.num_rollouts, batch.sequences[0].advantages
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from agentrl.algorithms import (
    AdvantageEstimator,
    compute_advantages,
    distillation_advantages,
    distillation_metrics,
    mix_advantages,
    rollout_denominators,
)
from agentrl.episode import Episode
from agentrl.token_data import TEACHER_LOGPROBS, TokenChannel
from agentrl.train.config import BatchingConfig
from agentrl.trajectory import Trajectory

__all__ = ["NoTrainableTrajectoriesError", "TrainSequence", "TrainingBatch", "build_training_batch"]


class NoTrainableTrajectoriesError(ValueError):
    """:func:`build_training_batch` was given no trajectory it could train on (none, or every one
    left out by status): a step with nothing to train, which a caller may skip."""


@dataclass
class TrainSequence:
    """One training sequence; per-token lists are aligned with ``tokens``.

    ``denominator`` is the number of trainable tokens of the whole rollout (over all its
    sequences), fixed before any split. ``ref_logprobs``/``old_logprobs`` are filled by a backend.
    ``channels``: the trajectory's per-token side data (:mod:`agentrl.token_data`), aligned with ``tokens``.
    """

    tokens: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantages: list[float]
    rollout_id: str
    group_id: str
    reward: float
    denominator: float
    sample_id: str | None = None
    ref_logprobs: list[float] | None = None
    old_logprobs: list[float] | None = None
    channels: dict[str, TokenChannel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in ("loss_mask", "rollout_logprobs", "advantages", "old_logprobs", "ref_logprobs"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"{name}: expected {n} entries (one per token), got {len(values)}")
        for name, channel in self.channels.items():
            if len(channel) != n:
                raise ValueError(f"channels[{name!r}]: expected {n} rows (one per token), got {len(channel)}")
        if n < 1:
            raise ValueError("tokens: expected at least one token, got an empty sequence")
        if self.loss_mask[0]:
            raise ValueError("loss_mask[0]: the first token has no context to be scored from; expected 0")

    @property
    def num_trainable(self) -> int:
        return sum(self.loss_mask)


@dataclass
class TrainingBatch:
    """The sequences of one optimiser step and the counts the reducer needs.

    ``num_rollouts`` is B (distinct rollout ids, including rollouts without trainable tokens);
    ``excluded`` lists ``(rollout id, status)`` of trajectories left out by status; ``metrics``:
    figures of how the advantages were made (``distill/*`` with a teacher, see
    :func:`~agentrl.algorithms.distillation_metrics`).
    """

    sequences: list[TrainSequence]
    num_rollouts: int
    excluded: list[tuple[str, str]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def num_trainable_tokens(self) -> int:
        return sum(s.num_trainable for s in self.sequences)

    @classmethod
    def from_sequences(cls, sequences: Sequence[TrainSequence]) -> TrainingBatch:
        return cls(sequences=list(sequences), num_rollouts=len({s.rollout_id for s in sequences}))


def _ids(traj: Trajectory, index: int) -> tuple[str, str, float]:
    rollout_id = traj.rollout_id if traj.rollout_id is not None else traj.sample_id
    if rollout_id is None:
        raise ValueError(f"trajectories[{index}].rollout_id: missing (and no sample_id); every trajectory needs one")
    if traj.group_id is None:
        raise ValueError(f"trajectories[{index}].group_id: missing; group normalisation keys on it")
    if traj.reward is None:
        raise ValueError(f"trajectories[{index}].reward: missing (rollout {rollout_id!r}); score it before training")
    return str(rollout_id), str(traj.group_id), float(traj.reward)


def build_training_batch(trajectories: Sequence[Trajectory | Episode],
                         config: BatchingConfig | None = None) -> TrainingBatch:
    """Validate trajectories, compute advantages with ``config.estimator`` and build the batch.

    Pass :class:`~agentrl.episode.Episode` objects as they come from the agent loop: every sequence
    of a forked episode becomes a training sequence (``trajectories[i]`` in errors then counts the
    sequences in order). Raises ``ValueError`` for an empty batch, missing ids or rewards,
    sequences over ``max_sequence_length``, and fan-out rollouts whose sequences disagree on reward
    or group; :class:`NoTrainableTrajectoriesError` (a ``ValueError``) when no trajectory is left to train.
    """
    cfg = config or BatchingConfig()
    flat: list[Trajectory] = [seq for item in trajectories
                              for seq in (item.sequences if isinstance(item, Episode) else (item,))]
    kept: list[tuple[Trajectory, str, str, float]] = []
    excluded: list[tuple[str, str]] = []
    for i, traj in enumerate(flat):
        if traj.message_level:  # before the status filter: refused whatever its status
            raise ValueError(
                f"trajectories[{i}]: rollout {traj.rollout_id or traj.sample_id!r} is message-level (run against a "
                "chat-completions endpoint: messages only, no token ids, loss mask or logprobs); such episodes can "
                "never enter a training batch: use them for evaluation or as SFT conversations"
            )
        if traj.status in cfg.exclude_statuses:
            excluded.append((str(traj.rollout_id or traj.sample_id), traj.status.value))
            continue
        traj.validate()
        rid, gid, reward = _ids(traj, i)
        if cfg.max_sequence_length is not None and len(traj.tokens) > cfg.max_sequence_length:
            raise ValueError(
                f"trajectories[{i}].tokens: {len(traj.tokens)} tokens (rollout {rid!r}) exceed "
                f"max_sequence_length={cfg.max_sequence_length}; truncate or filter at rollout time"
            )
        kept.append((traj, rid, gid, reward))
    if not kept:
        raise NoTrainableTrajectoriesError(
            f"trajectories: expected at least one trainable trajectory, got {len(flat)} "
            f"({len(excluded)} excluded by status)"
        )
    width = max(max(t.response_length for t, *_ in kept), 1)
    mask = torch.zeros(len(kept), width, dtype=torch.long)
    for row, (traj, *_rest) in enumerate(kept):
        mask[row, : traj.response_length] = torch.tensor(traj.loss_mask, dtype=torch.long)
    estimator = cfg.estimator
    if estimator is AdvantageEstimator.GRPO and not cfg.std_normalize:
        estimator = AdvantageEstimator.DR_GRPO  # the same centring without the std division
    rollout_ids = [rid for _, rid, _, _ in kept]
    adv = compute_advantages(
        estimator, [r for *_, r in kept], [g for _, _, g, _ in kept], mask, rollout_ids=rollout_ids, eps=cfg.eps,
    )
    metrics: dict[str, float] = {}
    if cfg.teacher_coef > 0:
        adv, metrics = _distill(adv, mask, [t for t, *_ in kept], cfg)
    denominators = rollout_denominators([t.loss_mask for t, *_ in kept], rollout_ids)
    sequences = []
    for row, (traj, rid, gid, reward) in enumerate(kept):
        p, n = traj.prompt_length, traj.response_length
        sequences.append(TrainSequence(
            tokens=list(traj.tokens),
            loss_mask=[0] * p + list(traj.loss_mask),
            rollout_logprobs=[0.0] * p + list(traj.logprobs),
            advantages=[0.0] * p + adv[row, :n].tolist(),
            rollout_id=rid, group_id=gid, reward=reward, denominator=denominators[row],
            sample_id=traj.sample_id, channels=dict(traj.channels),
        ))
    return TrainingBatch(sequences=sequences, num_rollouts=len(set(rollout_ids)), excluded=excluded, metrics=metrics)


def _distill(task_adv: torch.Tensor, mask: torch.Tensor, trajectories: list[Trajectory],
             cfg: BatchingConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The estimator's advantages mixed with the teacher's (:mod:`agentrl.algorithms.distill`), and the
    step's ``distill/*`` figures. Every trainable token needs its teacher row."""
    teacher = torch.zeros(mask.shape, dtype=torch.float64)
    behaviour = torch.zeros(mask.shape, dtype=torch.float64)
    for row, traj in enumerate(trajectories):
        p, n = traj.prompt_length, traj.response_length
        channel = traj.channels.get(TEACHER_LOGPROBS)
        trainable = mask[row, :n].bool().numpy()
        present = channel.present[p:] if channel is not None else np.zeros(n, dtype=bool)
        missing = int((trainable & ~present).sum())
        if missing:
            why = next((str(e) for e in traj.errors if e.component == "teacher"), None)
            raise ValueError(
                f"trajectories[{row}].channels[{TEACHER_LOGPROBS!r}]: rollout {traj.rollout_id or traj.sample_id!r} "
                f"lacks the teacher's logprob on {missing} of its {int(trainable.sum())} trainable tokens; distillation "
                f"(teacher_coef={cfg.teacher_coef:g}) needs every sampled token scored"
                + (f" ({why})" if why else " (was the batch scored by the teacher?)"))
        if channel is not None:
            teacher[row, :n] = torch.from_numpy(channel.values[p:].astype(np.float64))
        behaviour[row, :n] = torch.tensor(traj.logprobs, dtype=torch.float64)
    a_kl = distillation_advantages(teacher, behaviour, mask)
    mixed = mix_advantages(task_adv, a_kl, coef=cfg.teacher_coef, task=cfg.task_reward)
    figures = distillation_metrics(teacher, behaviour, mask, task_adv, a_kl, coef=cfg.teacher_coef,
                                   task=cfg.task_reward)
    return mixed, {f"distill/{k}": v for k, v in figures.items()}
