"""Fitting a step in memory without changing it: activation checkpointing, packed attention without
a mask across the row, the fused head, float32 master weights, export in the serving dtype."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _train_helpers import tiny_model, trajectories

from agentrl.testing import build_tokenizer
from agentrl.train import (
    LossConfig,
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    TrainingBatch,
    build_training_batch,
)
from agentrl.train.attention import Documents, use_packed_attention
from agentrl.train.precision import smallest_update


def _config(**kw: Any) -> TorchBackendConfig:
    base: dict[str, Any] = {"device": "cpu", "dtype": "float64", "packing": PackingConfig(max_tokens=4096),
                            "loss": LossConfig(old_logprobs="recompute", eps_clip_high=0.28, entropy_coef=0.01),
                            "optimizer": OptimizerConfig(lr=1e-3, grad_clip=None)}
    return TorchBackendConfig(**{**base, **kw})


def _batch(seed: int = 3) -> TrainingBatch:
    return build_training_batch(trajectories(2, 3, seed=seed, fan_out=True))


def _grads(backend: TorchTrainBackend) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in backend.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("dtype", "tol"), [("float64", 1e-10), ("float32", 1e-6)])
def test_activation_checkpointing_leaves_the_gradients_unchanged(dtype: str, tol: float) -> None:
    model = tiny_model(0, dtype=getattr(torch, dtype))
    batch = _batch()
    grads, losses, calls = {}, {}, {}
    for mode in ("none", "full", "selective"):
        backend = TorchTrainBackend(copy.deepcopy(model), _config(dtype=dtype, activation_checkpointing=mode))
        layer = backend.model.model.layers[0]
        counts = {"self_attn": 0, "mlp": 0}  # their first projections (recomputation stops after the last saved tensor)
        for name, sub in (("self_attn", layer.self_attn.q_proj), ("mlp", layer.mlp.gate_proj)):
            sub.register_forward_hook(lambda *_, n=name, c=counts: c.__setitem__(n, c[n] + 1))
        metrics = backend.forward_backward(batch, micro_batches=[[0, 1, 2, 3], [4, 5, 6, 7]])
        grads[mode], losses[mode], calls[mode] = _grads(backend), metrics["loss"], counts
    assert losses["none"] != 0.0
    # Two micro-batches, each scored (no grad) then trained; recomputation runs the forward once more.
    assert calls == {"none": {"self_attn": 4, "mlp": 4}, "full": {"self_attn": 6, "mlp": 6},
                     "selective": {"self_attn": 4, "mlp": 6}}
    for mode in ("full", "selective"):
        assert abs(losses[mode] - losses["none"]) <= tol
        worst = max(float((grads[mode][n] - g).abs().max()) for n, g in grads["none"].items())
        print(f"{dtype} {mode}: max |grad - grad without checkpointing| {worst:.1e}")
        assert set(grads[mode]) == set(grads["none"]) and worst <= tol


def _packed_logits(model: torch.nn.Module, docs: list[torch.Tensor], **kw: Any) -> torch.Tensor:
    ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
    with torch.no_grad():
        return model(input_ids=ids, position_ids=positions, **kw).logits[0]


def _docs(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 1700, (n,), generator=gen) for n in (9, 6, 11)]


def test_packed_attention_equals_each_document_alone() -> None:
    reference = tiny_model(0, dtype=torch.float32)
    packed = copy.deepcopy(reference)
    assert use_packed_attention(packed, "per_document") == "per_document"
    docs = _docs(1)
    with torch.no_grad():
        alone = torch.cat([reference(input_ids=d[None], use_cache=False).logits[0] for d in docs])
    targets = torch.cat([torch.cat([d[1:], d[:1]]) for d in docs])
    for kwargs in ({}, {"agentrl_documents": Documents.from_lengths([9, 6, 11])}, {"use_cache": True}):
        got = _packed_logits(packed, docs, **kwargs)
        lp = torch.log_softmax(got, -1).gather(1, targets[:, None])
        want = torch.log_softmax(alone, -1).gather(1, targets[:, None])
        err = float((lp - want).abs().max())
        print(f"packed (per document, {sorted(kwargs)}) vs alone: max |logprob diff| {err:.1e}")
        assert err <= 1e-5


@pytest.mark.parametrize("path", ["per_document", "per_document+cache", "model-sdpa", "model-eager", "scorer-model"])
def test_two_packed_documents_cannot_see_each_other(path: str) -> None:
    """Every attention path that runs on CPU: changing the first document changes nothing in the
    second. Transformers' own attention isolates them only without a cache object (use_cache=False,
    what the scorer passes; with use_cache=True documents attend to each other: the last assert)."""
    model = tiny_model(0, dtype=torch.float32)
    if path.startswith("per_document"):
        use_packed_attention(model, "per_document")
    elif path == "model-eager":
        model.set_attn_implementation("eager")
    first, second = _docs(2)[:2]
    other = (first + 17) % 1700
    kwargs = {"use_cache": path == "per_document+cache"} if path != "scorer-model" else {}
    if path == "scorer-model":
        backend = TorchTrainBackend(model, _config(dtype="float32", attention="model"))
        seqs = [[*first.tolist(), 1], [*second.tolist(), 1]]

        def second_logprobs(a: torch.Tensor) -> list[float]:
            batch = build_training_batch(trajectories(1, 1, seed=0))
            seq = batch.sequences[0]
            two = [copy.deepcopy(seq), copy.deepcopy(seq)]
            two[0].tokens, two[1].tokens = [*a.tolist(), 1], seqs[1]
            for s in two:
                n = len(s.tokens)
                s.loss_mask, s.rollout_logprobs, s.advantages = [0] * n, [0.0] * n, [0.0] * n
            return backend.compute_logprobs(TrainingBatch.from_sequences(two))[1]

        assert second_logprobs(first) == second_logprobs(other)
        return
    base = _packed_logits(model, [first, second], **kwargs)[len(first):]
    changed = _packed_logits(model, [other, second], **kwargs)[len(first):]
    assert torch.equal(base, changed)
    if path.startswith("model"):  # the trap: a cache object switches transformers' packing detection off
        leaked = _packed_logits(model, [other, second], use_cache=True)[len(first):]
        assert not torch.allclose(leaked, base, atol=1e-4)


def test_documents_from_positions_and_errors() -> None:
    docs = Documents.from_positions(torch.tensor([0, 1, 2, 0, 1, 0]))
    assert docs.lengths == (3, 2, 1) and docs.cu_seqlens.tolist() == [0, 3, 5, 6] and docs.max_length == 3
    assert Documents.from_positions(torch.tensor([[4, 5, 6]])).lengths == (3,)
    with pytest.raises(ValueError, match="lengths: expected one positive length per document"):
        Documents.from_lengths([3, 0])
    with pytest.raises(ValueError, match=r"attention='varlen': needs torch\.nn\.attention\.varlen"):
        use_packed_attention(tiny_model(0), "varlen")


def test_master_weights_learn_at_rl_learning_rates_where_pure_bfloat16_does_not() -> None:
    """One step at lr 1e-6: float32 masters move every weight that has a gradient by ~lr; the model's
    weights are the masters rounded. Pure bfloat16 leaves most weights where they were (and warns,
    naming the smallest update a weight of 0.02 can take)."""
    model = tiny_model(0, dtype=torch.float32)
    batch = _batch()
    common = {"dtype": "bfloat16", "optimizer": OptimizerConfig(lr=1e-6, grad_clip=None),
              "loss": LossConfig(old_logprobs="recompute")}
    mixed = TorchTrainBackend(copy.deepcopy(model), _config(**common))
    assert mixed.masters is not None and all(p.dtype == torch.bfloat16 for p in mixed.model.parameters())
    assert all(m.dtype == torch.float32 for m in mixed.masters.params)
    start = [m.clone() for m in mixed.masters.params]
    mixed.train_step(batch)
    moved = sum(int((m != s).sum()) for m, s in zip(mixed.masters.params, start, strict=True))
    total = sum(m.numel() for m in start)
    for param, master in zip(mixed.masters.model_params, mixed.masters.params, strict=True):
        assert torch.equal(param, master.to(torch.bfloat16))
    with pytest.warns(UserWarning, match=r"master_weights='none'.*smaller than 6\.1e-05"):
        pure = TorchTrainBackend(copy.deepcopy(model), _config(**common, master_weights="none"))
    before = [p.detach().clone() for p in pure.model.parameters()]
    pure.train_step(batch)
    pure_moved = sum(int((p != b).sum()) for p, b in zip(pure.model.parameters(), before, strict=True))
    print(f"lr 1e-6, one step: master weights moved {moved / total:.1%} of the parameters, pure bfloat16 "
          f"{pure_moved / total:.1%}")
    assert moved / total > 0.9 and pure_moved / total < 0.2
    assert smallest_update(torch.bfloat16) == 2.0 ** -14 and smallest_update(torch.float32, 1.0) == 2.0 ** -24


def test_master_weights_checkpoint_resumes_exactly(tmp_path: Path) -> None:
    batch = _batch(seed=5)
    cfg = _config(dtype="bfloat16", loss=LossConfig(old_logprobs="recompute"))
    backend = TorchTrainBackend(tiny_model(0, dtype=torch.float32), cfg)
    backend.train_step(batch)
    backend.save_checkpoint(tmp_path / "ckpt")
    backend.train_step(batch)
    fresh = TorchTrainBackend(tiny_model(4, dtype=torch.float32), cfg)
    fresh.load_checkpoint(tmp_path / "ckpt")
    fresh.train_step(batch)
    assert fresh.masters is not None and backend.masters is not None
    for a, b in zip(fresh.masters.params, backend.masters.params, strict=True):
        assert torch.equal(a, b)
    for (name, a), b in zip(fresh.model.named_parameters(), backend.model.parameters(), strict=True):
        assert torch.equal(a, b), name
    plain = TorchTrainBackend(tiny_model(4, dtype=torch.float32), _config(dtype="float32"))
    plain.save_checkpoint(tmp_path / "plain")
    with pytest.raises(ValueError, match="no master weights"):
        fresh.load_checkpoint(tmp_path / "plain")


def test_export_writes_the_serving_dtype_once_per_tied_weight(tmp_path: Path) -> None:
    from safetensors import safe_open

    sizes = {}
    for dtype in ("float32", "bfloat16"):
        backend = TorchTrainBackend(tiny_model(0, dtype=torch.float32), _config(dtype="float32", export_dtype=dtype),
                                    tokenizer=build_tokenizer())
        folder = backend.export_hf(tmp_path / dtype)
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            names = list(f.keys())
            assert {str(f.get_tensor(n).dtype) for n in names} == {f"torch.{dtype}"}
        assert "lm_head.weight" not in names  # tied to the input embedding: written once
        assert json.loads((folder / "config.json").read_text())["dtype"] == dtype
        sizes[dtype] = (folder / "model.safetensors").stat().st_size
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(str(folder))
        assert loaded.dtype == getattr(torch, dtype)
    assert sizes["bfloat16"] < 0.55 * sizes["float32"]


def test_autocast_with_a_low_precision_model_is_refused() -> None:
    with pytest.raises(ValueError, match=r"autocast: expected 'none' with dtype='bfloat16'"):
        TorchBackendConfig(dtype="bfloat16", autocast="bfloat16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # master weights: no warning
        TorchBackendConfig(dtype="bfloat16")
