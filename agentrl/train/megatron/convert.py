"""Qwen3 weights between Hugging Face names and Megatron's TP-sharded, PP-staged parameters.

Megatron (local layer spec) keeps, per layer: ``linear_qkv`` with queries, keys and values
interleaved by query group (``[q of group g; k_g; v_g]`` for each group, so a TP shard is a set
of whole groups), ``linear_fc1`` as ``[gate; up]`` *per TP shard*, row-parallel ``linear_proj``
and ``linear_fc2`` split along their input dimension, and the word embedding / output layer
split by vocabulary rows after padding. Norm weights are replicated.

A mixture-of-experts layer (``qwen3_moe``) has ``mlp.router.weight`` (Hugging Face
``mlp.gate.weight``, replicated) and, per expert this rank holds (its expert-parallel share, in
Megatron's ``local_expert_indices``), ``linear_fc1`` = ``[gate; up]`` and ``linear_fc2`` = ``down``:
``mlp.experts.local_experts.{j}.linear_fc{1,2}.weight`` for sequential experts,
``mlp.experts.linear_fc{1,2}.weight{j}`` for Transformer Engine's grouped ones. Hugging Face names
them per expert (``mlp.experts.{e}.{gate,up,down}_proj.weight``, the checkpoint format);
transformers ≥ 5 keeps them fused in memory (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``,
``mlp.experts.down_proj`` ``[E, H, I]``), which :func:`agentrl.train.moe.per_expert_weights` splits
(views, no copy).
Experts are not split over tensor-parallel ranks (expert TP is 1).

Everything here is pure tensor reshaping: :func:`shard_for_rank` (full → this rank's shard) and
:func:`merge_shards` (all ranks' shards → full) are exact inverses, so HF → Megatron → HF is
bit-exact. :func:`stage_mapping` lists, for one pipeline stage's model, which Hugging Face
tensors each Megatron parameter is made of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from agentrl.train.megatron.qwen3 import Qwen3Spec

__all__ = ["ParamMapping", "merge_shards", "shard_for_rank", "stage_mapping"]

Kind = Literal["vocab", "qkv", "gated", "row", "replicated"]

_LAYER: dict[str, tuple[Kind, tuple[str, ...]]] = {
    "input_layernorm.weight": ("replicated", ("input_layernorm.weight",)),
    "self_attention.linear_qkv.weight": ("qkv", ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                 "self_attn.v_proj.weight")),
    "self_attention.q_layernorm.weight": ("replicated", ("self_attn.q_norm.weight",)),
    "self_attention.k_layernorm.weight": ("replicated", ("self_attn.k_norm.weight",)),
    "self_attention.linear_proj.weight": ("row", ("self_attn.o_proj.weight",)),
    "pre_mlp_layernorm.weight": ("replicated", ("post_attention_layernorm.weight",)),
    "mlp.linear_fc1.weight": ("gated", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
    "mlp.linear_fc2.weight": ("row", ("mlp.down_proj.weight",)),
}
_DENSE_MLP = ("mlp.linear_fc1.weight", "mlp.linear_fc2.weight")


@dataclass(frozen=True)
class ParamMapping:
    """One Megatron parameter of a stage and the Hugging Face tensors it is built from.

    ``exported``: whether :func:`merge_shards` output is written back under ``hf_names`` (False for
    the last stage's copy of tied embeddings: the first stage's embedding is the one exported).
    """

    megatron_name: str
    kind: Kind
    hf_names: tuple[str, ...]
    exported: bool = True
    expert: bool = False  # one expert's weight: held by one expert-parallel rank, never split over TP


def stage_mapping(model: Any, spec: Qwen3Spec) -> list[ParamMapping]:
    """The mappings of every parameter of one stage's ``GPTModel`` (any wrapper unwrapped first)."""
    out: list[ParamMapping] = []
    if model.pre_process:
        out.append(ParamMapping("embedding.word_embeddings.weight", "vocab", ("model.embed_tokens.weight",)))
    for local, layer in enumerate(model.decoder.layers):
        index = int(layer.layer_number) - 1
        for suffix, (kind, hf_suffixes) in _LAYER.items():
            if spec.is_moe and suffix in _DENSE_MLP:
                continue
            out.append(ParamMapping(f"decoder.layers.{local}.{suffix}", kind,
                                    tuple(f"model.layers.{index}.{s}" for s in hf_suffixes)))
        if spec.is_moe:
            out += _expert_mappings(layer, f"decoder.layers.{local}.mlp", f"model.layers.{index}.mlp")
    if model.post_process:
        out.append(ParamMapping("decoder.final_layernorm.weight", "replicated", ("model.norm.weight",)))
        if not spec.tie_word_embeddings:
            out.append(ParamMapping("output_layer.weight", "vocab", ("lm_head.weight",)))
        elif not model.pre_process:  # tied, last of several stages: a copy of the embedding
            out.append(ParamMapping("output_layer.weight", "vocab", ("model.embed_tokens.weight",), exported=False))
    return out


