"""Chunked log-probs and entropy against a full log_softmax reference, values and gradients."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from agentrl.algorithms import (
    entropy_from_hidden,
    entropy_from_logits,
    logprobs_from_hidden,
    logprobs_from_logits,
    scores_from_hidden,
)


@pytest.mark.parametrize("temperature,chunk", [(1.0, 3), (0.7, 4), (1.3, 1000)])
def test_logprobs_match_log_softmax_with_temperature(temperature: float, chunk: int) -> None:
    torch.manual_seed(0)
    logits = torch.randn(11, 37, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 37, (11,))
    got = logprobs_from_logits(logits, targets, temperature=temperature, chunk_size=chunk)
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = torch.log_softmax(ref_logits / temperature, dim=-1).gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(got, ref, atol=1e-12, rtol=0)
    weights = torch.randn(11, dtype=torch.float64)
    (got * weights).sum().backward()
    (ref * weights).sum().backward()
    assert logits.grad is not None and ref_logits.grad is not None
    assert torch.allclose(logits.grad, ref_logits.grad, atol=1e-12, rtol=0)


def test_entropy_matches_reference_and_gradient() -> None:
    torch.manual_seed(1)
    logits = torch.randn(9, 23, dtype=torch.float64, requires_grad=True)
    got = entropy_from_logits(logits, temperature=0.7, chunk_size=4)
    ref_logits = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(ref_logits / 0.7, dim=-1)
    ref = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(got, ref, atol=1e-12, rtol=0)
    got.sum().backward()
    ref.sum().backward()
    assert logits.grad is not None and ref_logits.grad is not None
    assert torch.allclose(logits.grad, ref_logits.grad, atol=1e-12, rtol=0)


def test_gradcheck_float64() -> None:
    torch.manual_seed(2)
    logits = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 7, (5,))
    assert torch.autograd.gradcheck(lambda z: logprobs_from_logits(z, targets, temperature=0.8, chunk_size=2),
                                    (logits,))
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, temperature=0.8, chunk_size=2), (logits,))


def test_bfloat16_logits_are_scored_in_float32() -> None:
    torch.manual_seed(3)
    logits = torch.randn(6, 50).to(torch.bfloat16)
    targets = torch.randint(0, 50, (6,))
    got = logprobs_from_logits(logits, targets)
    assert got.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), -1).gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(got, ref, atol=1e-5)


def test_bad_inputs_name_the_field() -> None:
    logits = torch.zeros(3, 5)
    with pytest.raises(ValueError, match=r"targets: ids must lie in \[0, 5\).*max 5"):
        logprobs_from_logits(logits, torch.tensor([0, 1, 5]))
    with pytest.raises(ValueError, match=r"targets: expected shape \(3,\)"):
        logprobs_from_logits(logits, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="temperature: expected a positive number, got 0"):
        logprobs_from_logits(logits, torch.tensor([0, 1, 2]), temperature=0)
    with pytest.raises(ValueError, match=r"logits: expected a 2-D"):
        entropy_from_logits(torch.zeros(5))


@pytest.mark.parametrize("temperature,chunk", [(1.0, 3), (0.6, 64)])
def test_logprobs_from_hidden_match_the_logits_path(temperature: float, chunk: int) -> None:
    torch.manual_seed(4)
    hidden = torch.randn(10, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(41, 8, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 41, (10,))
    got = logprobs_from_hidden(hidden, weight, targets, temperature=temperature, chunk_size=chunk)
    h2 = hidden.detach().clone().requires_grad_(True)
    w2 = weight.detach().clone().requires_grad_(True)
    ref = torch.log_softmax((h2 @ w2.T) / temperature, dim=-1).gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(got, ref, atol=1e-12, rtol=0)
    g = torch.randn(10, dtype=torch.float64)
    (got * g).sum().backward()
    (ref * g).sum().backward()
    assert hidden.grad is not None and weight.grad is not None and h2.grad is not None and w2.grad is not None
    assert torch.allclose(hidden.grad, h2.grad, atol=1e-12, rtol=0)
    assert torch.allclose(weight.grad, w2.grad, atol=1e-12, rtol=0)
    ent = entropy_from_hidden(hidden.detach(), weight.detach(), temperature=temperature, chunk_size=chunk)
    logp = torch.log_softmax((hidden.detach() @ weight.detach().T) / temperature, dim=-1)
    assert torch.allclose(ent, -(logp.exp() * logp).sum(-1), atol=1e-12, rtol=0)


def test_logprobs_from_hidden_gradcheck_and_errors() -> None:
    torch.manual_seed(5)
    hidden = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 6, (4,))
    assert torch.autograd.gradcheck(
        lambda h, w: logprobs_from_hidden(h, w, targets, temperature=0.9, chunk_size=3), (hidden, weight))
    with pytest.raises(ValueError, match=r"hidden/weight: expected \[tokens, hidden\] and \[vocab, hidden\]"):
        logprobs_from_hidden(hidden, weight.T, targets)
    with pytest.raises(ValueError, match=r"targets: ids must lie in \[0, 6\)"):
        logprobs_from_hidden(hidden, weight, torch.tensor([0, 1, 2, 6]))


@pytest.mark.parametrize("temperature,chunk", [(1.0, 3), (0.7, 1000)])
def test_scores_from_hidden_entropy_gradient_matches_the_logits_path(temperature: float, chunk: int) -> None:
    torch.manual_seed(5)
    hidden = torch.randn(10, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(19, 8, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 19, (10,))
    lp, ent = scores_from_hidden(hidden, weight, targets, temperature=temperature, chunk_size=chunk, entropy="grad")
    assert ent is not None
    h2 = hidden.detach().clone().requires_grad_(True)
    w2 = weight.detach().clone().requires_grad_(True)
    logp = torch.log_softmax((h2 @ w2.T) / temperature, dim=-1)
    ref_lp = logp.gather(1, targets[:, None])[:, 0]
    ref_ent = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(lp, ref_lp, atol=1e-12, rtol=0) and torch.allclose(ent, ref_ent, atol=1e-12, rtol=0)
    a, b = torch.randn(10, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    ((lp * a).sum() + (ent * b).sum()).backward()
    ((ref_lp * a).sum() + (ref_ent * b).sum()).backward()
    assert hidden.grad is not None and weight.grad is not None and h2.grad is not None and w2.grad is not None
    assert torch.allclose(hidden.grad, h2.grad, atol=1e-12, rtol=0)
    assert torch.allclose(weight.grad, w2.grad, atol=1e-12, rtol=0)


def test_scores_from_hidden_over_vocabulary_slices_equal_the_whole() -> None:
    """Two slices of the vocabulary (the second with 3 padding rows), combined by a summing/maxing
    stand-in for the tensor-parallel all-reduce, give the whole vocabulary's scores and gradients."""
    torch.manual_seed(6)
    hidden = torch.randn(7, 5, dtype=torch.float64)
    weight = torch.randn(16, 5, dtype=torch.float64)
    targets = torch.randint(0, 13, (7,))
    valid = 13
    whole_h = hidden.clone().requires_grad_(True)
    whole_w = weight[:valid].clone().requires_grad_(True)
    want_lp, want_ent = scores_from_hidden(whole_h, whole_w, targets, temperature=0.9, chunk_size=3, entropy="grad")
    assert want_ent is not None
    (want_lp.sum() + 0.5 * want_ent.sum()).backward()
    slices = [weight[:8].clone().requires_grad_(True), weight[8:].clone().requires_grad_(True)]
    hs = [hidden.clone().requires_grad_(True) for _ in slices]
    barrier = threading.Barrier(2)
    posted: dict[int, torch.Tensor] = {}

    def reducer(rank: int) -> Callable[[torch.Tensor, str], None]:
        def all_reduce(t: torch.Tensor, op: str) -> None:  # two threads stand in for two TP ranks
            posted[rank] = t.clone()
            barrier.wait()
            a, b = posted[0], posted[1]
            result = torch.maximum(a, b) if op == "max" else a + b
            barrier.wait()
            t.copy_(result)
        return all_reduce

    results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def run(rank: int) -> None:
        lp, ent = scores_from_hidden(hs[rank], slices[rank], targets, temperature=0.9, chunk_size=3,
                                     vocab_start=8 * rank, valid_vocab=valid, all_reduce=reducer(rank),
                                     entropy="grad")
        assert ent is not None
        (lp.sum() + 0.5 * ent.sum()).backward()
        results[rank] = (lp.detach(), ent.detach())

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for rank in (0, 1):
        assert torch.allclose(results[rank][0], want_lp, atol=1e-12, rtol=0)
        assert torch.allclose(results[rank][1], want_ent, atol=1e-12, rtol=0)
    grad_h = hs[0].grad + hs[1].grad  # what the TP all-reduce of the hidden gradient sums
    assert whole_h.grad is not None and whole_w.grad is not None
    assert torch.allclose(grad_h, whole_h.grad, atol=1e-12, rtol=0)
    grad_w = torch.cat([slices[0].grad, slices[1].grad])
    assert torch.allclose(grad_w[:valid], whole_w.grad, atol=1e-12, rtol=0)
    assert torch.equal(grad_w[valid:], torch.zeros_like(grad_w[valid:]))  # padding rows get nothing
