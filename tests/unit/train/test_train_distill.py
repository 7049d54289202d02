"""Distillation through the batch builder: the teacher channel becomes per-token advantages."""

from __future__ import annotations

import random

import numpy as np
import pytest
from _train_helpers import trajectories

from agentrl.algorithms import group_advantages
from agentrl.token_data import TEACHER_LOGPROBS
from agentrl.train import BatchingConfig, build_training_batch
from agentrl.trajectory import SegmentKind, Trajectory


def _with_teacher(seed: int) -> list[Trajectory]:
    rng = random.Random(seed)
    trajs = trajectories(2, 4, seed=seed)
    for t in trajs:  # the teacher scores the sampled tokens only (model segments)
        for seg in t.segments_of(SegmentKind.MODEL):
            t.write_channel(TEACHER_LOGPROBS, seg.start,
                            np.array([-rng.random() * 4 for _ in range(seg.length)], dtype=np.float32))
    return trajs


@pytest.mark.parametrize("with_task", [True, False])
def test_batch_advantages_are_task_plus_teacher_per_token(with_task: bool) -> None:
    trajs = _with_teacher(seed=7)
    batch = build_training_batch(trajs, BatchingConfig(teacher_coef=0.7, task_reward=with_task))
    task = group_advantages([t.reward for t in trajs], [t.group_id for t in trajs]).tolist()
    for traj, seq, a_task in zip(trajs, batch.sequences, task, strict=True):
        channel = traj.channels[TEACHER_LOGPROBS]
        for pos, (mask, adv) in enumerate(zip(seq.loss_mask, seq.advantages, strict=True)):
            if not mask:
                assert adv == 0.0 and not (pos >= traj.prompt_length and channel.present[pos])
                continue
            teacher = float(channel.values[pos])
            behaviour = traj.logprobs[pos - traj.prompt_length]
            assert adv == pytest.approx((a_task if with_task else 0.0) + 0.7 * (teacher - behaviour), abs=1e-6)
    assert batch.metrics["distill/tokens"] == sum(t.num_trainable_tokens for t in trajs)
    assert 0 < batch.metrics["distill/teacher_share"] <= 1.0
    plain = build_training_batch(trajs)
    assert plain.metrics == {}


def test_a_sampled_token_without_a_teacher_row_is_refused() -> None:
    trajs = _with_teacher(seed=8)
    del trajs[3].channels[TEACHER_LOGPROBS]
    with pytest.raises(ValueError, match=r"trajectories\[3\]\.channels\['teacher_logprobs'\]: rollout 'g0-r3' lacks "
                                         r"the teacher's logprob on \d+ of its \d+ trainable tokens"):
        build_training_batch(trajs, BatchingConfig(teacher_coef=1.0, task_reward=False))
    with pytest.raises(ValueError, match="task_reward: expected True unless teacher_coef > 0"):
        BatchingConfig(task_reward=False)
