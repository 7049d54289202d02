"""Tiny random Qwen3 and Qwen3-MoE models, built locally, that SGLang and transformers serve on CPU.

No model hub is reachable from tests or CI, so the engine tests use these models, with random
weights and the project's test tokenizer (:func:`agentrl.testing.build_tokenizer`), saved with
``save_pretrained`` in bfloat16:

- :func:`build_tiny_model`: a 2-layer Qwen3 (hidden 64, 4 heads of **head_dim 32**, 2 KV heads, tied
  embeddings), about 0.5 MB;
- :func:`build_tiny_moe_model`: a 2-layer Qwen3-MoE (``Qwen3MoeForCausalLM``: hidden 128, 4 heads of
  head_dim 32, 2 KV heads, **8 experts, top-2**, expert width 64, ``norm_topk_prob`` as Qwen3-30B-A3B,
  untied output embedding), about 1.5 MB. transformers keeps the experts as stacked
  ``mlp.experts.gate_up_proj``/``down_proj`` tensors in memory but saves them by expert, as the
  published checkpoints are: ``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight`` and the
  router ``model.layers.N.mlp.gate.weight``.

Different ``seed`` values give different weights with the same shapes, which is what a
weight-update test needs. Greedy output of a random tied-embedding model tends to repeat the input
token; that is expected.

Example::

    from agentrl.testing import build_tiny_model
    path = build_tiny_model()            # cached under ~/.cache/agentrl/models/
    # python -m sglang.launch_server --model-path <path> --device cpu ...
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from agentrl.testing._cache import build_folder, cache_root

__all__ = ["TINY_MODEL_CONFIG", "TINY_MOE_MODEL_CONFIG", "build_tiny_model", "build_tiny_moe_model"]

TINY_MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}
TINY_MOE_MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,  # the dense MLP of layers listed in mlp_only_layers (none by default)
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}
_BUILD_VERSION = "2"
_MOE_BUILD_VERSION = "1"


def build_tiny_model(path: str | os.PathLike[str] | None = None, *, seed: int = 0, **shape: Any) -> Path:
    """Builds (once) the tiny Qwen3 model with weights drawn from ``seed``; returns its folder.

    ``shape``: ``Qwen3Config`` fields that replace :data:`TINY_MODEL_CONFIG`'s (e.g.
    ``hidden_size=128, intermediate_size=384``; unknown names are an error). Without ``path`` the
    model is cached under ``$AGENTRL_CACHE/models`` (default ``~/.cache/agentrl``), keyed by the
    configuration and seed. The folder holds ``config.json``, ``model.safetensors``,
    ``generation_config.json`` and the tokenizer files.
    """
    return _build("qwen3", TINY_MODEL_CONFIG, _BUILD_VERSION, path, seed, shape)


def build_tiny_moe_model(path: str | os.PathLike[str] | None = None, *, seed: int = 0, **shape: Any) -> Path:
    """Builds (once) the tiny Qwen3-MoE model with weights drawn from ``seed``; returns its folder.

    ``shape``: ``Qwen3MoeConfig`` fields that replace :data:`TINY_MOE_MODEL_CONFIG`'s (e.g.
    ``num_experts=16, num_hidden_layers=4``; unknown names are an error). Cached and laid out as
    :func:`build_tiny_model`'s folder (``qwen3-moe-tiny-<key>``), the experts saved by expert.
    """
    return _build("qwen3_moe", TINY_MOE_MODEL_CONFIG, _MOE_BUILD_VERSION, path, seed, shape)


def _build(kind: str, defaults: dict[str, Any], version: str, path: str | os.PathLike[str] | None, seed: int,
           shape: dict[str, Any]) -> Path:
    from agentrl.testing.tokenizer import build_tokenizer

    unknown = sorted(set(shape) - set(defaults))
    if unknown:
        caller = "build_tiny_model" if kind == "qwen3" else "build_tiny_moe_model"
        raise TypeError(f"{caller}: unknown shape fields {unknown}; expected some of {sorted(defaults)}")
    config = {**defaults, **shape}
    key = hashlib.sha256(f"{version}:{sorted(config.items())}:{seed}".encode()).hexdigest()[:12]
    name = "qwen3-tiny" if kind == "qwen3" else "qwen3-moe-tiny"
    folder = Path(path) if path is not None else cache_root() / "models" / f"{name}-{key}"
    return build_folder(folder, ("model.safetensors", "tokenizer.json"),
                        lambda tmp: _write_model(tmp, build_tokenizer(), seed, kind, config), key=f"{name}-{key}")


def _write_model(out: Path, tokenizer: object, seed: int, kind: str, shape: dict[str, Any]) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    vocab = len(tokenizer)  # type: ignore[arg-type]
    vocab = (vocab + 63) // 64 * 64  # SGLang pads the vocabulary too; a multiple of 64 keeps shapes equal
    eos_id = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))  # type: ignore[attr-defined]
    pad_id = int(tokenizer.convert_tokens_to_ids("<|endoftext|>"))  # type: ignore[attr-defined]
    config_class: Any = Qwen3Config if kind == "qwen3" else Qwen3MoeConfig
    config = config_class(vocab_size=vocab, bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id,
                          dtype="bfloat16", **shape)
    torch.manual_seed(seed)
    model: Any = (Qwen3ForCausalLM if kind == "qwen3" else Qwen3MoeForCausalLM)(config)
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        # Embeddings wider than the default 0.02 so the next-token distribution is neither uniform
        # noise nor a point mass (with tied embeddings, std 1.0 makes "repeat the last token" certain).
        model.get_input_embeddings().weight.normal_(0.0, 0.1)
        if kind == "qwen3_moe":
            # The untied output embedding likewise; routers at 0.1 give logits of std ~1 over the
            # experts (the default 0.02 leaves the top-k of most tokens a near tie).
            model.get_output_embeddings().weight.normal_(0.0, 0.1)
            for layer in model.model.layers:
                gate = getattr(layer.mlp, "gate", None)
                if gate is not None:
                    gate.weight.normal_(0.0, 0.1)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))  # type: ignore[attr-defined]
