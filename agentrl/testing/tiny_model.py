"""A tiny random Qwen3 model, built locally, that SGLang and transformers serve on CPU.

No model hub is reachable from tests or CI, so the engine tests use this model: a 2-layer Qwen3
(hidden 64, 4 heads of **head_dim 32**, 2 KV heads, tied embeddings) with random weights and the
project's test tokenizer (:func:`agentrl.testing.build_tokenizer`), saved with ``save_pretrained``
in bfloat16 (about 0.5 MB). Different ``seed`` values give different weights with the same shapes,
which is what a weight-update test needs. Greedy output of a random tied-embedding model tends to
repeat the input token; that is expected.

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

__all__ = ["TINY_MODEL_CONFIG", "build_tiny_model"]

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
_BUILD_VERSION = "2"


def build_tiny_model(path: str | os.PathLike[str] | None = None, *, seed: int = 0, **shape: Any) -> Path:
    """Builds (once) the tiny Qwen3 model with weights drawn from ``seed``; returns its folder.

    ``shape``: ``Qwen3Config`` fields that replace :data:`TINY_MODEL_CONFIG`'s (e.g.
    ``hidden_size=128, intermediate_size=384``; unknown names are an error). Without ``path`` the
    model is cached under ``$AGENTRL_CACHE/models`` (default ``~/.cache/agentrl``), keyed by the
    configuration and seed. The folder holds ``config.json``, ``model.safetensors``,
    ``generation_config.json`` and the tokenizer files.
    """
    from agentrl.testing.tokenizer import build_tokenizer

    unknown = sorted(set(shape) - set(TINY_MODEL_CONFIG))
    if unknown:
        raise TypeError(f"build_tiny_model: unknown shape fields {unknown}; expected some of {sorted(TINY_MODEL_CONFIG)}")
    config = {**TINY_MODEL_CONFIG, **shape}
    key = hashlib.sha256(f"{_BUILD_VERSION}:{sorted(config.items())}:{seed}".encode()).hexdigest()[:12]
    folder = Path(path) if path is not None else cache_root() / "models" / f"qwen3-tiny-{key}"
    return build_folder(folder, ("model.safetensors", "tokenizer.json"),
                        lambda tmp: _write_model(tmp, build_tokenizer(), seed, config))


def _write_model(out: Path, tokenizer: object, seed: int, shape: dict[str, Any]) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    vocab = len(tokenizer)  # type: ignore[arg-type]
    vocab = (vocab + 63) // 64 * 64  # SGLang pads the vocabulary too; a multiple of 64 keeps shapes equal
    eos_id = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))  # type: ignore[attr-defined]
    pad_id = int(tokenizer.convert_tokens_to_ids("<|endoftext|>"))  # type: ignore[attr-defined]
    config = Qwen3Config(vocab_size=vocab, bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id,
                         dtype="bfloat16", **shape)
    torch.manual_seed(seed)
    model: Any = Qwen3ForCausalLM(config)
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        # Embeddings wider than the default 0.02 so the next-token distribution is neither uniform
        # noise nor a point mass (with tied embeddings, std 1.0 makes "repeat the last token" certain).
        model.get_input_embeddings().weight.normal_(0.0, 0.1)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))  # type: ignore[attr-defined]
