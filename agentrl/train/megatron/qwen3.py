"""Hugging Face Qwen3 (dense and mixture-of-experts) → megatron-core ``TransformerConfig`` and ``GPTModel``.

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
- tied or untied input/output embeddings;
- ``qwen3_moe``: every layer's MLP is ``num_experts`` SwiGLU experts of ``moe_intermediate_size``
  behind a bias-free linear router: softmax over all experts, the top ``num_experts_per_tok``, their
  probabilities renormalised when ``norm_topk_prob`` (Megatron: softmax over the top-k logits,
  ``moe_router_pre_softmax=False``, the same numbers) or not (``moe_router_pre_softmax=True``); no
  shared expert, no load-balancing loss in RL (see :mod:`agentrl.train.megatron.moe`).

RoPE scaling, MoE models with dense layers between the sparse ones (``mlp_only_layers``,
``decoder_sparse_step``) and Qwen3.5-MoE (Gated DeltaNet layers, a vision tower) are rejected with a
message; see docs/training.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.train.megatron.config import MegatronBackendConfig

__all__ = ["Qwen3Spec", "build_gpt_model", "check_transformer_config", "transformer_config"]

_MODEL_TYPES = ("qwen3", "qwen3_moe")


@dataclass(frozen=True)
class Qwen3Spec:
    """The architecture values of a Qwen3 checkpoint (from its ``config.json``).

    ``num_experts`` is 0 for a dense model; a ``qwen3_moe`` model has ``num_experts`` experts of
    ``moe_intermediate_size`` in every layer and routes each token to ``experts_per_token`` of them
    (``intermediate_size`` is then unused)."""

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
    num_experts: int = 0
    moe_intermediate_size: int = 0
    experts_per_token: int = 0
    norm_topk_prob: bool = True

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @classmethod
    def from_hf(cls, config: Any) -> Qwen3Spec:
        """From a ``transformers`` config object, a ``config.json`` dict, or a model folder path."""
        raw = _as_dict(config)
        model_type = raw.get("model_type")
        if model_type not in _MODEL_TYPES:
            from agentrl.train.moe_models import REFUSED_MOE_TYPES

            hint = f" ({REFUSED_MOE_TYPES[model_type]})" if model_type in REFUSED_MOE_TYPES else ""
            raise ValueError(f"model_type: expected 'qwen3' (dense Qwen3) or 'qwen3_moe' (Qwen3 mixture of experts), "
                             f"got {model_type!r}{hint}")
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
        moe = _moe_fields(raw) if model_type == "qwen3_moe" else {}
        return cls(
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]), num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), **moe,
        )

    def check_layout(self, config: MegatronBackendConfig) -> None:
        """Raise unless the model splits evenly over ``config``'s TP and PP sizes."""
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        ffn = ("moe_intermediate_size", self.moe_intermediate_size) if self.is_moe else (
            "intermediate_size", self.intermediate_size)
        for name, value in (("num_attention_heads", self.num_heads), ("num_key_value_heads", self.num_kv_heads), ffn):
            if value % tp:
                raise ValueError(f"tensor_parallel_size={tp}: must divide the model's {name}={value}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_key_value_heads={self.num_kv_heads}: must divide num_attention_heads="
                             f"{self.num_heads}")
        if self.num_layers % pp:
            raise ValueError(f"pipeline_parallel_size={pp}: must divide the model's num_hidden_layers="
                             f"{self.num_layers}")
        ep = config.expert_parallel_size
        if not self.is_moe:
            if ep != 1:
                raise ValueError(f"expert_parallel_size={ep}: the model has no experts (dense Qwen3); expected 1")
            return
        if self.num_experts % ep:
            raise ValueError(f"expert_parallel_size={ep}: must divide the model's num_experts={self.num_experts}")
        if tp > 1:
            raise ValueError(f"tensor_parallel_size={tp} with a mixture-of-experts model: Megatron's MoE layers need "
                             "sequence parallelism under tensor parallelism, which this backend does not run; expected "
                             "tensor_parallel_size=1 (scale with expert_parallel_size and pipeline_parallel_size)")


