"""Trajectories → training sequences: alignment, fan-out, exclusions, clear errors."""

from __future__ import annotations

import pytest
from _train_helpers import trajectories, vocab_size

from agentrl.algorithms import group_advantages
from agentrl.train import BatchingConfig, TrainingBatch, build_training_batch
from agentrl.train.batching import NoTrainableTrajectoriesError
from agentrl.trajectory import Status, Trajectory


def test_sequences_are_position_aligned() -> None:
    trajs = trajectories(2, 3, seed=1)
    batch = build_training_batch(trajs)
    assert batch.num_rollouts == 6 and len(batch.sequences) == 6
    rewards = [t.reward for t in trajs]
    expected_adv = group_advantages(rewards, [t.group_id for t in trajs]).tolist()
    for traj, seq, adv in zip(trajs, batch.sequences, expected_adv, strict=True):
        p = traj.prompt_length
        assert seq.tokens == traj.tokens
        assert seq.loss_mask == [0] * p + traj.loss_mask
        assert seq.rollout_logprobs[p:] == traj.logprobs and seq.rollout_logprobs[:p] == [0.0] * p
        assert seq.advantages == pytest.approx([adv * m for m in seq.loss_mask])
        assert seq.denominator == traj.num_trainable_tokens


def test_fan_out_shares_denominator_and_counts_rollout_once() -> None:
    trajs = trajectories(2, 3, seed=2, fan_out=True)
    batch = build_training_batch(trajs, BatchingConfig(std_normalize=False))
    assert len(batch.sequences) == 8 and batch.num_rollouts == 6
    first, second = batch.sequences[0], batch.sequences[1]
    assert first.rollout_id == second.rollout_id
    total = trajs[0].num_trainable_tokens + trajs[1].num_trainable_tokens
    assert first.denominator == second.denominator == total
    # Group g0: rewards of its three rollouts, each counted once.
    rewards = [trajs[0].reward, trajs[2].reward, trajs[3].reward]
    mean = sum(rewards) / 3
    trainable = [a for a, m in zip(first.advantages, first.loss_mask, strict=True) if m]
    assert trainable == pytest.approx([trajs[0].reward - mean] * len(trainable))


@pytest.mark.parametrize("estimator", ["gspo", "cispo", "reinforce_pp", "reinforce_pp_baseline"])
def test_std_normalize_off_is_rejected_where_it_has_no_effect(estimator: str) -> None:
    with pytest.raises(ValueError, match=r"std_normalize: expected True .*estimator='dr_grpo', got False"):
        BatchingConfig(estimator=estimator, std_normalize=False)  # type: ignore[arg-type]
    BatchingConfig(estimator="dr_grpo", std_normalize=False)  # consistent: dr_grpo never divides by the std


def test_infra_failures_are_excluded_and_reported() -> None:
    trajs = trajectories(1, 4, seed=3)
    failed = Trajectory.from_prompt([1, 2, 3], group_id="g0", rollout_id="boom")
    failed.finish(Status.FAILED)
    batch = build_training_batch([*trajs, failed])
    assert batch.excluded == [("boom", "failed")]
    assert "boom" not in {s.rollout_id for s in batch.sequences}


def test_a_batch_with_nothing_to_train_raises_its_own_error() -> None:
    failed = Trajectory.from_prompt([1, 2, 3], group_id="g0", rollout_id="boom")
    failed.finish(Status.FAILED)
    with pytest.raises(NoTrainableTrajectoriesError, match=r"got 1 \(1 excluded by status\)"):
        build_training_batch([failed])
    trajs = trajectories(1, 2, seed=4)
    trajs[1].reward = None
    with pytest.raises(ValueError) as other:  # any other bad input is not "nothing to train"
        build_training_batch(trajs)
    assert not isinstance(other.value, NoTrainableTrajectoriesError)


def test_bad_input_errors_name_the_field() -> None:
    trajs = trajectories(1, 2, seed=4)
    trajs[1].reward = None
    with pytest.raises(ValueError, match=r"trajectories\[1\]\.reward: missing"):
        build_training_batch(trajs)
    trajs = trajectories(1, 2, seed=4)
    trajs[0].group_id = None
    with pytest.raises(ValueError, match=r"trajectories\[0\]\.group_id: missing"):
        build_training_batch(trajs)
    with pytest.raises(ValueError, match="trajectories: expected at least one trainable trajectory, got 0"):
        build_training_batch([])
    long = trajectories(1, 1, seed=5, max_len=30)
    with pytest.raises(ValueError, match=r"exceed max_sequence_length=5"):
        build_training_batch(long, BatchingConfig(max_sequence_length=5))
    with pytest.raises(ValueError, match="estimator: expected a critic-free estimator"):
        BatchingConfig(estimator="ppo")  # type: ignore[arg-type]


def test_from_sequences_counts_rollouts() -> None:
    batch = build_training_batch(trajectories(2, 2, seed=6, fan_out=True))
    again = TrainingBatch.from_sequences(batch.sequences)
    assert again.num_rollouts == batch.num_rollouts == 4
    assert vocab_size() > max(max(s.tokens) for s in batch.sequences)


def test_train_sequence_checks_lengths() -> None:
    from agentrl.train import TrainSequence

    with pytest.raises(ValueError, match="advantages: expected 3 entries"):
        TrainSequence(tokens=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0, -1, -1], advantages=[0, 1],
                      rollout_id="r", group_id="g", reward=1.0, denominator=2)
    with pytest.raises(ValueError, match="old_logprobs: expected 3 entries"):
        TrainSequence(tokens=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0, -1, -1], advantages=[0, 1, 1],
                      rollout_id="r", group_id="g", reward=1.0, denominator=2, old_logprobs=[0.0])
    with pytest.raises(ValueError, match=r"loss_mask\[0\]: the first token has no context"):
        TrainSequence(tokens=[1, 2], loss_mask=[1, 1], rollout_logprobs=[0, -1], advantages=[1, 1],
                      rollout_id="r", group_id="g", reward=1.0, denominator=2)
