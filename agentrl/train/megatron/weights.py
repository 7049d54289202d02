"""Loading Hugging Face weights into a Megatron stage, and exporting them back (TP and PP gathered).

:func:`load_hf_weights` copies each rank's shard into its parameters. :func:`iter_hf_weights`
yields every Hugging Face tensor on **every** rank, one at a time and in a fixed order: the TP
shards are all-gathered within the owning stage and the full tensor is broadcast over the
pipeline group (shapes are known from the config, so no metadata travels); an expert's weights
are first broadcast from the expert-parallel rank that holds it to the rest of its stage. Memory
stays at one full tensor; that is what disk export and engine weight sync consume. Experts are
exported under the checkpoint's per-expert names (``mlp.experts.{e}.{gate,up,down}_proj.weight``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.train.megatron.convert import ParamMapping, merge_shards, shard_for_rank, stage_mapping
from agentrl.train.megatron.parallel import ParallelLayout
from agentrl.train.megatron.qwen3 import Qwen3Spec

__all__ = ["hf_weight_shapes", "iter_hf_weights", "load_hf_weights", "read_hf_state"]


def read_hf_state(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a Hugging Face folder's ``*.safetensors`` files, on the CPU."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"folder: no *.safetensors files in {str(folder)!r}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def load_hf_weights(model: Any, hf: Mapping[str, torch.Tensor], spec: Qwen3Spec, layout: ParallelLayout,
                    padded_vocab: int) -> None:
    """Copy this rank's shards of the Hugging Face tensors into ``model`` (one unwrapped stage); a
    MoE model's experts may come per expert (a checkpoint) or fused (transformers' ``state_dict()``)."""
    if spec.is_moe:
        from agentrl.train.moe import per_expert_weights

        hf = dict(per_expert_weights(hf.items()))
    params = dict(model.named_parameters())
    mappings = stage_mapping(model, spec)
    missing = sorted(set(params) - {m.megatron_name for m in mappings})
    if missing:
        raise RuntimeError(f"model: parameters without a Hugging Face mapping: {missing[:5]}")
    with torch.no_grad():
        for mapping in mappings:
            param = params[mapping.megatron_name]
            tp_rank, tp_size = (0, 1) if mapping.expert else (layout.tp_rank, layout.tp_size)
            shard = shard_for_rank(mapping, hf, spec, tp_rank=tp_rank, tp_size=tp_size, padded_vocab=padded_vocab)
            if shard.shape != param.shape:
                raise ValueError(f"{mapping.megatron_name}: shard of shape {tuple(shard.shape)} from "
                                 f"{mapping.hf_names} does not fit the parameter's {tuple(param.shape)}")
            param.copy_(shard)


def hf_weight_shapes(spec: Qwen3Spec) -> dict[str, tuple[int, ...]]:
    """Every exported Hugging Face tensor name and its shape, in export order."""
    h, d = spec.hidden_size, spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,), p + "self_attn.q_proj.weight": (spec.num_heads * d, h),
            p + "self_attn.k_proj.weight": (spec.num_kv_heads * d, h),
            p + "self_attn.v_proj.weight": (spec.num_kv_heads * d, h),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "self_attn.o_proj.weight": (h, spec.num_heads * d), p + "post_attention_layernorm.weight": (h,),
        })
        if not spec.is_moe:
            f = spec.intermediate_size
            shapes.update({p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                           p + "mlp.down_proj.weight": (h, f)})
            continue
        f = spec.moe_intermediate_size
        shapes[p + "mlp.gate.weight"] = (spec.num_experts, h)
        for e in range(spec.num_experts):
            x = f"{p}mlp.experts.{e}."
            shapes.update({x + "gate_proj.weight": (f, h), x + "up_proj.weight": (f, h), x + "down_proj.weight": (h, f)})
    shapes["model.norm.weight"] = (h,)
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


def _gather_tp(param: torch.Tensor, layout: ParallelLayout) -> list[torch.Tensor]:
    local = param.detach().contiguous()
    if layout.tp_size == 1:
        return [local]
    shards = [torch.empty_like(local) for _ in range(layout.tp_size)]
    dist.all_gather(shards, local, group=layout.tp_group)
    return shards


def _stage_tensors(model: Any, spec: Qwen3Spec, layout: ParallelLayout, mapping: ParamMapping,
                   params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    param = params[mapping.megatron_name]
    shards = [param.detach().contiguous()] if mapping.expert else _gather_tp(param, layout)
    return merge_shards(mapping, shards, spec)


def _gather_names(names: list[str], size: int, group: Any) -> list[list[str]]:
    table: list[Any] = [None] * size
    if size > 1:
        dist.all_gather_object(table, names, group=group)
        return table
    return [names]


def iter_hf_weights(model: Any, spec: Qwen3Spec, layout: ParallelLayout) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, full tensor)`` for every exported tensor, identical on every rank (a collective:
    every rank of the model-parallel and expert-parallel groups must consume the iterator to the end,
    in step)."""
    params = dict(model.named_parameters())
    owned: dict[str, ParamMapping] = {}
    for mapping in stage_mapping(model, spec):
        if mapping.exported:
            for name in mapping.hf_names:
                owned[name] = mapping
    # Which expert-parallel rank holds which expert, and which stage holds which name, is the same
    # computation on every rank: gather the owner tables.
    ep_table = _gather_names(sorted(n for n, m in owned.items() if m.expert), layout.ep_size, layout.ep_group)
    expert_owner = {name: ep for ep, names in enumerate(ep_table) for name in names}
    stage_names = sorted(set(owned) | set(expert_owner))
    owner = {name: stage for stage, names in enumerate(_gather_names(stage_names, layout.pp_size, layout.pp_group))
             for name in names}
    cache: dict[str, torch.Tensor] = {}
    dtype = next(iter(params.values())).dtype
    device = next(iter(params.values())).device
    for name, shape in hf_weight_shapes(spec).items():
        if name not in owner:
            raise RuntimeError(f"export: no pipeline stage holds {name!r}")
        stage = owner[name]
        if stage == layout.pp_rank and name in owned:
            if name not in cache:
                cache.update(_stage_tensors(model, spec, layout, owned[name], params))
            tensor = cache.pop(name).contiguous()
        else:
            tensor = torch.empty(shape, dtype=dtype, device=device)
        if stage == layout.pp_rank and name in expert_owner and layout.ep_size > 1:
            src = dist.get_global_rank(layout.ep_group, expert_owner[name])
            dist.broadcast(tensor, src=src, group=layout.ep_group)
        if layout.pp_size > 1:
            src = dist.get_global_rank(layout.pp_group, stage)
            dist.broadcast(tensor, src=src, group=layout.pp_group)
        yield name, tensor
