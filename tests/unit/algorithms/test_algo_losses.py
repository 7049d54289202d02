"""Policy losses, KL, importance weights and the reducer against loop references."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms import (
    cispo_loss,
    gspo_loss,
    kl,
    masked_whiten,
    mis_weights,
    mismatch_metrics,
    opsm_mask,
    ppo_clip_loss,
    reduce_loss,
    rollout_denominators,
    sequence_tis_weights,
    tis_weights,
    value_loss,
)

D = torch.float64


def _ppo_ref(lp, old, a, eps, eps_high, c):
    rho = math.exp(lp - old)
    l1 = -a * rho
    l2 = -a * min(max(rho, 1 - eps), 1 + eps_high)
    loss = max(l1, l2)
    if c is not None and a < 0:
        loss = min(loss, -c * a)
    return loss


@pytest.mark.parametrize("eps_high,dual", [(None, None), (0.28, None), (0.28, 3.0)])
def test_ppo_matches_loop(eps_high, dual) -> None:
    torch.manual_seed(0)
    lp = torch.randn(4, 9, dtype=D) * 0.1 - 1
    old = lp + torch.randn(4, 9, dtype=D) * 0.8
    adv = torch.randn(4, 9, dtype=D)
    loss, clipped = ppo_clip_loss(lp, old, adv, eps_clip=0.2, eps_clip_high=eps_high, dual_clip_c=dual)
    high = 0.2 if eps_high is None else eps_high
    for i in range(4):
        for t in range(9):
            ref = _ppo_ref(float(lp[i, t]), float(old[i, t]), float(adv[i, t]), 0.2, high, dual)
            assert float(loss[i, t]) == pytest.approx(ref, abs=1e-12)
    assert clipped.any() and not clipped.all()


def test_ratio_one_gives_minus_advantage_and_policy_gradient() -> None:
    lp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=D, requires_grad=True)
    adv = torch.tensor([[0.3, -1.2, 2.0]], dtype=D)
    loss, clipped = ppo_clip_loss(lp, lp.detach(), adv, eps_clip=0.2, eps_clip_high=0.28, dual_clip_c=3.0)
    assert loss.detach()[0].tolist() == pytest.approx((-adv)[0].tolist())
    assert not clipped.any()
    loss.sum().backward()
    assert lp.grad is not None and lp.grad[0].tolist() == pytest.approx((-adv)[0].tolist())


def _grad_at(fn, ratio: float, adv: float) -> tuple[float, float, bool]:
    lp = torch.tensor([math.log(ratio)], dtype=D, requires_grad=True)
    loss, clipped = fn(lp, torch.zeros(1, dtype=D), torch.tensor([adv], dtype=D))
    loss.sum().backward()
    assert lp.grad is not None
    return float(loss.detach()), float(lp.grad), bool(clipped)


def test_clip_boundaries_asymmetric_and_dual() -> None:
    ppo = lambda lp, old, a: ppo_clip_loss(lp, old, a, eps_clip=0.2, eps_clip_high=0.28, dual_clip_c=3.0)  # noqa: E731
    # A > 0, ρ above 1 + eps_high: clipped, zero gradient, loss = -A(1.28).
    loss, grad, clipped = _grad_at(ppo, 1.5, 1.0)
    assert clipped and grad == 0.0 and loss == pytest.approx(-1.28)
    # A > 0, ρ = 1.25 is inside the asymmetric range (would be clipped at symmetric 0.2).
    loss, grad, clipped = _grad_at(ppo, 1.25, 1.0)
    assert not clipped and grad == pytest.approx(-1.25)
    _, grad_sym, clipped_sym = _grad_at(lambda lp, o, a: ppo_clip_loss(lp, o, a, eps_clip=0.2), 1.25, 1.0)
    assert clipped_sym and grad_sym == 0.0
    # A < 0, ρ below 1 - eps: clipped, zero gradient.
    loss, grad, clipped = _grad_at(ppo, 0.5, -1.0)
    assert clipped and grad == 0.0 and loss == pytest.approx(0.8)
    # A < 0, 1 < ρ < c: unclipped, gradient -A·ρ.
    loss, grad, clipped = _grad_at(ppo, 2.0, -1.0)
    assert not clipped and grad == pytest.approx(2.0) and loss == pytest.approx(2.0)
    # A < 0, ρ > c: dual clip, loss -c·A, zero gradient.
    loss, grad, clipped = _grad_at(ppo, 5.0, -1.0)
    assert clipped and grad == 0.0 and loss == pytest.approx(3.0)
    with pytest.raises(ValueError, match=r"dual_clip_c: expected a value > 1, got 0\.5"):
        ppo_clip_loss(torch.zeros(1), torch.zeros(1), torch.ones(1), dual_clip_c=0.5)


def test_cispo_gradient_flows_through_clipped_tokens() -> None:
    cispo = lambda lp, old, a: cispo_loss(lp, old, a, eps_clip=0.2, eps_clip_high=0.28)  # noqa: E731
    for ratio, adv in [(1.5, 1.0), (0.5, -1.0), (5.0, -1.0), (1.1, 2.0)]:
        loss, grad, clipped = _grad_at(cispo, ratio, adv)
        w = min(max(ratio, 0.8), 1.28)
        assert grad == pytest.approx(-w * adv) and grad != 0.0
        assert loss == pytest.approx(-w * adv * math.log(ratio))
        assert clipped == (ratio < 0.8 or ratio > 1.28)


def test_gspo_sequence_ratio_matches_loop() -> None:
    torch.manual_seed(2)
    lp = torch.randn(3, 6, dtype=D) * 0.01 - 1
    old = lp + torch.randn(3, 6, dtype=D) * 0.01
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=D)[:, None].expand(3, 6)
    loss, _ = gspo_loss(lp, old, adv, mask, eps_clip=3e-4, eps_clip_high=4e-4)
    for i in range(3):
        n = sum(mask[i].tolist())
        s = math.exp(sum(float(lp[i, t] - old[i, t]) for t in range(6) if mask[i, t]) / max(n, 1))
        a = float(adv[i, 0])
        ref = max(-a * s, -a * min(max(s, 1 - 3e-4), 1 + 4e-4))
        assert loss[i].tolist() == pytest.approx([ref] * 6, abs=1e-12)
    # Constant token ratio q gives s = q; packed 1-D form with sequence ids equals the row form.
    q = 1.0001
    lp2 = torch.full((2, 4), math.log(q), dtype=D)
    loss2, _ = gspo_loss(lp2, torch.zeros_like(lp2), torch.ones_like(lp2), torch.ones(2, 4), eps_clip=1, eps_clip_high=1)
    assert loss2.flatten().tolist() == pytest.approx([-q] * 8)
    packed, _ = gspo_loss(lp.flatten(), old.flatten(), adv.flatten(), mask.flatten(),
                          sequence_ids=torch.arange(3).repeat_interleave(6))
    assert packed.tolist() == pytest.approx(loss.flatten().tolist(), abs=1e-15)


def test_kl_estimators() -> None:
    torch.manual_seed(3)
    lp = torch.randn(50, dtype=D)
    ref = torch.randn(50, dtype=D)
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        assert kl(lp, lp.clone(), kind).abs().max() == 0.0
    x = (lp - ref).tolist()
    assert kl(lp, ref, "k1").tolist() == pytest.approx(x)
    assert kl(lp, ref, "k2").tolist() == pytest.approx([v * v / 2 for v in x])
    k3 = kl(lp, ref, "k3")
    assert k3.tolist() == pytest.approx([math.exp(-v) - 1 + v for v in x])
    assert bool((k3 >= 0).all())
    big = kl(torch.tensor([-20.0], dtype=D), torch.tensor([0.0], dtype=D), "low_var_kl")
    assert big.item() == 10.0
    with pytest.raises(ValueError, match="kind: expected one of"):
        kl(lp, ref, "k4")  # type: ignore[arg-type]


def test_kl_monte_carlo_and_gradients() -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=D)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=D)
    reverse = float((p * (p / q).log()).sum())
    samples = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    lp, lq = p.log()[samples], q.log()[samples]
    assert float(kl(lp, lq, "k1").mean()) == pytest.approx(reverse, abs=0.01)
    assert float(kl(lp, lq, "k3").mean()) == pytest.approx(reverse, abs=0.01)
    # Gradient through the sampled logprob: ∇k2 = x·∇ℓ, ∇k3 = (1 - e^{-x})·∇ℓ.
    lp1 = torch.tensor([-0.7], dtype=D, requires_grad=True)
    r1 = torch.tensor([-1.5], dtype=D)
    kl(lp1, r1, "k2").sum().backward()
    assert lp1.grad is not None and float(lp1.grad) == pytest.approx(0.8)
    lp1.grad = None
    kl(lp1, r1, "k3").sum().backward()
    assert float(lp1.grad) == pytest.approx(1 - math.exp(-0.8))


def test_tis_and_mis() -> None:
    old = torch.tensor([-1.0, -1.0, -1.0, -2.0], dtype=D)
    assert tis_weights(old, old.clone()).tolist() == [1.0] * 4
    rollout = old - torch.tensor([0.0, math.log(3.0), math.log(0.25), math.log(1.5)], dtype=D)
    w = tis_weights(old, rollout, clip=2.0, clip_low=0.5)
    assert w.tolist() == pytest.approx([1.0, 2.0, 0.5, 1.5])
    m = mis_weights(old, rollout, low=0.5, high=2.0)
    assert m.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert mis_weights(old, rollout, keep_ratio=True).tolist() == pytest.approx([1.0, 0.0, 0.0, 1.5])
    mask = torch.tensor([[1, 1, 0, 1]])
    seq = sequence_tis_weights(old[None], rollout[None], mask, clip=10.0)
    assert seq[0].tolist() == pytest.approx([1 * 3 * 1.5] * 4)
    geo = sequence_tis_weights(old[None], rollout[None], mask, clip=10.0, geometric=True)
    assert geo[0].tolist() == pytest.approx([4.5 ** (1 / 3)] * 4)
    metrics = mismatch_metrics(old, rollout, torch.tensor([1, 1, 0, 0]))
    assert metrics["mismatch/abs_diff"] == pytest.approx(math.log(3.0) / 2)
    assert metrics["mismatch/clip_frac"] == pytest.approx(0.5)
    assert mismatch_metrics(old, rollout, torch.zeros(4))["mismatch/abs_diff"] == 0.0


def _reference_rollout_mean(losses, masks, rollout_ids):
    per_rollout: dict[str, list[float]] = {}
    for row, mrow, rid in zip(losses, masks, rollout_ids, strict=True):
        per_rollout.setdefault(rid, [])
        per_rollout[rid] += [v for v, m in zip(row, mrow, strict=True) if m]
    means = [sum(v) / len(v) for v in per_rollout.values() if v]
    return sum(means) / len(means)


def test_reduce_rollout_token_mean_matches_loop_and_survives_splits() -> None:
    torch.manual_seed(4)
    loss = torch.randn(5, 7, dtype=D)
    mask = (torch.rand(5, 7) > 0.4).long()
    mask[3] = 0  # an empty mask in a rollout that has other segments
    rids = ["a", "b", "a", "c", "c"]
    den = torch.tensor(rollout_denominators(mask.tolist(), rids), dtype=D)
    full = reduce_loss(loss, mask, den)
    assert float(full) == pytest.approx(_reference_rollout_mean(loss.tolist(), mask.tolist(), rids), abs=1e-12)
    # Split into micro-batches {0,3}, {1}, {2,4}: with the global rollout count the parts add up.
    parts = [[0, 3], [1], [2, 4]]
    total = sum(float(reduce_loss(loss[p], mask[p], den[p], num_rollouts=3)) for p in parts)
    assert total == pytest.approx(float(full), abs=1e-12)
    # L ≡ 1 gives 1 for any masks; per-token denominators work as well as per-row ones.
    ones = torch.ones_like(loss)
    assert float(reduce_loss(ones, mask, den)) == pytest.approx(1.0)
    assert float(reduce_loss(loss.flatten(), mask.flatten(), den[:, None].expand(5, 7).flatten())) == pytest.approx(
        float(full))


def test_reduce_empty_masks_and_masked_nan() -> None:
    loss = torch.tensor([[1.0, float("nan")], [2.0, 3.0]], dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 0], [0, 0]])
    out = reduce_loss(loss, mask, torch.tensor([1.0, 0.0], dtype=D))
    assert float(out.detach()) == 1.0
    out.backward()
    assert loss.grad is not None and not torch.isnan(loss.grad).any()
    empty = reduce_loss(loss.detach(), torch.zeros(2, 2), torch.zeros(2, dtype=D))
    assert float(empty) == 0.0


def test_reduce_token_mean_and_constant_modes() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(reduce_loss(loss, mask, mode="token_mean")) == pytest.approx(7 / 3)
    assert float(reduce_loss(loss, mask, mode="token_mean", num_tokens=7)) == pytest.approx(1.0)
    got = reduce_loss(loss, mask, mode="seq_mean_token_sum_norm", constant=10.0, num_rollouts=2)
    assert float(got) == pytest.approx(7 / 20)
    with pytest.raises(ValueError, match="constant: mode 'seq_mean_token_sum_norm' needs a positive constant"):
        reduce_loss(loss, mask, mode="seq_mean_token_sum_norm", num_rollouts=2)
    with pytest.raises(ValueError, match="denominators: expected shape"):
        reduce_loss(loss, mask, torch.ones(3))
    with pytest.raises(ValueError, match="denominators: required"):
        reduce_loss(loss, mask)


def test_value_loss_matches_loop() -> None:
    values = torch.tensor([0.5, 1.0, -0.3, 2.0], dtype=D, requires_grad=True)
    old = torch.tensor([0.0, 1.1, 0.0, 1.0], dtype=D)
    returns = torch.tensor([1.0, 0.0, 0.1, 2.5], dtype=D)
    got = value_loss(values, old, returns, clip=0.2)
    for i in range(4):
        v, o, r = float(values.detach()[i]), float(old[i]), float(returns[i])
        clipped = o + min(max(v - o, -0.2), 0.2)
        assert float(got.detach()[i]) == pytest.approx(max((v - r) ** 2, (clipped - r) ** 2))
    got.sum().backward()
    assert values.grad is not None
    assert float(values.grad[0]) == 0.0  # the clipped branch won: no gradient through V
    assert float(values.grad[1]) == pytest.approx(2 * (1.0 - 0.0))


def test_masked_whiten_with_given_stats() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=D)
    mask = torch.tensor([[1, 0, 1], [0, 1, 0]])
    out = masked_whiten(x, mask, stats=(3.0, 2.0), eps=0.0)
    assert out.tolist() == [[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    own = masked_whiten(x, mask)
    picked = [1.0, 3.0, 5.0]
    assert own[0, 0].item() == pytest.approx((1.0 - 3.0) / 2.0, abs=1e-6)
    assert sorted(own[mask.bool()].tolist()) == pytest.approx([(p - 3.0) / 2.0 for p in picked], abs=1e-6)


def test_opsm_masks_drifted_negative_sequences_only() -> None:
    lp = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]], dtype=D)
    old = torch.tensor([[-0.5, -0.5, 0.0], [-0.5, -0.5, 0.0], [-1.0, -1.0, -1.0]], dtype=D)
    adv = torch.tensor([-1.0, 1.0, -1.0], dtype=D)[:, None].expand(3, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1]])
    got = opsm_mask(lp, old, adv, mask, delta=1e-4)
    for i in range(3):
        drift = sum(float(old[i, t] - lp[i, t]) for t in range(3) if mask[i, t]) / sum(mask[i].tolist())
        keep = not (float(adv[i, 0]) < 0 and drift > 1e-4)
        assert got[i].tolist() == [float(keep)] * 3
