"""Advantages against straightforward loop computations."""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentrl.algorithms import (
    AdvantageEstimator,
    compute_advantages,
    gae_advantages,
    group_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)


def _reference_grpo(rewards, groups, rollouts, std_normalize=True, eps=1e-6):
    """One reward per rollout, unbiased std, degenerate groups give 0."""
    per_rollout = {}
    for r, g, rid in zip(rewards, groups, rollouts, strict=True):
        per_rollout[rid] = (g, r)
    out = []
    for r, g in zip(rewards, groups, strict=True):
        vals = [v for (gg, v) in per_rollout.values() if gg == g]
        n = len(vals)
        if n == 1:
            out.append(0.0)
            continue
        mu = sum(vals) / n
        sigma = math.sqrt(sum((v - mu) ** 2 for v in vals) / (n - 1))
        out.append((r - mu) / (sigma + eps) if std_normalize else r - mu)
    return out


def test_uneven_groups_match_reference_and_centre_each_group() -> None:
    rewards = [1.0, 0.0, 0.5, 2.0, -1.0, 3.0, 0.25]
    groups = ["a", "a", "a", "b", "b", "c", "c"]
    adv = group_advantages(rewards, groups)
    assert adv.tolist() == pytest.approx(_reference_grpo(rewards, groups, range(7)), abs=1e-12)
    for g in set(groups):
        assert sum(a for a, gg in zip(adv.tolist(), groups, strict=True) if gg == g) == pytest.approx(0.0, abs=1e-9)
    adv_nostd = group_advantages(rewards, groups, std_normalize=False)
    assert adv_nostd.tolist() == pytest.approx(_reference_grpo(rewards, groups, range(7), False), abs=1e-12)


def test_fan_out_counts_each_rollout_once() -> None:
    # Rollout r1 yields three sequences; counted once, the group {r1: 1, r2: 0} has mean 0.5.
    rewards = [1.0, 1.0, 1.0, 0.0]
    groups = [7, 7, 7, 7]
    rollouts = ["r1", "r1", "r1", "r2"]
    adv = group_advantages(rewards, groups, rollout_ids=rollouts, std_normalize=False)
    assert adv.tolist() == pytest.approx([0.5, 0.5, 0.5, -0.5])
    adv_std = group_advantages(rewards, groups, rollout_ids=rollouts)
    assert adv_std.tolist() == pytest.approx(_reference_grpo(rewards, groups, rollouts), abs=1e-12)
    # Without rollout ids the same batch would be (wrongly) weighted 3:1.
    assert group_advantages(rewards, groups, std_normalize=False).tolist()[3] == pytest.approx(-0.75)


def test_constant_reward_groups_and_singletons_give_zero() -> None:
    adv = group_advantages([0.7, 0.7, 0.7, 5.0, 1.0, 2.0], ["x", "x", "x", "single", "y", "y"])
    assert adv[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert adv[4] < 0 < adv[5]


def test_shuffle_invariance() -> None:
    rng = random.Random(0)
    rows = [(rng.random(), rng.choice("abcd")) for _ in range(30)]
    base = dict(zip(range(30), group_advantages([r for r, _ in rows], [g for _, g in rows]).tolist(), strict=True))
    order = list(range(30))
    rng.shuffle(order)
    shuffled = group_advantages([rows[i][0] for i in order], [rows[i][1] for i in order]).tolist()
    assert shuffled == pytest.approx([base[i] for i in order], abs=1e-12)


def test_bad_ids_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"group_ids\[1\]: missing id"):
        group_advantages([1.0, 2.0], ["a", None])
    with pytest.raises(ValueError, match=r"rewards\[1\]: rollout 'r' has rewards 1.0 and 2.0"):
        group_advantages([1.0, 2.0], ["a", "a"], rollout_ids=["r", "r"])
    with pytest.raises(ValueError, match="group_ids: expected 2 ids"):
        group_advantages([1.0, 2.0], ["a"])


def _loop_returns(rewards_row, mask_row, gamma):
    idx = [t for t, m in enumerate(mask_row) if m]
    out = [0.0] * len(mask_row)
    for k, t in enumerate(idx):
        out[t] = sum(gamma ** (j - k) * rewards_row[idx[j]] for j in range(k, len(idx)))
    return out


