"""LoRA on the torch backend: only the adapter trains, the reference is the base with the adapter
disabled, the merged export and the peft folder serve what the trainer scores, checkpoints resume
exactly, the probe adapter is put back bit for bit."""

from __future__ import annotations

import copy
import json
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
from agentrl.train.config import LoraSettings


def _config(**kw: Any) -> TorchBackendConfig:
    base: dict[str, Any] = {"device": "cpu", "dtype": "float32", "packing": PackingConfig(max_tokens=4096),
                            "loss": LossConfig(old_logprobs="recompute", eps_clip_high=0.28),
                            "optimizer": OptimizerConfig(lr=1e-2, grad_clip=None),
                            "lora": LoraSettings(rank=4, alpha=8)}
    return TorchBackendConfig(**{**base, **kw})


def _batch(seed: int = 3) -> TrainingBatch:
    return build_training_batch(trajectories(2, 3, seed=seed))


def _worst(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for r, s in zip(a, b, strict=True) for x, y in zip(r, s, strict=True))


def _base_state(backend: TorchTrainBackend) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in backend.model.state_dict().items() if ".lora_" not in k}


def test_only_the_adapter_trains_and_the_reference_is_the_base() -> None:
    model = tiny_model(0, dtype=torch.float32)
    plain = TorchTrainBackend(copy.deepcopy(model), _config(lora=None))
    backend = TorchTrainBackend(copy.deepcopy(model), _config(loss=LossConfig(old_logprobs="recompute",
                                                                             kl_loss_coef=0.1)))
    assert backend.adapter is not None and backend.ref_model is None
    trainable = [n for n, p in backend.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert backend.adapter.num_parameters() < sum(p.numel() for p in model.parameters()) / 20
    batch = _batch()
    # B = 0 at the start: the adapter changes nothing yet
    start = backend.compute_logprobs(batch)
    assert _worst(start, plain.compute_logprobs(batch)) < 1e-5
    base_before = _base_state(backend)
    for _ in range(3):
        metrics = backend.train_step(batch)
    assert metrics["kl"] > 0.0
    after = backend.compute_logprobs(batch)
    moved = _worst(after, start)
    assert moved > 1e-3
    # the base never moved; the reference (adapter disabled) still scores like the untouched model
    assert all(torch.equal(v, _base_state(backend)[k]) for k, v in base_before.items())
    reference = backend.compute_logprobs(batch, reference=True)
    assert _worst(reference, plain.compute_logprobs(batch)) < 1e-5


def test_merged_export_and_peft_folder_serve_what_the_trainer_scores(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backend = TorchTrainBackend(tiny_model(1, dtype=torch.float32), _config(), tokenizer=build_tokenizer())
    batch = _batch()
    for _ in range(2):
        backend.train_step(batch)
    trainer = backend.compute_logprobs(batch)
    merged_dir = backend.export_hf(tmp_path / "merged")
    names = json.loads((merged_dir / "model.safetensors.index.json").read_text())["weight_map"] \
        if (merged_dir / "model.safetensors.index.json").exists() else None
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32)
    assert names is None or not any("lora" in n or "base_layer" in n for n in names)
    plain = TorchTrainBackend(merged, _config(lora=None))
    assert _worst(plain.compute_logprobs(batch), trainer) < 1e-4
    # the peft folder on the base model: peft's own loader gives the same model
    base_dir = tmp_path / "base"
    TorchTrainBackend(tiny_model(1, dtype=torch.float32), _config(lora=None),
                      tokenizer=build_tokenizer()).export_hf(base_dir)
    folder = backend.export_adapter(tmp_path / "adapter")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32),
                                           str(folder))
    served = TorchTrainBackend(peft_model.merge_and_unload().requires_grad_(True), _config(lora=None))
    assert _worst(served.compute_logprobs(batch), trainer) < 1e-4
    # the engine's names: peft's prefix and the adapter name stripped
    tensors = backend.adapter_tensors()
    assert all(n.startswith("model.layers.") and (".lora_A.weight" in n or ".lora_B.weight" in n) for n in tensors)
    assert dict(backend.named_weights()).keys() == merged.state_dict().keys() - {"lm_head.weight"} or \
        dict(backend.named_weights()).keys() == merged.state_dict().keys()


