"""Memory of a mixture-of-experts training step: the planner against a fake-tensor measurement.

1. **Planner vs measurement, on fake tensors.** A Qwen3-30B-A3B-shaped stack (hidden 2048, 32 query
   and 4 KV heads of 128, 128 experts of 768, top-8, vocabulary 151,936; ``--layers`` of its 48
   layers, default all), bf16 compute with float32 master weights and AdamW state, fused head,
   packed attention, two micro-batches per step, without and with full activation checkpointing:
   ``plan_trainer_memory`` against PyTorch's ``MemTracker`` peak of the torch backend's own step
   (``agentrl.train.memory_measure``; no memory is allocated). transformers' eager experts call
   ``nonzero`` (a data-dependent shape fake tensors refuse), so the step runs its grouped-GEMM experts
   (``experts_implementation="grouped_mm"``, transformers' default where the kernel exists). Both
   the peak and the dynamic part (above weights, master weights, optimizer state and gradients) are
   compared.
2. **Baseline in the same run**: the planner without its MoE model, i.e. the same stack planned as a
   dense model of the same active size (an MLP of ``top_k × moe_intermediate_size``, the parameters a
   token passes through): what a dense-only planner would say.
3. **Routing storage**: bytes per token of the routed-experts channel and of one 32k-token sample
   for this shape; and the Megatron plan of ``examples/moe_qwen3_30b_a3b_8gpu.toml``'s layout
   (expert parallel 8, itemised, not measured: megatron-core does not run on fake tensors).

Target (issue "[MoE]"): planner within 15% of the measured peak. Ends with one ``RESULT {json}``
line.

    .venv/bin/python bench/bench_moe_plan.py                          # 48 layers, ~15 min on 2 cores
    .venv/bin/python bench/bench_moe_plan.py --layers 4 --tokens 4096 # ~1 minute
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentrl.train.memory_measure import measure_train_step
from agentrl.train.memory_plan import GIB, ModelShape, TrainerSetup, plan_trainer_memory

QWEN3_30B_A3B: dict[str, Any] = {
    "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}
STATIC = ("weights", "master weights", "optimizer state", "reference weights")


def dense_equivalent(config: dict[str, Any]) -> dict[str, Any]:
    """The baseline: the same stack as a dense Qwen3 whose MLP is the active experts' width."""
    dense = {k: v for k, v in config.items() if k not in ("num_experts", "num_experts_per_tok",
                                                           "moe_intermediate_size", "norm_topk_prob",
                                                           "decoder_sparse_step", "mlp_only_layers")}
    dense.update(model_type="qwen3", intermediate_size=config["num_experts_per_tok"] * config["moe_intermediate_size"])
    return dense


def row(config: dict[str, Any], mode: str, tokens: int) -> dict[str, Any]:
    setup = TrainerSetup(dtype="bfloat16", activation_checkpointing=mode, micro_batch_tokens=tokens)
    shape = ModelShape.from_config(config)
    plan = plan_trainer_memory(shape, setup)
    measured = measure_train_step(config, setup)
    static = sum(plan.terms[k] for k in STATIC)
    planned_dynamic = plan.peak - static - plan.terms["gradients"]
    naive = plan_trainer_memory(ModelShape.from_config(dense_equivalent(config)), setup)
    out = {
        "mode": mode, "tokens": tokens, "layers": config["num_hidden_layers"],
        "measured_gib": measured.peak / GIB, "planned_gib": plan.peak / GIB,
        "error_pct": 100 * (plan.peak / measured.peak - 1),
        "measured_dynamic_gib": measured.dynamic / GIB, "planned_dynamic_gib": planned_dynamic / GIB,
        "dynamic_error_pct": 100 * (planned_dynamic / measured.dynamic - 1),
        "dense_equivalent_gib": naive.peak / GIB, "dense_equivalent_error_pct": 100 * (naive.peak / measured.peak - 1),
        "largest_tensor": [list(measured.largest_shape), measured.largest_op], "seconds": measured.seconds,
    }
    print(f"{mode:5s} {tokens:6d} tokens, {out['layers']} layers: measured {out['measured_gib']:.1f} GiB, planned "
          f"{out['planned_gib']:.1f} ({out['error_pct']:+.1f}%); dynamic {out['measured_dynamic_gib']:.2f} vs "
          f"{out['planned_dynamic_gib']:.2f} ({out['dynamic_error_pct']:+.1f}%); dense-equivalent plan "
          f"{out['dense_equivalent_gib']:.1f} ({out['dense_equivalent_error_pct']:+.1f}%); {measured.seconds:.0f} s",
          flush=True)
    return out


def megatron_recipe_plan(config: dict[str, Any]) -> dict[str, Any]:
    """The planner's figures for the recipe's trainer rank: Megatron, EP 8 × DP 8, bf16, full recompute, 32k."""
    shape = ModelShape.from_config(config)
    setup = TrainerSetup(backend="megatron", dtype="bfloat16", data_parallel=8, expert_parallel=8,
                         activation_checkpointing="full", micro_batch_tokens=32768)
    plan = plan_trainer_memory(shape, setup)
    return {"peak_gib": plan.peak / GIB, "terms_gib": {k: v / GIB for k, v in plan.terms.items()}, "notes": plan.notes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--tokens", nargs="+", type=int, default=[4096, 32768])
    parser.add_argument("--modes", nargs="+", default=["none", "full"], choices=["none", "full", "selective"])
    args = parser.parse_args()
    config = {**QWEN3_30B_A3B, "num_hidden_layers": args.layers}
    rows = [row(config, mode, tokens) for mode in args.modes for tokens in args.tokens]
    full_shape = ModelShape.from_config(QWEN3_30B_A3B)
    per_token = full_shape.routing_bytes_per_token()
    figures: dict[str, Any] = {
        "rows": rows, "planner_error_max_pct": max(abs(r["error_pct"]) for r in rows),
        "planner_dynamic_error_max_pct": max(abs(r["dynamic_error_pct"]) for r in rows),
        "routing_bytes_per_token": per_token, "routing_mib_per_32k_sample": 32768 * per_token / (1 << 20),
        "params_b": full_shape.params / 1e9, "active_params_b": full_shape.active_params / 1e9,
        "megatron_ep8_recipe_plan": megatron_recipe_plan(QWEN3_30B_A3B),
    }
    baseline = {"dense_equivalent_error_max_pct": max(abs(r["dense_equivalent_error_pct"]) for r in rows)}
    ratios = {"dense_equivalent_over_moe_error": baseline["dense_equivalent_error_max_pct"]
              / max(figures["planner_error_max_pct"], 1e-9)}
    targets = {"planner_error_max_pct": 15.0}
    met = {"planner_error_max_pct": figures["planner_error_max_pct"] <= 15.0}
    print(f"routing: {per_token} bytes per token, {figures['routing_mib_per_32k_sample']:.1f} MiB per 32k-token sample")
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met}))


if __name__ == "__main__":
    main()
