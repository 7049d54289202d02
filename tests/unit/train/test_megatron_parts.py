"""The megatron backend's pure parts, in-process: config check, weight sharding, vocab-parallel scores."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
from _megatron_workers import hf_model

from agentrl.algorithms import entropy_from_logits, logprobs_from_logits
from agentrl.train.megatron import (
    MegatronBackendConfig,
    ParamMapping,
    Qwen3Spec,
    block_causal_mask,
    hf_weight_shapes,
    merge_shards,
    shard_for_rank,
    vocab_parallel_logprobs,
)
from agentrl.train.megatron.convert import _LAYER

needs_megatron = pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                                    reason="megatron-core is not installed")


def _spec(tied: bool = True) -> Qwen3Spec:
    return Qwen3Spec.from_hf(hf_model(tied).config)


def test_spec_reads_the_explicit_head_dim_and_rejects_what_it_cannot_convert() -> None:
    spec = _spec()
    assert spec.head_dim == 32 != spec.hidden_size // spec.num_heads
    assert (spec.num_heads, spec.num_kv_heads, spec.tie_word_embeddings) == (4, 2, True)
    raw = hf_model(True).config.to_dict()
    with pytest.raises(ValueError, match=r"model_type: expected 'qwen3'.*got 'qwen3_5_moe' \(Qwen3\.5-MoE .*not supported"):
        Qwen3Spec.from_hf({**raw, "model_type": "qwen3_5_moe"})
    with pytest.raises(ValueError, match="rope_type: expected 'default'"):
        Qwen3Spec.from_hf({**raw, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}})
    with pytest.raises(ValueError, match="attention_bias"):
        Qwen3Spec.from_hf({**raw, "attention_bias": True})
    with pytest.raises(ValueError, match="tensor_parallel_size=4: must divide the model's num_key_value_heads=2"):
        spec.check_layout(MegatronBackendConfig(tensor_parallel_size=4))
    with pytest.raises(ValueError, match="pipeline_parallel_size=3"):
        spec.check_layout(MegatronBackendConfig(pipeline_parallel_size=3))


@needs_megatron
def test_config_check_names_the_mismatching_field() -> None:
    from agentrl.train.megatron import check_transformer_config, transformer_config

    spec = _spec()
    tc = transformer_config(spec, MegatronBackendConfig(), cpu_init=True)
    assert (tc.kv_channels, tc.num_query_groups, tc.hidden_dropout, tc.attention_dropout) == (32, 2, 0.0, 0.0)
    check_transformer_config(spec, tc, rotary_base=spec.rope_theta, vocab_size=1792, share_embeddings=True)
    default_channels = dataclasses.replace(tc, kv_channels=spec.hidden_size // spec.num_heads)
    with pytest.raises(ValueError, match="kv_channels=16 does not match the Hugging Face head_dim=32"):
        check_transformer_config(spec, default_channels, rotary_base=spec.rope_theta, vocab_size=1792,
                                 share_embeddings=True)
    with pytest.raises(ValueError, match=r"hidden_dropout=0\.1"):
        check_transformer_config(spec, dataclasses.replace(tc, hidden_dropout=0.1), rotary_base=spec.rope_theta,
                                 vocab_size=1792, share_embeddings=True)
    with pytest.raises(ValueError, match=r"share_embeddings_and_output_weights=False.*tie_word_embeddings=True"):
        check_transformer_config(spec, tc, rotary_base=spec.rope_theta, vocab_size=1792, share_embeddings=False)
    with pytest.raises(ValueError, match=r"rotary_base=10000\.0 does not match the Hugging Face rope_theta=1000000\.0"):
        check_transformer_config(dataclasses.replace(spec, rope_theta=1e6), tc, rotary_base=1e4, vocab_size=1792,
                                 share_embeddings=True)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("tied", [True, False])
def test_shards_merge_back_bit_exactly(tp: int, tied: bool) -> None:
    spec = _spec(tied)
    hf = hf_model(tied).state_dict()
    padded = MegatronBackendConfig(tensor_parallel_size=tp, make_vocab_size_divisible_by=256).padded_vocab_size(
        spec.vocab_size)
    mappings = [ParamMapping("embedding.word_embeddings.weight", "vocab", ("model.embed_tokens.weight",))]
    for i in range(spec.num_layers):
        mappings += [ParamMapping(f"decoder.layers.{i}.{k}", kind, tuple(f"model.layers.{i}.{n}" for n in names))
                     for k, (kind, names) in _LAYER.items()]
    mappings.append(ParamMapping("decoder.final_layernorm.weight", "replicated", ("model.norm.weight",)))
    if not tied:
        mappings.append(ParamMapping("output_layer.weight", "vocab", ("lm_head.weight",)))
    merged: dict[str, torch.Tensor] = {}
    for mapping in mappings:
        shards = [shard_for_rank(mapping, hf, spec, tp_rank=r, tp_size=tp, padded_vocab=padded) for r in range(tp)]
        if mapping.kind == "vocab":
            assert sum(s.shape[0] for s in shards) == padded
            assert float(torch.cat(shards)[spec.vocab_size:].abs().sum()) == 0.0  # padding rows are zero
        merged.update(merge_shards(mapping, shards, spec))
    assert list(merged) == list(hf_weight_shapes(spec))
    for name, tensor in merged.items():
        assert torch.equal(tensor, hf[name]), name


def test_qkv_shards_hold_whole_query_groups() -> None:
    spec = _spec()
    hf = hf_model(True).state_dict()
    mapping = ParamMapping("x", "qkv", tuple(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"))
    shard = shard_for_rank(mapping, hf, spec, tp_rank=1, tp_size=2, padded_vocab=0)
    d, per_group = spec.head_dim, spec.num_heads // spec.num_kv_heads
    # rank 1 holds query group 1: its query heads 2-3, then key head 1, then value head 1
    assert torch.equal(shard[: per_group * d], hf["model.layers.0.self_attn.q_proj.weight"][per_group * d:])
    assert torch.equal(shard[per_group * d: per_group * d + d], hf["model.layers.0.self_attn.k_proj.weight"][d:])
    assert torch.equal(shard[-d:], hf["model.layers.0.self_attn.v_proj.weight"][d:])


def test_block_causal_mask_separates_packed_sequences() -> None:
    mask = block_causal_mask(torch.tensor([0, 1, 2, 0, 1]))[0, 0]
    allowed = ~mask
    assert allowed[2].tolist() == [True, True, True, False, False]
    assert allowed[4].tolist() == [False, False, False, True, True]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vocab_parallel_scores_and_gradients_match_the_plain_formulas(temperature: float) -> None:
    gen = torch.Generator().manual_seed(3)
    valid, padded = 50, 64  # 14 padding columns that must never get probability
    logits = torch.randn(9, padded, generator=gen, dtype=torch.float64) * 3
    logits[:, valid:] = torch.randn(9, padded - valid, generator=gen, dtype=torch.float64) * 3 + 50
    target = torch.randint(0, valid, (9,), generator=gen)
    g_lp, g_h = torch.randn(9, generator=gen, dtype=torch.float64), torch.randn(9, generator=gen, dtype=torch.float64)

    ours = logits.clone().requires_grad_(True)
    lp, ent = vocab_parallel_logprobs(ours, target, vocab_start=0, valid_vocab=valid, temperature=temperature,
                                      chunk_size=4, entropy_grad=True)
    ((lp * g_lp).sum() + (ent * g_h).sum()).backward()

    plain = logits[:, :valid].clone().requires_grad_(True)
    want_lp = logprobs_from_logits(plain, target, temperature=temperature)
    want_ent = entropy_from_logits(plain, temperature=temperature)
    ((want_lp * g_lp).sum() + (want_ent * g_h).sum()).backward()
    assert torch.allclose(lp, want_lp, atol=1e-12) and torch.allclose(ent, want_ent, atol=1e-12)
    assert ours.grad is not None and plain.grad is not None
    assert torch.allclose(ours.grad[:, :valid], plain.grad, atol=1e-12)
    assert float(ours.grad[:, valid:].abs().max()) == 0.0


def test_vocab_parallel_entropy_is_a_metric_unless_asked() -> None:
    logits = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    lp, ent = vocab_parallel_logprobs(logits, torch.tensor([1, 2, 3, 4]), vocab_start=0, valid_vocab=8)
    assert lp.requires_grad and not ent.requires_grad


def _moe_raw() -> dict[str, object]:
    from _megatron_moe_workers import hf_moe_model

    return hf_moe_model().config.to_dict()


def test_moe_spec_reads_the_experts_and_refuses_what_it_cannot_convert() -> None:
    raw = _moe_raw()
    spec = Qwen3Spec.from_hf(raw)
    assert (spec.is_moe, spec.num_experts, spec.experts_per_token, spec.moe_intermediate_size, spec.norm_topk_prob) \
        == (True, 8, 2, 32, True)
    assert Qwen3Spec.from_hf({**raw, "norm_topk_prob": False}).norm_topk_prob is False
    with pytest.raises(ValueError, match=r"mlp_only_layers=\[1\], decoder_sparse_step=1: .*every layer is sparse"):
        Qwen3Spec.from_hf({**raw, "mlp_only_layers": [1]})
    with pytest.raises(ValueError, match="expert_parallel_size=3: must divide the model's num_experts=8"):
        spec.check_layout(MegatronBackendConfig(expert_parallel_size=3))
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 with a mixture-of-experts model: .*sequence parallel"):
        spec.check_layout(MegatronBackendConfig(tensor_parallel_size=2))
    with pytest.raises(ValueError, match=r"expert_parallel_size=2: the model has no experts"):
        _spec().check_layout(MegatronBackendConfig(expert_parallel_size=2))


@needs_megatron
def test_moe_config_check_refuses_the_fused_router_and_names_mismatches() -> None:
    from agentrl.train.megatron import check_transformer_config, transformer_config

    spec = Qwen3Spec.from_hf(_moe_raw())
    tc = transformer_config(spec, MegatronBackendConfig(expert_parallel_size=2), cpu_init=True)
    assert (tc.num_moe_experts, tc.moe_router_topk, tc.moe_ffn_hidden_size, tc.expert_model_parallel_size) == (8, 2, 32, 2)
    assert (tc.moe_router_pre_softmax, tc.moe_aux_loss_coeff, tc.moe_enable_routing_replay) == (False, 0.0, True)

    def check(config: object) -> None:
        check_transformer_config(spec, config, rotary_base=spec.rope_theta, vocab_size=1792, share_embeddings=True)

    check(tc)
    with pytest.raises(ValueError, match=r"moe_router_fusion=True .*skips routing replay.*expected moe_router_fusion=False"):
        check(dataclasses.replace(tc, moe_router_fusion=True))
    with pytest.raises(ValueError, match=r"moe_router_topk=4 does not match the Hugging Face num_experts_per_tok=2"):
        check(dataclasses.replace(tc, moe_router_topk=4))
    with pytest.raises(ValueError, match=r"moe_router_pre_softmax=True does not match .*norm_topk_prob"):
        check(dataclasses.replace(tc, moe_router_pre_softmax=True))


def test_fused_experts_split_into_the_checkpoint_names_and_back_bit_exactly() -> None:
    from _megatron_moe_workers import hf_moe_model

    from agentrl.train.moe import per_expert_weights

    model = hf_moe_model()
    spec = Qwen3Spec.from_hf(model.config)
    fused = model.state_dict()
    split = dict(per_expert_weights(fused.items()))
    assert list(split) != list(fused) and set(hf_weight_shapes(spec)) == set(split) - {"lm_head.weight"}
    for name, shape in hf_weight_shapes(spec).items():
        assert tuple(split[name].shape) == shape, name
    e = 5
    gate_up = fused["model.layers.1.mlp.experts.gate_up_proj"][e]
    assert torch.equal(torch.cat([split[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"],
                                  split[f"model.layers.1.mlp.experts.{e}.up_proj.weight"]]), gate_up)
    fc1 = ParamMapping("fc1", "gated", (f"model.layers.1.mlp.experts.{e}.gate_proj.weight",
                                        f"model.layers.1.mlp.experts.{e}.up_proj.weight"), expert=True)
    shard = shard_for_rank(fc1, split, spec, tp_rank=0, tp_size=1, padded_vocab=0)
    assert torch.equal(shard, gate_up)  # Megatron's linear_fc1 is [gate; up], like transformers' fused tensor
    for name, tensor in merge_shards(fc1, [shard], spec).items():
        assert torch.equal(tensor, split[name])


def test_routing_channels_that_do_not_fit_the_model_are_refused() -> None:
    import numpy as np
    from _train_helpers import trajectories

    from agentrl.token_data import ROUTED_EXPERTS
    from agentrl.train import build_training_batch
    from agentrl.train.megatron import check_routing_channels

    trajs = trajectories(1, 2, seed=5)
    trajs[1].write_channel(ROUTED_EXPERTS, 0, np.full((3, 2, 2), 7, dtype=np.uint8))
    batch = build_training_batch(trajs)
    check_routing_channels(batch.sequences, layers=2, top_k=2, experts=8)
    with pytest.raises(ValueError, match=r"batch.sequences\[1\].channels\['routed_experts'\] .*rows of shape \(2, 2\);"
                                         r" the model routes 8 experts in each of 2 layers, expected \(2, 8\)"):
        check_routing_channels(batch.sequences, layers=2, top_k=8, experts=64)
    with pytest.raises(ValueError, match=r"expert id 7; the model has 4 experts \(ids 0..3\)"):
        check_routing_channels(batch.sequences, layers=2, top_k=2, experts=4)