def test_a_checkpoint_holds_the_adapter_and_resumes_exactly(tmp_path: Path) -> None:
    model = tiny_model(2, dtype=torch.float32)
    first = TorchTrainBackend(copy.deepcopy(model), _config())
    batch, later = _batch(3), _batch(4)
    first.train_step(batch)
    first.save_checkpoint(tmp_path / "ckpt")
    saved = torch.load(tmp_path / "ckpt" / "trainer.pt", weights_only=True)
    assert saved["lora"] and all(".lora_" in k for k in saved["model"])  # no copy of the frozen base
    expected = first.train_step(later)
    resumed = TorchTrainBackend(copy.deepcopy(model), _config())
    resumed.load_checkpoint(tmp_path / "ckpt")
    got = resumed.train_step(later)
    assert got["loss"] == expected["loss"]
    assert all(torch.equal(a, b) for a, b in zip(first.adapter.parameters(), resumed.adapter.parameters(), strict=True))
    with pytest.raises(ValueError, match=r"written with train\.lora, this backend runs without it"):
        TorchTrainBackend(copy.deepcopy(model), _config(lora=None)).load_checkpoint(tmp_path / "ckpt")


def test_the_probe_adapter_changes_the_model_and_is_put_back() -> None:
    backend = TorchTrainBackend(tiny_model(3, dtype=torch.float32), _config())
    batch = _batch()
    backend.train_step(batch)
    before = [p.detach().clone() for p in backend.adapter.parameters()]
    trained = backend.compute_logprobs(batch)
    with backend.adapter.probe_weights(seed=7):
        probed = backend.compute_logprobs(batch)
        again = backend.adapter.tensors()
    with backend.adapter.probe_weights(seed=7):
        assert all(torch.equal(a, b) for a, b in zip(again.values(), backend.adapter.tensors().values(), strict=True))
    diff = max(abs(a - b) for r, s in zip(probed, trained, strict=True) for a, b in zip(r[1:], s[1:], strict=True))
    assert diff > 0.05
    assert all(torch.equal(a, b) for a, b in zip(before, backend.adapter.parameters(), strict=True))
    assert backend.compute_logprobs(batch) == trained


def test_lora_dropout_acts_in_the_training_forward_only() -> None:
    """With dropout the scoring passes stay deterministic (dropout off); the training forward drops."""
    backend = TorchTrainBackend(tiny_model(), _config(lora=LoraSettings(rank=4, alpha=8, dropout=0.5)))
    assert backend.adapter is not None
    with torch.no_grad():
        for p in backend.adapter.parameters():
            p.normal_(0.0, 0.1)
    batch = _batch()
    assert backend.compute_logprobs(batch) == backend.compute_logprobs(batch)
    losses = set()
    for _ in range(2):
        torch.manual_seed(len(losses))
        losses.add(backend.forward_backward(batch, objective="sft")["loss"])
    assert len(losses) == 2  # two dropout masks, two losses
    assert backend.compute_logprobs(batch) == backend.compute_logprobs(batch)


def test_bad_lora_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"LoraSettings.rank=0: expected an int >= 1"):
        LoraSettings(rank=0)
    with pytest.raises(ValueError, match=r"LoraSettings.dropout=1.5"):
        LoraSettings(dropout=1.5)
    with pytest.raises(ValueError, match=r"sharding: expected 'auto' or 'none' with lora"):
        _config(sharding="fsdp")
    with pytest.raises(ValueError, match=r"train.lora.target_modules=\['w_in'\]: none is a module of Qwen3ForCausalLM"):
        TorchTrainBackend(tiny_model(0, dtype=torch.float32), _config(lora=LoraSettings(target_modules=("w_in",))))


def test_a_lora_checkpoint_holds_a_peft_adapter_folder_and_exports_merged_for_eval(tmp_path: Path) -> None:
    """``TrainService.save`` of a LoRA run writes the adapter as a peft folder beside the checkpoint, and
    ``agentrl eval --checkpoint``'s export merges it into the base: the same weights the trainer merges."""
    from safetensors.torch import load_file

    from agentrl.cli._eval_run import export_checkpoint
    from agentrl.runner.trainer import TrainService
    from agentrl.testing.runner import fake_run_config

    config = fake_run_config(tmp_path / "run", steps=1, lora={"rank": 4, "alpha": 8})
    service = TrainService.from_config(config, threads=1)
    assert service.backend.adapter is not None
    with torch.no_grad():
        for p in service.backend.adapter.parameters():
            p.normal_(0.0, 0.05)
    trainer_dir = tmp_path / "ckpt" / "trainer"
    service.save(trainer_dir)
    peft_config = json.loads((trainer_dir / "adapter" / "adapter_config.json").read_text())
    assert peft_config["r"] == 4 and peft_config["lora_alpha"] == 8
    assert (trainer_dir / "adapter" / "adapter_model.safetensors").is_file()

    exported = export_checkpoint(config, tmp_path / "ckpt", tmp_path / "merged")
    service.export_merged(tmp_path / "by-trainer")
    ours, theirs = load_file(exported / "model.safetensors"), load_file(tmp_path / "by-trainer" / "model.safetensors")
    assert ours.keys() == theirs.keys() and not any("lora" in k for k in ours)
    assert max(float((ours[k].float() - theirs[k].float()).abs().max()) for k in ours) < 1e-6
