"""On-policy distillation math against straightforward per-token loops."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algorithms import distillation_advantages, distillation_metrics, mix_advantages


def _rows(seed: int, s: int = 5, t: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    teacher = -torch.rand(s, t, generator=gen, dtype=torch.float64) * 6
    behaviour = -torch.rand(s, t, generator=gen, dtype=torch.float64) * 6
    mask = (torch.rand(s, t, generator=gen) < 0.6).long()
    task = torch.randn(s, t, generator=gen, dtype=torch.float64) * mask
    return teacher, behaviour, mask, task


def _loop_reference(teacher, behaviour, mask, task, coef, with_task):  # type: ignore[no-untyped-def]
    """Token by token: A = c·A_task + β·(log π_T − log μ) on sampled tokens, 0 elsewhere."""
    out = [[0.0] * teacher.shape[1] for _ in range(teacher.shape[0])]
    for i in range(teacher.shape[0]):
        for j in range(teacher.shape[1]):
            if mask[i][j]:
                a_kl = float(teacher[i][j]) - float(behaviour[i][j])
                out[i][j] = (float(task[i][j]) if with_task else 0.0) + coef * a_kl
    return out


@pytest.mark.parametrize(("coef", "with_task"), [(1.0, False), (0.5, True), (2.0, True), (0.0, True)])
def test_mixed_advantage_equals_the_token_loop(coef: float, with_task: bool) -> None:
    teacher, behaviour, mask, task = _rows(seed=int(coef * 10) + with_task)
    a_kl = distillation_advantages(teacher, behaviour, mask)
    mixed = mix_advantages(task, a_kl, coef=coef, task=with_task)
    assert mixed.dtype == torch.float64
    expected = torch.tensor(_loop_reference(teacher, behaviour, mask, task, coef, with_task), dtype=torch.float64)
    torch.testing.assert_close(mixed, expected, rtol=0, atol=1e-12)
    assert (a_kl[mask == 0] == 0).all()  # environment tokens and padding are never scored as the student's


def test_discount_zero_each_token_depends_on_its_own_logprobs_only() -> None:
    teacher, behaviour, mask, _ = _rows(seed=3)
    mask[:] = 1
    base = distillation_advantages(teacher, behaviour, mask)
    moved = teacher.clone()
    moved[2, 4] -= 1.5
    after = distillation_advantages(moved, behaviour, mask)
    changed = (after != base).nonzero().tolist()
    assert changed == [[2, 4]] and float(after[2, 4] - base[2, 4]) == pytest.approx(-1.5)


def test_not_group_normalised_and_detached() -> None:
    teacher, behaviour, mask, _ = _rows(seed=4)
    behaviour.requires_grad_(True)
    a_kl = distillation_advantages(teacher, behaviour, mask)
    assert not a_kl.requires_grad
    scaled = distillation_advantages(teacher * 2, behaviour.detach() * 2, mask)
    torch.testing.assert_close(scaled, 2 * a_kl)  # a group's scale is not divided out


def test_metrics_match_hand_computation() -> None:
    teacher, behaviour, mask, task = _rows(seed=5)
    a_kl = distillation_advantages(teacher, behaviour, mask)
    m = distillation_metrics(teacher, behaviour, mask, task, a_kl, coef=0.5, task=True)
    picked = [(float(teacher[i, j]), float(behaviour[i, j]), float(task[i, j]))
              for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]]
    n = len(picked)
    assert m["tokens"] == n
    assert m["reverse_kl"] == pytest.approx(sum(b - t for t, b, _ in picked) / n)
    assert m["teacher_logprob"] == pytest.approx(sum(t for t, _, _ in picked) / n)
    assert m["student_logprob"] == pytest.approx(sum(b for _, b, _ in picked) / n)
    teach = sum(abs(0.5 * (t - b)) for t, b, _ in picked)
    assert m["teacher_share"] == pytest.approx(teach / (teach + sum(abs(a) for _, _, a in picked)))
    alone = distillation_metrics(teacher, behaviour, mask, task, a_kl, coef=0.5, task=False)
    assert alone["teacher_share"] == 1.0
    empty = distillation_metrics(teacher, behaviour, torch.zeros_like(mask), task, a_kl, coef=0.5)
    assert empty["tokens"] == 0 and math.isnan(empty["reverse_kl"])


def test_bad_inputs_name_the_field() -> None:
    teacher, behaviour, mask, task = _rows(seed=6)
    with pytest.raises(ValueError, match=r"behaviour_logprobs: expected shape \(5, 9\)"):
        distillation_advantages(teacher, behaviour[:, :3], mask)
    teacher[0, 0] = float("nan")
    mask[0, 0] = 1
    with pytest.raises(ValueError, match=r"teacher_logprobs\[0, 0\] = nan; expected a finite logprob"):
        distillation_advantages(teacher, behaviour, mask)
    with pytest.raises(ValueError, match="coef: expected a finite number >= 0"):
        mix_advantages(task, task, coef=-1.0)
