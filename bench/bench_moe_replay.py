"""Rollout routing replay on the torch backend: the train step with replay against without, same run,
same batch; and what routing costs to store (per token, and a 32k-token Qwen3-30B-A3B sample).

- **Step overhead**: a Qwen3-MoE of the tiny MoE demo's shape (hidden 128, 4 layers, 8 experts, top-2,
  expert width 192, tied embeddings, float32, one thread), 8 prompts x G = 8 rollouts of ~350 tokens (a 300-token shared
  prompt, a multi-turn response); the routing channel holds the model's own routing with one layer
  of 10% of the positions sent elsewhere (an engine that disagrees). ``TorchTrainBackend.train_step``
  (old-logprob recompute, PPO-clip, backward, AdamW) with ``routing_replay="off"`` (the baseline: the
  trainer routes, and still compares with the engine's routing) and ``"rollout"``, alternating,
  best of ``--repeats`` (and the median of the per-repeat ratios, each repeat running both back to
  back). Target: replay costs at most 5% more per step.
- **Storage**: bytes per token of a model's routing in a trajectory (``layers x top_k`` ids, one byte
  each up to 256 experts) for the tiny MoE, Qwen3-30B-A3B (48 layers, top-8 of 128) and
  Qwen3-235B-A22B (94 layers, top-8 of 128); one 32,768-token Qwen3-30B-A3B sample's routing as
  held in memory, as written in a trajectory record (base64 of the packed rows), gzipped (the run
  folder's ``trajectories/*.jsonl.gz``), and as SGLang sends it (base64 of int32).

    .venv/bin/python bench/bench_moe_replay.py            # --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import base64
import copy
import gzip
import json
import random
import time
from typing import Any

import numpy as np
import orjson
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from agentrl.algorithms import RoutingReplay
from agentrl.rollout import RoutingShape
from agentrl.token_data import ROUTED_EXPERTS, Alignment, TokenChannel
from agentrl.train import (
    LossConfig,
    OptimizerConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    TrainingBatch,
    TrainSequence,
)

MODEL = {"vocab_size": 1792, "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 192,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
         "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, "max_position_embeddings": 4096,
         "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
SHAPES = {"tiny_moe": RoutingShape(layers=2, top_k=2, experts=8),
          "qwen3_30b_a3b": RoutingShape(layers=48, top_k=8, experts=128),
          "qwen3_235b_a22b": RoutingShape(layers=94, top_k=8, experts=128)}
TARGET_OVERHEAD = 0.05
SAMPLE_TOKENS = 32768


def own_routing(model: Any, ids: list[int]) -> np.ndarray:
    picked: dict[int, torch.Tensor] = {}
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, out, i=i: picked.__setitem__(i, out[2]))
             for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return np.stack([picked[i].numpy() for i in range(len(picked))], axis=1).astype(np.uint8)


def batch_with_routing(model: Any, prompts: int = 8, group: int = 8, seed: int = 0) -> TrainingBatch:
    rng = random.Random(seed)
    vocab, experts = MODEL["vocab_size"], MODEL["num_experts"]
    head = [rng.randrange(vocab) for _ in range(300)]
    seqs = []
    for p in range(prompts):
        prompt = head + [rng.randrange(vocab) for _ in range(16)]
        for g in range(group):
            call, tool, answer = rng.randint(20, 30), rng.randint(5, 10), rng.randint(10, 20)
            tokens = prompt + [rng.randrange(vocab) for _ in range(call + tool + answer)]
            mask = [0] * len(prompt) + [1] * call + [0] * tool + [1] * answer
            routing = own_routing(model, tokens)
            moved = [t for t in range(len(tokens)) if rng.random() < 0.1]
            routing[moved, 1] = (routing[moved, 1].astype(np.int64) + 1) % experts  # the engine disagrees here
            channel = TokenChannel("uint8", routing.shape[1:], length=len(tokens), alignment=Alignment.POSITION)
            channel.write(0, routing[:-1])
            adv = rng.choice([-1.0, 1.0])
            seqs.append(TrainSequence(
                tokens=tokens, loss_mask=mask, rollout_logprobs=[-rng.random() * m for m in mask],
                advantages=[adv * m for m in mask], rollout_id=f"p{p}-r{g}", group_id=f"p{p}", reward=adv,
                denominator=float(sum(mask)), channels={ROUTED_EXPERTS: channel}))
    return TrainingBatch.from_sequences(seqs)


def step_times(model: Any, batch: TrainingBatch, repeats: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    backends = {}
    for replay in ("off", "rollout"):
        cfg = TorchBackendConfig(device="cpu", dtype="float32", loss=LossConfig(
            old_logprobs="recompute", eps_clip_high=0.28, routing_replay=RoutingReplay(replay)),
            optimizer=OptimizerConfig(lr=1e-5))
        backends[replay] = TorchTrainBackend(copy.deepcopy(model), cfg)
    metrics = {name: b.train_step(copy.deepcopy(batch)) for name, b in backends.items()}  # warm-up
    times: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(repeats):
        for name, backend in backends.items():  # alternating: drift on a shared machine hits both
            fresh = copy.deepcopy(batch)
            start = time.perf_counter()
            backend.train_step(fresh)
            times[name].append(time.perf_counter() - start)
    return times, metrics


def storage() -> dict[str, Any]:
    out: dict[str, Any] = {f"bytes_per_token_{name}": shape.bytes_per_token for name, shape in SHAPES.items()}
    shape = SHAPES["qwen3_30b_a3b"]
    rng = np.random.default_rng(0)
    # random distinct experts per (token, layer), 2,048 tokens at a time (an argsort of random keys)
    rows = np.concatenate([
        rng.random((2048, shape.layers, shape.experts), dtype=np.float32).argsort(axis=-1)[..., : shape.top_k]
        for _ in range(SAMPLE_TOKENS // 2048)]).astype(np.uint8)
    channel = TokenChannel("uint8", (shape.layers, shape.top_k), length=SAMPLE_TOKENS, alignment=Alignment.POSITION)
    channel.write(0, rows)
    record = orjson.dumps(channel.to_dict())
    wire = base64.b64encode(rows.astype("<i4").tobytes())
    out.update({
        "sample_tokens": SAMPLE_TOKENS,
        "sample_30b_in_memory_mb": round(rows.nbytes / 2**20, 2),
        "sample_30b_record_mb": round(len(record) / 2**20, 2),
        "sample_30b_record_gzip_mb": round(len(gzip.compress(record, 6)) / 2**20, 2),
        "sample_30b_sglang_wire_mb": round(len(wire) / 2**20, 2),
    })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**MODEL)).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.1)
    batch = batch_with_routing(model)
    tokens = sum(len(s.tokens) - 1 for s in batch.sequences)
    print(f"{len(batch.sequences)} sequences, {tokens} input tokens, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters, {args.threads} thread(s)")
    times, metrics = step_times(model, batch, args.repeats)
    best = {name: min(ts) for name, ts in times.items()}
    overhead = best["rollout"] / best["off"] - 1.0
    paired = sorted(on / off - 1.0 for off, on in zip(times["off"], times["rollout"], strict=True))
    paired_median = paired[len(paired) // 2]  # each repeat ran off then on back to back
    for name in ("off", "rollout"):
        m = metrics[name]
        print(f"  replay {name:8s} step best {best[name]:.3f} s (all {[round(t, 3) for t in times[name]]}); "
              f"routing differs {m['moe/routing_differs']:.3f}, router disagrees {m['moe/router_disagrees']:.3f}")
    print(f"  replay overhead {overhead:+.1%} best against best (target <= {TARGET_OVERHEAD:.0%}); per repeat "
          f"{[f'{p:+.1%}' for p in paired]}, median {paired_median:+.1%}")
    stored = storage()
    for key, value in stored.items():
        print(f"  {key}: {value}")
    figures = {"step_off_s": round(best["off"], 4), "step_rollout_s": round(best["rollout"], 4),
               "routing_differs_off": round(metrics["off"]["moe/routing_differs"], 4),
               "routing_differs_rollout": metrics["rollout"]["moe/routing_differs"], **stored}
    print("RESULT " + json.dumps({
        "figures": figures, "baseline": {"step_off_s": round(best["off"], 4)},
        "ratios": {"replay_overhead": round(overhead, 4), "replay_overhead_paired_median": round(paired_median, 4)},
        "targets": {"replay_overhead": TARGET_OVERHEAD},
        "met": {"replay_overhead": overhead <= TARGET_OVERHEAD}}))


if __name__ == "__main__":
    main()
