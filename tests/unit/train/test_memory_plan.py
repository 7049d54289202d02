"""The memory planner: its arithmetic against the reference figures (gpu-scale.md §5), what it
refuses to model, and its measurement twin (MemTracker on fake tensors) on a small Qwen3 and a small
Qwen3-MoE."""

from __future__ import annotations

import pytest

from agentrl.train.memory_plan import (
    GIB,
    ModelShape,
    TrainerSetup,
    UnmodelledModel,
    engine_kv_tokens,
    plan_trainer_memory,
)

QWEN3 = {"model_type": "qwen3", "vocab_size": 151936, "num_attention_heads": 32, "num_key_value_heads": 8,
         "head_dim": 128, "num_hidden_layers": 36}
QWEN3_4B = {**QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True}
QWEN3_8B = {**QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False}


def test_parameter_counts_match_the_reference() -> None:
    assert ModelShape.from_config(QWEN3_4B).params / 1e9 == pytest.approx(4.022, abs=5e-4)
    assert ModelShape.from_config(QWEN3_8B).params / 1e9 == pytest.approx(8.191, abs=5e-4)


@pytest.mark.parametrize(("setup", "bytes_per_param"), [
    (TrainerSetup(), 2 + 4 + 4 + 8),  # bf16 weights, fp32 gradients, master weights, Adam moments
    (TrainerSetup(master_weights=False), 2 + 2 + 4),  # pure bf16 AdamW
    (TrainerSetup(dtype="float32"), 4 + 4 + 8),
    (TrainerSetup(backend="megatron", data_parallel=8), 6 + 12 / 8),  # Megatron's distributed optimizer
    (TrainerSetup(optimizer_offload=True), 2 + 4),
])
def test_resident_bytes_per_parameter(setup: TrainerSetup, bytes_per_param: float) -> None:
    shape = ModelShape.from_config(QWEN3_4B)
    terms = plan_trainer_memory(shape, setup).terms
    static = sum(terms[k] for k in ("weights", "gradients", "master weights", "optimizer state"))
    assert static / shape.params == pytest.approx(bytes_per_param, rel=1e-3)


def test_sharding_divides_gradients_master_weights_and_optimizer_state() -> None:
    shape = ModelShape.from_config(QWEN3_4B)
    whole = plan_trainer_memory(shape, TrainerSetup()).terms
    quarter = plan_trainer_memory(shape, TrainerSetup(data_parallel=4, sharded=True)).terms
    assert quarter["optimizer state"] == whole["optimizer state"] // 4
    assert quarter["master weights"] == whole["master weights"] // 4
    assert quarter["gradients"] < 0.3 * whole["gradients"]  # a quarter, plus one layer being reduced
    assert quarter["weights"] < 0.2 * whole["weights"]  # the gathered layers and embedding only


def test_activations_with_and_without_checkpointing() -> None:
    """Full checkpointing keeps each layer's input: 2·hidden bytes per token and layer in bf16, 5.6 GiB
    for Qwen3-4B at 32k (reference §5); without it Hugging Face's modelling keeps ~28x that."""
    shape = ModelShape.from_config(QWEN3_4B)
    memory = plan_trainer_memory(shape, TrainerSetup(micro_batch_tokens=32768, activation_checkpointing="full"))
    by_mode = memory.activations_by_mode
    kept_by_head = by_mode["full"] - 36 * 5120 * 32768
    assert (by_mode["full"] - kept_by_head) / GIB == pytest.approx(5.625)
    assert by_mode["none"] / by_mode["full"] > 20 and by_mode["none"] > by_mode["selective"] > by_mode["full"]
    assert memory.terms["activations"] == by_mode["full"]
    assert memory.terms["attention scores"] == 0


def test_dense_attention_and_unfused_logits_are_quadratic_and_vocabulary_sized() -> None:
    shape = ModelShape.from_config(QWEN3_4B)
    packed = plan_trainer_memory(shape, TrainerSetup(micro_batch_tokens=32768))
    dense = plan_trainer_memory(shape, TrainerSetup(micro_batch_tokens=32768, attention="dense", fused_lm_head=False))
    assert dense.terms["attention scores"] == 32768**2
    megatron = plan_trainer_memory(shape, TrainerSetup(backend="megatron", tensor_parallel=2, micro_batch_tokens=32768,
                                                       attention="dense"))
    assert megatron.terms["attention scores"] > 90 * GIB  # [16 heads, S, S] in bf16 plus the float32 softmax
    assert packed.terms["logits working set"] < 3 * GIB < dense.terms["activations"] - packed.terms["activations"]


