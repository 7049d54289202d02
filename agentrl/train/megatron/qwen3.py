"""Hugging Face Qwen3 (dense) → megatron-core ``TransformerConfig`` and ``GPTModel``.

:class:`Qwen3Spec` holds the architecture values read from a Hugging Face ``config.json``;
:func:`transformer_config` turns them into Megatron's config with every RL-relevant default set
explicitly (dropout 0, no fused kernels, QK-norm, explicit ``kv_channels``), and
:func:`check_transformer_config` compares the two field by field. All of this runs before any
model is built, so a mismatch fails before an accelerator is touched.

Qwen3 traits and the Megatron settings they need:

- ``head_dim`` is explicit and may differ from ``hidden_size / num_attention_heads``
  (Megatron's ``kv_channels``);
- grouped-query attention (``num_key_value_heads`` → ``num_query_groups``) with RMSNorm on
  queries and keys per head (``qk_layernorm``), before RoPE;
- SwiGLU MLP (``gated_linear_unit`` with SiLU), no biases, RMSNorm everywhere;
- tied or untied input/output embeddings.

MoE Qwen3 (``qwen3_moe``) and RoPE scaling are rejected with a message; see docs/training.md for
what they would need.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.train.megatron.config import MegatronBackendConfig

__all__ = ["Qwen3Spec", "build_gpt_model", "check_transformer_config", "transformer_config"]

_ARCHITECTURES = ("Qwen3ForCausalLM",)


@dataclass(frozen=True)
class Qwen3Spec:
    """The architecture values of a dense Qwen3 checkpoint (from its ``config.json``)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, config: Any) -> Qwen3Spec:
        """From a ``transformers`` config object, a ``config.json`` dict, or a model folder path."""
        raw = _as_dict(config)
        model_type = raw.get("model_type")
        if model_type != "qwen3":
            hint = " (MoE Qwen3 is not supported by this backend yet)" if model_type == "qwen3_moe" else ""
            raise ValueError(f"model_type: expected 'qwen3' (dense Qwen3), got {model_type!r}{hint}")
        for key, bad in (("attention_bias", True), ("use_sliding_window", True)):
            if raw.get(key, False) == bad:
                raise ValueError(f"{key}: expected False for the megatron Qwen3 conversion, got {raw[key]!r}")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act: expected 'silu' (SwiGLU), got {act!r}")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if rope_type != "default":
            raise ValueError(f"rope_parameters.rope_type: expected 'default' (no RoPE scaling), got {rope_type!r}")
        nested = rope.get("rope_theta") if isinstance(rope, dict) else None
        theta: float = float(raw.get("rope_theta") or nested or 10000.0)
        heads = int(raw["num_attention_heads"])
        return cls(
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]), num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )

    def check_layout(self, config: MegatronBackendConfig) -> None:
        """Raise unless the model splits evenly over ``config``'s TP and PP sizes."""
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        for name, value in (("num_attention_heads", self.num_heads), ("num_key_value_heads", self.num_kv_heads),
                            ("intermediate_size", self.intermediate_size)):
            if value % tp:
                raise ValueError(f"tensor_parallel_size={tp}: must divide the model's {name}={value}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_key_value_heads={self.num_kv_heads}: must divide num_attention_heads="
                             f"{self.num_heads}")
        if self.num_layers % pp:
            raise ValueError(f"pipeline_parallel_size={pp}: must divide the model's num_hidden_layers="
                             f"{self.num_layers}")


def _as_dict(config: Any) -> dict[str, Any]:
    if isinstance(config, dict):
        return config
    if isinstance(config, str | Path):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        out: dict[str, Any] = to_dict()
        return out
    raise TypeError(f"config: expected a transformers config, a dict or a path, got {type(config).__name__}")


def transformer_config(spec: Qwen3Spec, config: MegatronBackendConfig, *, cpu_init: bool = False) -> Any:
    """Megatron's ``TransformerConfig`` for ``spec`` under ``config``'s parallel layout and dtype.

    The per-token loss flag is set because the backend's loss shares are already divided by the
    step's global counts: Megatron must neither average over micro-batches nor over DP ranks.
    ``cpu_init``: allocate parameters on the CPU (CPU runs); otherwise on the current accelerator.
    """
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    spec.check_layout(config)
    dtype = config.torch_dtype
    return TransformerConfig(
        num_layers=spec.num_layers, hidden_size=spec.hidden_size, ffn_hidden_size=spec.intermediate_size,
        num_attention_heads=spec.num_heads, num_query_groups=spec.num_kv_heads, kv_channels=spec.head_dim,
        normalization="RMSNorm", layernorm_epsilon=spec.rms_norm_eps, qk_layernorm=True,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=config.tensor_parallel_size,
        pipeline_model_parallel_size=config.pipeline_parallel_size,
        params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        pipeline_dtype=dtype, use_cpu_initialization=cpu_init, perform_initialization=False,
        variable_seq_lengths=True, moe_token_dispatcher_type="alltoall", calculate_per_token_loss=True,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        cross_entropy_loss_fusion=False, attention_softmax_in_fp32=True,
        **_recompute(config.activation_checkpointing),
    )