def _moe_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The MoE values of a ``qwen3_moe`` config; refuses dense layers between the sparse ones."""
    experts = raw.get("num_experts") or raw.get("num_local_experts")
    if not experts:
        raise ValueError("num_experts: expected a positive number of experts for model_type 'qwen3_moe', got "
                         f"{experts!r}")
    only_dense = list(raw.get("mlp_only_layers") or [])
    step = int(raw.get("decoder_sparse_step", 1) or 1)
    if only_dense or step != 1:
        raise ValueError(f"mlp_only_layers={only_dense}, decoder_sparse_step={step}: the megatron backend converts "
                         "Qwen3-MoE models whose every layer is sparse; expected [] and 1")
    top_k = int(raw.get("num_experts_per_tok", 0))
    if not 1 <= top_k <= int(experts):
        raise ValueError(f"num_experts_per_tok: expected 1..{experts}, got {top_k}")
    return {"num_experts": int(experts), "moe_intermediate_size": int(raw["moe_intermediate_size"]),
            "experts_per_token": top_k, "norm_topk_prob": bool(raw.get("norm_topk_prob", False))}


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


def transformer_config(spec: Qwen3Spec, config: MegatronBackendConfig, *, cpu_init: bool = False,
                       grouped_gemm: bool = False) -> Any:
    """Megatron's ``TransformerConfig`` for ``spec`` under ``config``'s parallel layout and dtype.

    The per-token loss flag is set because the backend's loss shares are already divided by the
    step's global counts: Megatron must neither average over micro-batches nor over DP ranks.
    ``cpu_init``: allocate parameters on the CPU (CPU runs); otherwise on the current accelerator.
    ``grouped_gemm``: a MoE model's experts as one grouped GEMM (resolved by
    :func:`agentrl.train.megatron.moe.resolve_grouped_gemm`).
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
        **_recompute(config.activation_checkpointing, moe=spec.is_moe), **_moe(spec, config, grouped_gemm),
    )


def _moe(spec: Qwen3Spec, config: MegatronBackendConfig, grouped_gemm: bool) -> dict[str, Any]:
    """Megatron's MoE settings for a ``qwen3_moe`` spec (none for a dense one). Qwen3's router is a
    softmax over every expert, then the top k (renormalised with ``norm_topk_prob``): Megatron's
    ``moe_router_pre_softmax=False`` takes the softmax of the top-k logits, which is that
    renormalisation. No load-balancing loss, no token dropping, no fused router (it skips replay)."""
    if not spec.is_moe:
        return {}
    return {
        "num_moe_experts": spec.num_experts, "moe_ffn_hidden_size": spec.moe_intermediate_size,
        "moe_router_topk": spec.experts_per_token, "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not spec.norm_topk_prob, "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "expert_model_parallel_size": config.expert_parallel_size, "expert_tensor_parallel_size": 1,
        "moe_grouped_gemm": grouped_gemm, "moe_enable_routing_replay": True, "moe_router_fusion": False,
        "moe_permute_fusion": False,
    }


def _recompute(mode: str, *, moe: bool = False) -> dict[str, Any]:
    """Megatron's recompute settings for ``activation_checkpointing`` (selective: the core attention and
    the MLP, which for a MoE layer is Megatron's ``"moe"`` module: router, dispatch, experts)."""
    if mode == "full":
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if mode == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": ["core_attn", "moe" if moe else "mlp"]}
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
    if spec.is_moe:
        _check_moe(spec, tc)
    if getattr(tc.activation_func, "__name__", "") != "silu":
        raise ValueError(f"megatron config: activation_func={tc.activation_func!r}, expected silu (Qwen3 SwiGLU)")
    if vocab_size < spec.vocab_size:
        raise ValueError(f"megatron config: vocab_size={vocab_size} is smaller than the Hugging Face vocab_size="
                         f"{spec.vocab_size}")


