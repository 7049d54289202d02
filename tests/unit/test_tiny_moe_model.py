"""The tiny Qwen3-MoE test model: per-expert tensor names on disk, a router that really chooses, a
next-token distribution that is not uniform, cached by shape and seed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from agentrl.testing import TINY_MOE_MODEL_CONFIG, build_tiny_moe_model


def test_the_model_is_saved_by_expert_and_serves_a_real_distribution(tmp_path: Path) -> None:
    folder = build_tiny_moe_model(tmp_path / "moe")
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["num_hidden_layers"], config["num_experts_per_tok"]) == (2, 2)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    for layer in range(2):
        assert f"model.layers.{layer}.mlp.gate.weight" in names
        for expert in range(8):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight" in names
    assert not any("gate_up_proj" in n for n in names) and "lm_head.weight" in names

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    ids = torch.arange(3, 67).unsqueeze(0)
    with torch.no_grad():
        out = model(ids)
        logp = torch.log_softmax(out.logits[0], dim=-1)
        chosen = [model.model.layers[i].mlp.gate(model.model.embed_tokens(ids)[0])[2] for i in range(2)]
    uniform = -math.log(model.config.vocab_size)
    assert float((logp.max(dim=-1).values - uniform).min()) > 0.5  # far from uniform at every position
    for experts in chosen:
        assert experts.shape == (64, 2) and len(set(experts.flatten().tolist())) >= 6  # the router spreads tokens


def test_the_cache_is_keyed_by_shape_and_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    first = build_tiny_moe_model()
    assert build_tiny_moe_model() == first and first.name.startswith("qwen3-moe-tiny-")
    assert build_tiny_moe_model(seed=1) != first
    assert build_tiny_moe_model(num_experts=4) != first
    with pytest.raises(TypeError, match=r"build_tiny_moe_model: unknown shape fields \['experts'\]"):
        build_tiny_moe_model(experts=4)
    assert TINY_MOE_MODEL_CONFIG["num_experts"] == 8