def _recompute(mode: str) -> dict[str, Any]:
    """Megatron's recompute settings for ``activation_checkpointing``."""
    if mode == "full":
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if mode == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": ["core_attn", "mlp"]}
    return {}


def check_transformer_config(spec: Qwen3Spec, tc: Any, *, rotary_base: float, vocab_size: int,
                             share_embeddings: bool) -> None:
    """Compare the Megatron model settings with the Hugging Face ones field by field; raise on the
    first mismatch, naming both fields and values."""
    pairs: list[tuple[str, object, str, object]] = [
        ("num_layers", tc.num_layers, "num_hidden_layers", spec.num_layers),
        ("hidden_size", tc.hidden_size, "hidden_size", spec.hidden_size),
        ("ffn_hidden_size", tc.ffn_hidden_size, "intermediate_size", spec.intermediate_size),
        ("num_attention_heads", tc.num_attention_heads, "num_attention_heads", spec.num_heads),
        ("num_query_groups", tc.num_query_groups, "num_key_value_heads", spec.num_kv_heads),
        ("kv_channels", tc.kv_channels, "head_dim", spec.head_dim),
        ("layernorm_epsilon", tc.layernorm_epsilon, "rms_norm_eps", spec.rms_norm_eps),
        ("rotary_base", rotary_base, "rope_theta", spec.rope_theta),
        ("share_embeddings_and_output_weights", share_embeddings, "tie_word_embeddings", spec.tie_word_embeddings),
        ("normalization", tc.normalization, "(Qwen3 uses)", "RMSNorm"),
        ("qk_layernorm", tc.qk_layernorm, "(Qwen3 uses q_norm/k_norm)", True),
        ("gated_linear_unit", tc.gated_linear_unit, "(Qwen3 MLP is SwiGLU)", True),
        ("add_bias_linear", tc.add_bias_linear, "attention_bias / mlp bias", False),
        ("add_qkv_bias", tc.add_qkv_bias, "attention_bias", False),
        ("hidden_dropout", tc.hidden_dropout, "(RL ratios need)", 0.0),
        ("attention_dropout", tc.attention_dropout, "(RL ratios need)", 0.0),
    ]
    for mname, mvalue, hname, hvalue in pairs:
        if mvalue != hvalue:
            raise ValueError(f"megatron config: {mname}={mvalue!r} does not match the Hugging Face {hname}={hvalue!r}")
    if getattr(tc.activation_func, "__name__", "") != "silu":
        raise ValueError(f"megatron config: activation_func={tc.activation_func!r}, expected silu (Qwen3 SwiGLU)")
    if vocab_size < spec.vocab_size:
        raise ValueError(f"megatron config: vocab_size={vocab_size} is smaller than the Hugging Face vocab_size="
                         f"{spec.vocab_size}")


def build_gpt_model(spec: Qwen3Spec, config: MegatronBackendConfig, *, pre_process: bool,
                    post_process: bool, cpu_init: bool = False, attention: str = "per_document") -> Any:
    """This pipeline stage's ``GPTModel`` (model-parallel state must be initialised), weights unset.

    Uses megatron-core's local layer spec (torch norms; no fused kernels) with the core attention of
    ``attention``, a resolved mode of :mod:`agentrl.train.megatron.attention`.
    """
    from megatron.core.models.gpt import GPTModel

    from agentrl.train.megatron.attention import layer_spec

    tc = transformer_config(spec, config, cpu_init=cpu_init)
    vocab = config.padded_vocab_size(spec.vocab_size)
    check_transformer_config(spec, tc, rotary_base=spec.rope_theta, vocab_size=vocab,
                             share_embeddings=spec.tie_word_embeddings)
    return GPTModel(
        config=tc, transformer_layer_spec=layer_spec(attention), vocab_size=vocab,
        max_sequence_length=spec.max_position_embeddings, pre_process=pre_process, post_process=post_process,
        parallel_output=True, share_embeddings_and_output_weights=spec.tie_word_embeddings,
        position_embedding_type="rope", rotary_percent=1.0, rotary_base=spec.rope_theta,  # type: ignore[arg-type]
    )