def test_engine_kv_budget() -> None:
    shape = ModelShape.from_config(QWEN3_4B)
    per_token = 2 * 36 * 8 * 128 * 2  # keys and values, 36 layers, 8 KV heads x 128, bf16
    assert shape.kv_bytes_per_token(2) == per_token
    tokens = engine_kv_tokens(shape, capacity_bytes=80 * GIB, mem_fraction=0.8)
    assert tokens == (int(80 * GIB * 0.8) - shape.params * 2) // per_token
    assert engine_kv_tokens(shape, capacity_bytes=8 * GIB, mem_fraction=0.5) == 0


@pytest.mark.parametrize(("config", "message"), [
    ({**QWEN3_4B, "model_type": "qwen3_5", "layer_types": ["linear_attention", "full_attention"]},
     "hybrid linear attention"),
    ({"model_type": "qwen3_5", "text_config": {**QWEN3_4B, "layer_types": ["linear_attention"]}},
     "hybrid linear attention"),
    ({"model_type": "qwen2_5_vl", "text_config": QWEN3_4B}, "vision-language"),
    ({**QWEN3_4B, "model_type": "qwen2_moe", "num_experts": 60}, "mixture of experts \\(60 experts\\).*qwen3_moe"),
    ({**QWEN3_4B, "model_type": "qwen3_moe", "num_experts": 8, "moe_intermediate_size": 64, "num_experts_per_tok": 2,
      "mlp_only_layers": [0]}, "dense layers between its sparse ones"),
    ({**QWEN3_4B, "model_type": "gpt2"}, "models \\['qwen3'"),
    ({"model_type": "qwen3"}, "cannot read the model's sizes"),
])
def test_architectures_it_does_not_model_are_said_to_be_unmodelled(config: dict[str, object], message: str) -> None:
    with pytest.raises(UnmodelledModel, match=message):
        ModelShape.from_config(config)


def test_the_plan_matches_memtracker_on_fake_tensors() -> None:
    """The torch backend's real step (old-logprob forward, two micro-batches, optimizer) on a small
    Qwen3 on fake tensors: the planned peak within 15% of MemTracker's, with and without checkpointing
    (the bench checks the Qwen3-4B/8B shapes); checkpointing lowers the dynamic peak."""
    from agentrl.train.memory_measure import measure_train_step

    small = {"model_type": "qwen3", "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "tie_word_embeddings": False}
    dynamic = {}
    for mode in ("none", "full"):
        setup = TrainerSetup(micro_batch_tokens=2048, activation_checkpointing=mode, fused_optimizer=False,
                             kernel_copies_output=True)
        measured = measure_train_step(small, setup, report_at_least=2048 * 2048)
        planned = plan_trainer_memory(ModelShape.from_config(small), setup)
        error = (planned.peak - measured.peak) / measured.peak
        print(f"ckpt={mode}: MemTracker {measured.peak / 2**20:.1f} MiB, planner {planned.peak / 2**20:.1f} MiB "
              f"({error:+.1%}); largest allocation {measured.largest_shape}")
        assert abs(error) <= 0.15
        assert measured.start > 0 and measured.gradients > 0
        assert measured.large == {}  # nothing of S² elements or more: no [S, S], no [S, vocab]
        dynamic[mode] = measured.dynamic
    assert dynamic["none"] > 1.5 * dynamic["full"]


def test_lora_keeps_the_frozen_base_and_trains_the_adapter_alone() -> None:
    """Qwen3-8B with a rank-64 adapter on every linear layer: ``rank · (in + out)`` per layer and
    target (174.6M parameters); the base is held in bf16 with no gradients, master weights, optimizer
    state or reference copy; the adapter is float32 with its gradients and Adam's two moments."""
    from agentrl.train.config import LoraSettings

    shape = ModelShape.from_config(QWEN3_8B)
    lora = LoraSettings(rank=64, alpha=128.0)
    per_layer = 64 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 12288))
    assert shape.lora_params(lora) == 36 * per_layer == 174_587_904
    assert shape.lora_params(LoraSettings(rank=8, target_modules=("q_proj", "v_proj"))) == 36 * 8 * (8192 + 5120)
    terms = plan_trainer_memory(shape, TrainerSetup(lora=lora, reference_model=True)).terms
    adapter = 4 * shape.lora_params(lora)
    assert terms["weights"] == 2 * shape.params + adapter
    assert terms["gradients"] == adapter and terms["optimizer state"] == 2 * adapter
    assert terms["master weights"] == 0 and terms["reference weights"] == 0
    full = plan_trainer_memory(shape, TrainerSetup()).terms
    assert sum(full[k] for k in ("gradients", "master weights", "optimizer state")) > 40 * (terms["gradients"]
                                                                                          + terms["optimizer state"])