def _check_moe(spec: Qwen3Spec, tc: Any) -> None:
    pairs: list[tuple[str, object, str, object]] = [
        ("num_moe_experts", tc.num_moe_experts, "num_experts", spec.num_experts),
        ("moe_ffn_hidden_size", tc.moe_ffn_hidden_size, "moe_intermediate_size", spec.moe_intermediate_size),
        ("moe_router_topk", tc.moe_router_topk, "num_experts_per_tok", spec.experts_per_token),
        ("moe_router_pre_softmax", tc.moe_router_pre_softmax, "norm_topk_prob (negated)", not spec.norm_topk_prob),
        ("moe_router_score_function", tc.moe_router_score_function, "(Qwen3 router)", "softmax"),
        ("moe_shared_expert_intermediate_size", tc.moe_shared_expert_intermediate_size, "(Qwen3 has no shared expert)",
         None),
        ("moe_expert_capacity_factor", tc.moe_expert_capacity_factor, "(Qwen3 drops no token)", None),
        ("moe_router_num_groups", tc.moe_router_num_groups, "(Qwen3 routes over all experts)", None),
        ("moe_router_topk_scaling_factor", tc.moe_router_topk_scaling_factor, "(Qwen3 scales no gate)", None),
        ("moe_router_enable_expert_bias", tc.moe_router_enable_expert_bias, "(Qwen3 router has no bias)", False),
        ("moe_input_jitter_eps", tc.moe_input_jitter_eps, "(RL ratios need a deterministic router)", None),
    ]
    for mname, mvalue, hname, hvalue in pairs:
        if mvalue != hvalue:
            raise ValueError(f"megatron config: {mname}={mvalue!r} does not match the Hugging Face {hname}={hvalue!r}")
    if tc.moe_router_fusion:
        raise ValueError("megatron config: moe_router_fusion=True computes the top-k in a fused kernel that skips "
                         "routing replay (the engine's experts would be ignored); expected moe_router_fusion=False")
    if not tc.moe_enable_routing_replay:
        raise ValueError("megatron config: moe_enable_routing_replay=False leaves the routers without a replay hook; "
                         "expected True (routing_replay='off' still routes with the trainer's router)")


def build_gpt_model(spec: Qwen3Spec, config: MegatronBackendConfig, *, pre_process: bool,
                    post_process: bool, cpu_init: bool = False, attention: str = "per_document",
                    grouped_gemm: bool = False) -> Any:
    """This pipeline stage's ``GPTModel`` (model-parallel state must be initialised), weights unset.

    Uses megatron-core's local layer spec (torch norms; no fused kernels) with the core attention of
    ``attention``, a resolved mode of :mod:`agentrl.train.megatron.attention`; a MoE model's MLPs are
    Megatron's ``MoELayer`` with sequential experts, or grouped ones with ``grouped_gemm``.
    """
    from megatron.core.models.gpt import GPTModel

    from agentrl.train.megatron.attention import layer_spec

    tc = transformer_config(spec, config, cpu_init=cpu_init, grouped_gemm=grouped_gemm)
    vocab = config.padded_vocab_size(spec.vocab_size)
    check_transformer_config(spec, tc, rotary_base=spec.rope_theta, vocab_size=vocab,
                             share_embeddings=spec.tie_word_embeddings)
    experts = spec.num_experts if spec.is_moe else None
    return GPTModel(
        config=tc, transformer_layer_spec=layer_spec(attention, num_experts=experts, grouped_gemm=grouped_gemm),
        vocab_size=vocab,
        max_sequence_length=spec.max_position_embeddings, pre_process=pre_process, post_process=post_process,
        parallel_output=True, share_embeddings_and_output_weights=spec.tie_word_embeddings,
        position_embedding_type="rope", rotary_percent=1.0, rotary_base=spec.rope_theta,  # type: ignore[arg-type]
    )
