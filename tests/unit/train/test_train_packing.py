"""Bin packing, rank balancing and collation of packed micro-batches."""

from __future__ import annotations

import random

import pytest
import torch
from _train_helpers import trajectories

from agentrl.train import (
    PackingConfig,
    build_training_batch,
    collate,
    pack_indices,
    partition_for_ranks,
    plan_micro_batches,
)


@pytest.mark.parametrize("algorithm", ["first_fit_decreasing", "best_fit_decreasing"])
def test_pack_covers_every_item_once_within_budget(algorithm: str) -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 100) for _ in range(200)]
    bins = pack_indices(lengths, 128, algorithm)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(200))
    assert all(sum(lengths[i] for i in b) <= 128 for b in bins)
    # Decreasing fit is within 11/9 OPT + 1; OPT >= ceil(total / budget).
    lower = -(-sum(lengths) // 128)
    assert len(bins) <= 11 * lower / 9 + 1


def test_best_fit_fills_tightest_bin() -> None:
    # Bins after 8, 7, 5, 4 (budget 10): A=8 (2 free), B=7 (3 free), C=5+4 (1 free). The last item, 1,
    # goes to the first bin with room under first-fit and to the tightest (C) under best-fit.
    lengths = [5, 8, 1, 7, 4]
    assert pack_indices(lengths, 10, "first_fit_decreasing") == [[1, 2], [3], [0, 4]]
    assert pack_indices(lengths, 10, "best_fit_decreasing") == [[1], [3], [0, 2, 4]]


def test_oversized_sequence_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"lengths\[1\]: a sequence of 50 input tokens does not fit max_tokens=40"):
        pack_indices([10, 50], 40)


def test_partition_balances_tokens_and_plans_cover_batch() -> None:
    rng = random.Random(1)
    lengths = [rng.randint(1, 500) for _ in range(64)]
    parts = partition_for_ranks(lengths, 4)
    loads = [sum(lengths[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= max(lengths)
    cfg = PackingConfig(max_tokens=600)
    plans = [plan_micro_batches(lengths, cfg, world_size=4, rank=r) for r in range(4)]
    covered = sorted(i for plan in plans for mb in plan for i in mb)
    assert covered == list(range(64))
    assert partition_for_ranks([5], 2) == [[0], []]


def test_collate_shifts_targets_and_masks() -> None:
    batch = build_training_batch(trajectories(1, 3, seed=2))
    seqs = batch.sequences
    mb = collate(seqs, [2, 0], dtype=torch.float64)
    expected_inputs = seqs[2].tokens[:-1] + seqs[0].tokens[:-1]
    assert mb.input_ids.tolist() == expected_inputs
    assert mb.target_ids.tolist() == seqs[2].tokens[1:] + seqs[0].tokens[1:]
    n2 = len(seqs[2].tokens) - 1
    assert mb.position_ids.tolist() == list(range(n2)) + list(range(len(seqs[0].tokens) - 1))
    assert mb.loss_mask.tolist() == seqs[2].loss_mask[1:] + seqs[0].loss_mask[1:]
    assert mb.advantages.tolist() == seqs[2].advantages[1:] + seqs[0].advantages[1:]
    assert mb.rollout_logprobs.tolist() == seqs[2].rollout_logprobs[1:] + seqs[0].rollout_logprobs[1:]
    assert mb.denominators.tolist() == [seqs[2].denominator] * n2 + [seqs[0].denominator] * (len(seqs[0].tokens) - 1)
    pieces = mb.split(mb.target_ids)
    assert [p.tolist() for p in pieces] == [seqs[2].tokens[1:], seqs[0].tokens[1:]]
    assert mb.old_logprobs is None
    with pytest.raises(ValueError, match="indices: expected at least one sequence"):
        collate(seqs, [])