def test_reinforce_pp_matches_loop_and_whitens() -> None:
    torch.manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    kl_t = torch.randn(3, 6, dtype=torch.float64)
    rewards = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    got = reinforce_pp_advantages(rewards, mask, kl=kl_t, kl_coef=0.1, gamma=0.9, whiten=False)
    for s in range(3):
        tok = [-0.1 * float(kl_t[s, t]) * int(mask[s, t]) for t in range(6)]
        trainable = [t for t in range(6) if mask[s, t]]
        if trainable:
            tok[trainable[-1]] += float(rewards[s])
        assert got[s].tolist() == pytest.approx(_loop_returns(tok, mask[s].tolist(), 0.9), abs=1e-12)
    white = reinforce_pp_advantages(rewards, mask, kl=kl_t, kl_coef=0.1, gamma=0.9)
    picked = white[mask.bool()]
    assert float(picked.mean()) == pytest.approx(0.0, abs=1e-9)
    assert float(picked.std()) == pytest.approx(1.0, abs=1e-6)
    assert float(white[~mask.bool()].abs().sum()) == 0.0


def test_reinforce_pp_baseline_centres_by_group_only() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])
    got = reinforce_pp_baseline_advantages([1.0, 0.0, 4.0, 2.0], ["a", "a", "b", "b"], mask, whiten=False)
    expected_rows = [0.5, -0.5, 1.0, -1.0]
    for s in range(4):
        assert got[s].tolist() == pytest.approx([expected_rows[s] * m for m in mask[s].tolist()])


def test_gae_matches_loop_over_trainable_tokens() -> None:
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1]])
    rewards = torch.randn(2, 7, dtype=torch.float64) * mask
    values = torch.randn(2, 7, dtype=torch.float64)
    gamma, lam = 0.95, 0.8
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    for s in range(2):
        idx = [t for t in range(7) if mask[s, t]]
        expected = [0.0] * 7
        a_next = 0.0
        for k in range(len(idx) - 1, -1, -1):
            t = idx[k]
            v_next = float(values[s, idx[k + 1]]) if k + 1 < len(idx) else 0.0
            delta = float(rewards[s, t]) + gamma * v_next - float(values[s, t])
            a_next = delta + gamma * lam * a_next
            expected[t] = a_next
        assert adv[s].tolist() == pytest.approx(expected, abs=1e-12)
        assert ret[s].tolist() == pytest.approx([e + float(values[s, t]) if mask[s, t] else 0.0
                                                 for t, e in enumerate(expected)], abs=1e-12)


def test_gae_gamma_lambda_one_zero_values_is_sum_of_future_rewards() -> None:
    mask = torch.tensor([[1, 0, 1, 1]])
    rewards = torch.tensor([[1.0, 0.0, 2.0, 3.0]], dtype=torch.float64)
    adv, _ = gae_advantages(rewards, torch.zeros_like(rewards), mask)
    assert adv.tolist() == [[6.0, 0.0, 5.0, 3.0]]


def test_gae_with_zero_values_and_lambda_one_is_unwhitened_reinforce_pp() -> None:
    # Both estimators shape the same token rewards (KL penalty, sequence reward at the last token).
    torch.manual_seed(2)
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    kl_t = torch.randn(3, 5, dtype=torch.float64)
    rewards = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    ppo = compute_advantages("ppo", rewards, ["a", "a", "b"], mask, kl=kl_t, kl_coef=0.1,
                             values=torch.zeros(3, 5, dtype=torch.float64), gamma=0.9, lam=1.0)
    rpp = reinforce_pp_advantages(rewards, mask, kl=kl_t, kl_coef=0.1, gamma=0.9, whiten=False)
    assert torch.allclose(ppo, rpp, atol=1e-12)
    assert ppo[0, 4].item() == pytest.approx(1.0 - 0.1 * kl_t[0, 4].item())


def test_compute_advantages_per_estimator() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 1, 1]])
    rewards = [1.0, 0.0, 2.0, 2.0]
    groups = ["a", "a", "b", "b"]
    grpo = compute_advantages("grpo", rewards, groups, mask)
    expected = _reference_grpo(rewards, groups, range(4))
    for s in range(4):
        assert grpo[s].tolist() == pytest.approx([expected[s] * m for m in mask[s].tolist()])
    dr = compute_advantages(AdvantageEstimator.DR_GRPO, rewards, groups, mask)
    assert dr[0, 0].item() == pytest.approx(0.5) and dr[1, 0].item() == pytest.approx(-0.5)
    assert torch.equal(compute_advantages("gspo", rewards, groups, mask), grpo)
    assert torch.equal(compute_advantages("cispo", rewards, groups, mask), grpo)
    values = torch.zeros(4, 3, dtype=torch.float64)
    ppo = compute_advantages("ppo", rewards, groups, mask, values=values)
    assert ppo[2].tolist() == [0.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="values: estimator 'ppo'"):
        compute_advantages("ppo", rewards, groups, mask)
    with pytest.raises(ValueError, match="'nope' is not a valid AdvantageEstimator"):
        compute_advantages("nope", rewards, groups, mask)
