"""Chunked log-probs and entropy against a full log_softmax reference, values and gradients."""

from __future__ import annotations

import pytest
import torch

from agentrl.algorithms import (
    entropy_from_hidden,
    entropy_from_logits,
    logprobs_from_hidden,
    logprobs_from_logits,
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
