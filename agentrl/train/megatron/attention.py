"""Packed attention for the megatron backend: each document of a packed row attends to itself only,
with no ``[S, S]`` score matrix or mask.

megatron-core's local ``DotProductAttention`` computes ``[b, heads, S, S]`` scores (with a float32
softmax: ~34 GB bf16 + 68 GB fp32 per layer for Qwen3-4B at 32k tokens) and refuses packed
sequences. Modes (``MegatronBackendConfig.attention``):

- ``"te"``: Transformer Engine's ``TEDotProductAttention`` as the local spec's core attention, fed
  packed (THD) sequences through ``PackedSeqParams`` (RoPE then restarts per document inside
  megatron-core); only where ``transformer_engine`` is installed, on CUDA;
- ``"per_document"``: ``PackedCoreAttention`` (:func:`packed_core_attention`), a core-attention module for the local spec that
  runs the torch backend's kernels (:mod:`agentrl.train.attention`: flash-attn or torch's varlen on
  CUDA, causal SDPA per document elsewhere). The row's document offsets travel in the
  ``attention_mask`` argument as a 1-D int32 tensor ``[0, n0, n0+n1, ...]`` (a tensor, so Megatron's
  recompute checkpoints carry it);
- ``"dense"``: the local ``DotProductAttention`` with a ``[1, 1, S, S]`` block-diagonal mask (the
  reference the others are checked against; quadratic in the row);
- ``"auto"``: ``"te"`` where it applies, else ``"per_document"``.

In ``"per_document"`` and ``"dense"`` modes RoPE angles come from each token's position id (see
:mod:`agentrl.train.megatron.forward`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from typing import Any

import torch

from agentrl.train.attention import Documents, _flash_attn, _per_document, _torch_varlen, resolve_kernel

__all__ = ["MEGATRON_ATTENTION", "layer_spec", "packed_core_attention", "packed_core_attention_forward",
           "resolve_attention"]

MEGATRON_ATTENTION = ("auto", "te", "per_document", "dense")


def _has_te() -> bool:
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


def resolve_attention(mode: str, device: torch.device) -> str:
    """The attention mode ``mode`` means on ``device`` (``"auto"`` resolved); ``ValueError`` for
    ``"te"`` without Transformer Engine or CUDA."""
    if mode not in MEGATRON_ATTENTION:
        raise ValueError(f"attention: expected one of {list(MEGATRON_ATTENTION)}, got {mode!r}")
    te_ok = device.type == "cuda" and _has_te()
    if mode == "auto":
        return "te" if te_ok else "per_document"
    if mode == "te" and not te_ok:
        raise ValueError(f"attention='te': needs the transformer_engine package and a CUDA device; got device "
                         f"{device.type}, transformer_engine installed: {_has_te()}; use attention='per_document'")
    return mode


@functools.cache
def packed_core_attention() -> type:
    """:class:`PackedCoreAttention`'s class, built on megatron-core's ``MegatronModule`` on first use
    (so importing this module needs no megatron-core)."""
    from megatron.core.transformer.module import MegatronModule

    class PackedCoreAttention(MegatronModule):  # type: ignore[misc]
        """Core attention for megatron-core's local layer spec: causal within each document of the row.

        ``forward(query [S, 1, heads/TP, d], key/value [S, 1, groups/TP, d], attention_mask)``, with
        ``attention_mask`` the row's cumulative document offsets (1-D int32), returns
        ``[S, 1, heads/TP·d]``. Holds no parameters. Built by megatron-core with its core-attention
        arguments.
        """

        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                     attention_dropout: float | None = None, softmax_scale: float | None = None,
                     cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
            super().__init__(config=config)
            if attention_dropout or config.attention_dropout:
                raise ValueError("attention_dropout: packed attention runs without dropout (RL ratios need 0)")
            self.softmax_scale = softmax_scale if softmax_scale is not None else config.kv_channels ** -0.5

        def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                    attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None,
                    ) -> torch.Tensor:
            return packed_core_attention_forward(query, key, value, attention_mask, self.softmax_scale,
                                                 packed_seq_params=packed_seq_params, attention_bias=attention_bias)

    return PackedCoreAttention


def packed_core_attention_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, offsets: Any,
                                  scale: float, *, packed_seq_params: Any = None, attention_bias: Any = None,
                                  ) -> torch.Tensor:
    """What :class:`PackedCoreAttention` computes: ``[S, 1, heads·d]`` from megatron's ``[S, 1, heads, d]``
    query and ``[S, 1, groups, d]`` key and value, causal within the documents ``offsets`` delimit."""
    if packed_seq_params is not None or attention_bias is not None:
        raise ValueError("PackedCoreAttention: expected the documents in attention_mask (1-D offsets), not "
                         "packed_seq_params or an attention bias")
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1:
        raise ValueError("PackedCoreAttention: attention_mask must be the row's 1-D document offsets, got "
                         f"{type(offsets).__name__}")
    lengths = tuple(int(n) for n in (offsets[1:] - offsets[:-1]).tolist())
    docs = Documents(lengths, offsets)
    q, k, v = query[:, 0], key[:, 0], value[:, 0]  # [S, heads, d]
    kernel = resolve_kernel("auto", q.device, q.dtype)
    if kernel == "flash_attn":
        out = _flash_attn(q, k, v, docs, scale)
    elif kernel == "varlen":
        out = _torch_varlen(q, k, v, docs, scale)
    else:
        out = _per_document(q, k, v, docs, scale)
    return out.reshape(out.shape[0], 1, -1)


def layer_spec(mode: str, *, num_experts: int | None = None, grouped_gemm: bool = False) -> Any:
    """megatron-core's local GPT layer spec (torch norms, no fused kernels) with the core attention of
    ``mode`` (a resolved mode: ``"te"``, ``"per_document"`` or ``"dense"``); with ``num_experts``, a
    ``MoELayer`` MLP whose experts run one after the other (``SequentialMLP``) or, with
    ``grouped_gemm``, as Transformer Engine's grouped GEMM (``TEGroupedMLP``)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm", num_experts=num_experts)
    if num_experts is not None and grouped_gemm:
        from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
        from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec_for_backend

        mlp = get_moe_module_spec_for_backend(TESpecProvider(), num_experts=num_experts, moe_grouped_gemm=True)
        spec = dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, mlp=mlp))
    if mode == "dense":
        return spec
    if mode == "te":
        from megatron.core.extensions.transformer_engine import TEDotProductAttention

        core: Any = TEDotProductAttention
    else:
        core = packed_core_attention()
    attention = spec.submodules.self_attention
    submodules = dataclasses.replace(attention.submodules, core_attention=core)
    return dataclasses.replace(spec, submodules=dataclasses.replace(
        spec.submodules, self_attention=dataclasses.replace(attention, submodules=submodules)))