def test_lora_activations_keep_a_float32_input_per_targeted_layer() -> None:
    """Without checkpointing each targeted layer keeps its input in float32 for the adapter's
    gradient (q, k and v each their own), which outweighs what the frozen base no longer keeps;
    with full checkpointing a layer keeps its bf16 input either way. The rank-r intermediates are
    ~1% of a layer."""
    from agentrl.train.config import LoraSettings
    from agentrl.train.memory_plan import activation_bytes_per_token

    shape = ModelShape.from_config(QWEN3_8B)
    base = activation_bytes_per_token(shape, TrainerSetup())
    lora = activation_bytes_per_token(shape, TrainerSetup(lora=LoraSettings(rank=64)))
    few = activation_bytes_per_token(shape, TrainerSetup(lora=LoraSettings(rank=64, target_modules=("q_proj", "v_proj"))))
    assert lora["full"] == base["full"] == 2 * 4096
    casts = 4 * (5 * 4096 + 4096 + 12288)  # q, k, v, gate, up read the hidden state; o and down their own input
    assert lora["none"] - few["none"] == casts - 2 * 4 * 4096 + 5 * 4 * 64
    assert lora["none"] > base["none"] > few["none"]
    assert 7 * 4 * 64 / lora["none"] < 0.01


@pytest.mark.parametrize(("setup", "message"), [
    ({"sharded": True, "data_parallel": 4}, "unsharded torch backend"),
    ({"backend": "megatron"}, "unsharded torch backend"),
])
def test_lora_is_planned_on_the_unsharded_torch_backend_only(setup: dict[str, object], message: str) -> None:
    from agentrl.train.config import LoraSettings

    with pytest.raises(ValueError, match=message):
        TrainerSetup(lora=LoraSettings(), **setup)  # type: ignore[arg-type]


def test_lora_on_modules_outside_the_model_is_unmodelled() -> None:
    from agentrl.train.config import LoraSettings

    with pytest.raises(UnmodelledModel, match=r"not \['lm_head'\]"):
        plan_trainer_memory(ModelShape.from_config(QWEN3_8B),
                            TrainerSetup(lora=LoraSettings(target_modules=("q_proj", "lm_head"))))


def test_engine_lora_slots_come_out_of_the_kv_cache() -> None:
    from agentrl.train.config import LoraSettings
    from agentrl.train.memory_plan import engine_adapter_bytes

    shape = ModelShape.from_config(QWEN3_8B)
    slots = engine_adapter_bytes(shape, LoraSettings(rank=64), slots=4, dtype_bytes=2)
    assert slots == 4 * 174_587_904 * 2
    plain = engine_kv_tokens(shape, capacity_bytes=80 * GIB, mem_fraction=0.8)
    assert plain - engine_kv_tokens(shape, capacity_bytes=80 * GIB, mem_fraction=0.8,
                                    adapter_bytes=slots) == pytest.approx(slots / shape.kv_bytes_per_token(2), abs=1)


