"""A tiny Llama written as a GGUF file the way llama.cpp's converter writes one, built locally.

No model hub is reachable from tests, so the GGUF import (:mod:`agentrl.models`) is tested on a file
this module writes: a small ``LlamaForCausalLM`` with random weights and the project's test tokenizer
(:func:`~agentrl.testing.build_tokenizer`), saved once as a Hugging Face folder (the reference) and
once as GGUF with llama.cpp's conventions: tensor names ``token_embd`` / ``blk.N.attn_q`` / ...,
the query and key rows permuted into llama.cpp's rotary layout, no ``output.weight`` when the
embeddings are tied, the vocabulary as ``tokenizer.ggml.*`` metadata (byte-level BPE tokens, their
types, the merges, the special ids, the chat template). Weights are stored as F32, or as Q8_0
blocks (2-D weights only, as llama.cpp quantises them), which the import must dequantise.

``architecture`` other than ``"llama"`` writes the same tensors under another
``general.architecture``: a file transformers cannot read, for the import's error path.

Example::

    gguf_path, reference = write_tiny_gguf(tmp_path / "tiny.gguf", quant="Q8_0")
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

__all__ = ["TINY_LLAMA_CONFIG", "write_tiny_gguf"]

TINY_LLAMA_CONFIG: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2048, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
}
"""The tiny Llama's shape: every 2-D weight's rows are a multiple of Q8_0's 32-value block."""

_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_USER_DEFINED, _TOKEN_UNUSED = 1, 3, 4, 5


def _permute(weight: Any, heads: int) -> Any:
    """llama.cpp's rotary layout for query/key rows: each head's two halves interleaved."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _tensors(model: Any, config: dict[str, Any]) -> list[tuple[str, Any]]:
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = [("token_embd.weight", state["model.embed_tokens.weight"]),
           ("output_norm.weight", state["model.norm.weight"])]
    if not config["tie_word_embeddings"]:
        out.append(("output.weight", state["lm_head.weight"]))
    names = {"input_layernorm": "attn_norm", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(config["num_hidden_layers"]):
        src = f"model.layers.{i}."
        out.append((f"blk.{i}.attn_q.weight",
                    _permute(state[src + "self_attn.q_proj.weight"], config["num_attention_heads"])))
        out.append((f"blk.{i}.attn_k.weight",
                    _permute(state[src + "self_attn.k_proj.weight"], config["num_key_value_heads"])))
        for hf, cpp in names.items():
            out.append((f"blk.{i}.{cpp}.weight", state[src + hf + ".weight"]))
    return out


def _vocabulary(tokenizer: Any, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens in id order (padded with llama.cpp's ``[PADn]`` placeholders), their types, the merges."""
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    by_id = {i: t for t, i in data["model"]["vocab"].items()}
    added = {a["id"]: a for a in data["added_tokens"]}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(_TOKEN_CONTROL if added[i]["special"] else _TOKEN_USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(_TOKEN_NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(_TOKEN_UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, types, merges


def write_tiny_gguf(path: str | os.PathLike[str], *, quant: Literal["F32", "Q8_0"] = "F32", seed: int = 0,
                    architecture: str = "llama", pre_tokenizer: str = "qwen2",
                    reference: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """Writes the tiny Llama as GGUF to ``path``; returns ``(path, reference folder)``.

    The reference folder (default: ``path`` with ``.hf`` for its suffix) holds the same model as a
    Hugging Face folder, float32, with the test tokenizer. ``pre_tokenizer`` is the file's
    ``tokenizer.ggml.pre`` (llama.cpp's name for how text is split before BPE).
    """
    import gguf
    import numpy as np
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from agentrl.testing.tokenizer import build_tokenizer

    out = Path(path)
    ref = Path(reference) if reference is not None else out.with_suffix(".hf")
    tokenizer = build_tokenizer()
    vocab_size = (len(tokenizer) + 63) // 64 * 64
    eos, pad = (int(tokenizer.convert_tokens_to_ids(t)) for t in ("<|im_end|>", "<|endoftext|>"))
    shape = dict(TINY_LLAMA_CONFIG)
    config = LlamaConfig(vocab_size=vocab_size, bos_token_id=None, eos_token_id=eos, pad_token_id=pad,
                         **shape)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():  # wider than the default 0.02, so the next-token distribution is not near-uniform
        model.get_input_embeddings().weight.normal_(0.0, 0.1)
    ref.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(ref))
    GenerationConfig(eos_token_id=eos, pad_token_id=pad).save_pretrained(str(ref))
    tokenizer.save_pretrained(str(ref))

    writer = gguf.GGUFWriter(str(out), architecture)
    writer.add_name("tiny-llama-test")
    writer.add_context_length(shape["max_position_embeddings"])
    writer.add_embedding_length(shape["hidden_size"])
    writer.add_block_count(shape["num_hidden_layers"])
    writer.add_feed_forward_length(shape["intermediate_size"])
    writer.add_head_count(shape["num_attention_heads"])
    writer.add_head_count_kv(shape["num_key_value_heads"])
    writer.add_rope_freq_base(shape["rope_theta"])
    writer.add_layer_norm_rms_eps(shape["rms_norm_eps"])
    writer.add_rope_dimension_count(shape["head_dim"])
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant == "Q8_0" else gguf.LlamaFileType.ALL_F32)
    tokens, types, merges = _vocabulary(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(eos)
    writer.add_pad_token_id(pad)
    writer.add_add_bos_token(False)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
    for name, array in _tensors(model, shape):
        array = np.ascontiguousarray(array, dtype=np.float32)
        if quant == "Q8_0" and array.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out, ref