def _expert_mappings(layer: Any, prefix: str, hf: str) -> list[ParamMapping]:
    """The router and this rank's experts of one MoE layer (sequential or grouped experts)."""
    out = [ParamMapping(f"{prefix}.router.weight", "replicated", (f"{hf}.gate.weight",))]
    grouped = not hasattr(layer.mlp.experts, "local_experts")
    for local, expert in enumerate(layer.mlp.local_expert_indices):
        e = f"{hf}.experts.{int(expert)}"
        fc1, fc2 = ((f"{prefix}.experts.linear_fc1.weight{local}", f"{prefix}.experts.linear_fc2.weight{local}")
                    if grouped else (f"{prefix}.experts.local_experts.{local}.linear_fc1.weight",
                                     f"{prefix}.experts.local_experts.{local}.linear_fc2.weight"))
        out.append(ParamMapping(fc1, "gated", (f"{e}.gate_proj.weight", f"{e}.up_proj.weight"), expert=True))
        out.append(ParamMapping(fc2, "row", (f"{e}.down_proj.weight",), expert=True))
    return out


def _interleave_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: Qwen3Spec) -> torch.Tensor:
    groups, d = spec.num_kv_heads, spec.head_dim
    per_group = spec.num_heads // groups
    hidden = q.shape[-1]
    stacked = torch.cat([q.reshape(groups, per_group * d, hidden), k.reshape(groups, d, hidden),
                         v.reshape(groups, d, hidden)], dim=1)
    return stacked.reshape(groups * (per_group + 2) * d, hidden)


def _split_qkv(qkv: torch.Tensor, spec: Qwen3Spec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, d = spec.num_kv_heads, spec.head_dim
    per_group = spec.num_heads // groups
    hidden = qkv.shape[-1]
    q, k, v = qkv.reshape(groups, (per_group + 2) * d, hidden).split([per_group * d, d, d], dim=1)
    return q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)


def shard_for_rank(mapping: ParamMapping, hf: Mapping[str, torch.Tensor], spec: Qwen3Spec, *, tp_rank: int,
                   tp_size: int, padded_vocab: int) -> torch.Tensor:
    """This TP rank's shard of ``mapping``'s parameter, built from the Hugging Face tensors."""
    parts = []
    for name in mapping.hf_names:
        if name not in hf:
            raise KeyError(f"hf weights: {name!r} is missing (needed for {mapping.megatron_name!r})")
        parts.append(hf[name])
    kind = mapping.kind
    if kind == "replicated":
        return parts[0].clone()
    if kind == "row":
        return parts[0].chunk(tp_size, dim=1)[tp_rank].clone()
    if kind == "gated":
        gate, up = (p.chunk(tp_size, dim=0)[tp_rank] for p in parts)
        return torch.cat([gate, up], dim=0)
    if kind == "qkv":
        return _interleave_qkv(parts[0], parts[1], parts[2], spec).chunk(tp_size, dim=0)[tp_rank].clone()
    weight = parts[0]
    if weight.shape[0] > padded_vocab:
        raise ValueError(f"{mapping.hf_names[0]}: {weight.shape[0]} rows exceed the padded vocabulary {padded_vocab}")
    padded = weight.new_zeros(padded_vocab, weight.shape[1])
    padded[: weight.shape[0]] = weight
    return padded.chunk(tp_size, dim=0)[tp_rank].clone()


def merge_shards(mapping: ParamMapping, shards: Sequence[torch.Tensor], spec: Qwen3Spec) -> dict[str, torch.Tensor]:
    """The Hugging Face tensors of ``mapping`` from every TP rank's shard (in rank order)."""
    kind, names = mapping.kind, mapping.hf_names
    if kind == "replicated":
        return {names[0]: shards[0]}
    if kind == "row":
        return {names[0]: torch.cat(list(shards), dim=1)}
    if kind == "gated":
        halves = [s.chunk(2, dim=0) for s in shards]
        return {names[0]: torch.cat([h[0] for h in halves]), names[1]: torch.cat([h[1] for h in halves])}
    if kind == "qkv":
        q, k, v = _split_qkv(torch.cat(list(shards), dim=0), spec)
        return dict(zip(names, (q, k, v), strict=True))
    return {names[0]: torch.cat(list(shards), dim=0)[: spec.vocab_size]}