def test_the_lora_plan_matches_memtracker_on_fake_tensors() -> None:
    """A LoRA step of the torch backend (peft's layers on a frozen bf16 base, float32 adapter, rank
    16 on every linear layer) on the small Qwen3 of the test above, on fake tensors: the planned peak
    within the same 15% of MemTracker's, with and without checkpointing, and with dropout (the bench
    checks the Qwen3-8B shape); what the step holds at its start is the frozen base plus the adapter
    and its Adam state, and the gradients are the adapter's alone."""
    from agentrl.train.config import LoraSettings
    from agentrl.train.memory_measure import measure_train_step

    small = {"model_type": "qwen3", "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "tie_word_embeddings": False}
    shape = ModelShape.from_config(small)
    dynamic = {}
    for mode, dropout in (("none", 0.0), ("full", 0.0), ("full", 0.1)):
        setup = TrainerSetup(micro_batch_tokens=2048, activation_checkpointing=mode, fused_optimizer=False,
                             kernel_copies_output=True, lora=LoraSettings(rank=16, dropout=dropout))
        measured = measure_train_step(small, setup, report_at_least=2048 * 2048)
        planned = plan_trainer_memory(shape, setup)
        error = (planned.peak - measured.peak) / measured.peak
        print(f"LoRA ckpt={mode} dropout={dropout}: MemTracker {measured.peak / 2**20:.1f} MiB, planner {planned.peak / 2**20:.1f} MiB "
              f"({error:+.1%}); largest allocation {measured.largest_shape}")
        assert abs(error) <= 0.15
        assert measured.gradients == planned.terms["gradients"] == 4 * shape.lora_params(setup.lora)  # type: ignore[arg-type]
        static = planned.terms["weights"] + planned.terms["optimizer state"]
        assert abs(measured.start - static) <= 0.01 * static
        assert measured.large == {}
        dynamic[mode, dropout] = measured.dynamic
    assert dynamic["none", 0.0] > 1.5 * dynamic["full", 0.0]


QWEN3_30B_A3B = {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
                 "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                 "tie_word_embeddings": False}


def test_moe_parameters_routing_storage_and_the_expert_parallel_split() -> None:
    """Qwen3-30B-A3B: 30.5B parameters, 3.3B active (the model card's figures); Megatron holds 1/EP of
    the experts per rank and its distributed optimizer shards the dense part over DP and the experts
    over DP/EP (each expert lives on one of 8 ranks at EP=8: not sharded further)."""
    shape = ModelShape.from_config(QWEN3_30B_A3B)
    assert (shape.params / 1e9, shape.active_params / 1e9) == (pytest.approx(30.53, abs=0.01),
                                                               pytest.approx(3.35, abs=0.01))
    assert shape.routing_bytes_per_token() == 48 * 8  # one byte per expert id (128 experts)
    assert ModelShape.from_config({**QWEN3_30B_A3B, "num_experts": 512}).routing_bytes_per_token() == 48 * 8 * 2
    experts = 48 * 128 * 3 * 2048 * 768
    dense = shape.params - experts
    for ep, pp in ((8, 1), (4, 2)):
        setup = TrainerSetup(backend="megatron", data_parallel=8 // pp, pipeline_parallel=pp, expert_parallel=ep,
                             micro_batch_tokens=32768, activation_checkpointing="full")
        memory = plan_trainer_memory(shape, setup)
        held = dense // pp + experts // (pp * ep)
        assert memory.terms["weights"] == 2 * held and memory.terms["gradients"] == 4 * held
        sharded = dense // pp // (8 // pp) + experts // (pp * ep) // ((8 // pp) // ep)
        assert memory.terms["optimizer state"] == 8 * sharded and memory.terms["master weights"] == 4 * sharded
        assert memory.terms["routing"] == 32768 * (48 * 8 + 1)  # and a presence flag per token
        assert any("dispatched expert activations" in note for note in memory.notes)
    torch_backend = plan_trainer_memory(shape, TrainerSetup(micro_batch_tokens=4096))
    assert torch_backend.terms["weights"] == 2 * shape.params  # every expert on every unsharded rank


def test_the_moe_plan_matches_memtracker_on_fake_tensors() -> None:
    """A small Qwen3-MoE on fake tensors, transformers' grouped-GEMM experts (the eager ones call
    nonzero, which fake tensors refuse): the planned peak within 15% of MemTracker's, with and without
    checkpointing (the bench checks the Qwen3-30B-A3B shape)."""
    from agentrl.train.memory_measure import measure_train_step

    small = {**QWEN3_30B_A3B, "vocab_size": 4096, "hidden_size": 256, "moe_intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "num_experts": 16, "num_experts_per_tok": 4}
    for mode in ("none", "full"):
        setup = TrainerSetup(micro_batch_tokens=2048, activation_checkpointing=mode, fused_optimizer=False,
                             kernel_copies_output=True)
        measured = measure_train_step(small, setup)
        planned = plan_trainer_memory(ModelShape.from_config(small), setup)
        error = (planned.peak - measured.peak) / measured.peak
        print(f"MoE ckpt={mode}: MemTracker {measured.peak / 2**20:.1f} MiB, planner {planned.peak / 2**20:.1f} MiB "
              f"({error:+.1%}); largest allocation {measured.largest_shape} {measured.largest_op}")
        assert abs(error) <= 0.15
