"""The torch backend's supervised objective (``sft_step``) on the tiny Qwen3 in float64: equal to a plain
per-sequence cross-entropy over the trained tokens, independent of the packing, and it learns."""

from __future__ import annotations

import copy

import pytest
import torch
from _train_helpers import tiny_model, trajectories

from agentrl.train import (
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    build_training_batch,
)
from agentrl.train.batching import TrainingBatch


def _config(max_tokens: int = 4096, lr: float = 1e-3) -> TorchBackendConfig:
    return TorchBackendConfig(device="cpu", dtype="float64", packing=PackingConfig(max_tokens=max_tokens),
                              optimizer=OptimizerConfig(lr=lr, grad_clip=None, weight_decay=0.0))


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch() -> TrainingBatch:
    return build_training_batch(trajectories(3, 3, seed=4, fan_out=True))


def _reference_nll(model: torch.nn.Module, batch: TrainingBatch) -> torch.Tensor:
    """Each sequence alone, torch's cross-entropy summed over its mask-1 targets; divided by all trained tokens."""
    total = torch.zeros((), dtype=torch.float64)
    for seq in batch.sequences:
        logits = model(input_ids=torch.tensor(seq.tokens)[None]).logits[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits, torch.tensor(seq.tokens[1:]), reduction="none")
        total = total + (nll * torch.tensor(seq.loss_mask[1:], dtype=torch.float64)).sum()
    return total / sum(sum(s.loss_mask) for s in batch.sequences)


def test_sft_loss_and_gradients_match_plain_cross_entropy() -> None:
    model = tiny_model(0)
    batch = _batch()
    backend = TorchTrainBackend(copy.deepcopy(model), _config())
    metrics = backend.forward_backward(batch, objective="sft")
    expected = _reference_nll(model, batch)
    expected.backward()
    assert metrics["loss"] == pytest.approx(float(expected.detach()), abs=1e-10)
    assert set(metrics) >= {"loss", "micro_batches", "packed_tokens"} and "pg_loss" not in metrics
    got, want = _grads(backend.model), _grads(model)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-10, rtol=0), name


def test_sft_gradients_do_not_depend_on_the_packing() -> None:
    model, batch = tiny_model(0), _batch()
    longest = max(len(s.tokens) for s in batch.sequences)
    results = []
    for max_tokens in (longest, 2 * longest, 4096):
        backend = TorchTrainBackend(copy.deepcopy(model), _config(max_tokens))
        metrics = backend.forward_backward(batch, objective="sft")
        results.append((metrics["loss"], metrics["micro_batches"], _grads(backend.model)))
    assert len({mbs for _, mbs, _ in results}) > 1  # the packings really differ
    for loss, _, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-10)
        for name, g in grads.items():
            assert torch.allclose(g, results[0][2][name], atol=1e-10, rtol=0), name


def test_sft_steps_lower_the_loss_of_the_batch() -> None:
    backend = TorchTrainBackend(tiny_model(0), _config(lr=1e-2))
    batch = _batch()
    losses = [backend.sft_step(batch)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0] - 0.5, losses
    assert backend.step == 4


def test_an_unknown_objective_is_refused() -> None:
    backend = TorchTrainBackend(tiny_model(0), _config())
    with pytest.raises(ValueError, match="objective='dpo': expected 'policy' or 'sft'"):
        backend.forward_backward(_batch(), objective="dpo")  # type: ignore[arg-type]
