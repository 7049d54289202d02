"""Train-step time with shared-prefix micro-batches against the plain packed path, same run, same batch.

The CPU demo's shape: a Qwen3 of hidden 128, 2 layers, 4 heads × 32, 2 KV heads, MLP 384, tied
embeddings, vocabulary 1,792 (float32, 623k parameters); 8 prompts × G = 8 rollouts; every prompt
is a 300-token system prompt and tool listing shared by all plus a 16-token question shared by its
group (316 tokens, ~86% of each sequence), then a 40–60-token multi-turn response (model turn,
masked tool output, model turn). torch runs on one thread, as in the demo.

- **shared**: ``TorchTrainBackend.train_step`` with ``shared_prefix=True`` (its default): old-logprob
  recompute, PPO-clip loss with the per-rollout reducer, backward, AdamW.
- **baseline**: the same ``train_step`` with ``shared_prefix=False`` (every sequence runs its prompt),
  at each packing budget; the ratio is taken against the faster baseline budget.

Also reports scoring alone (``compute_logprobs``), the tokens run per step, and the largest
difference in loss between the two paths (float32; they agree to rounding).

    .venv/bin/python bench/bench_shared_prefix.py            # --steps 2 --budgets 1536 8192
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from agentrl.train import (
    LossConfig,
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    TrainingBatch,
    TrainSequence,
)

DEMO_MODEL = {"vocab_size": 1792, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096,
              "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
TARGET_RATIO = 3.0


def demo_batch(prompts: int = 8, group: int = 8, system: int = 300, question: int = 16, seed: int = 0) -> TrainingBatch:
    rng = random.Random(seed)
    vocab = DEMO_MODEL["vocab_size"]

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(n)]

    head = ids(system)
    seqs = []
    for p in range(prompts):
        prompt = head + ids(question)
        for g in range(group):
            call, tool, answer = rng.randint(20, 30), rng.randint(5, 10), rng.randint(10, 20)
            tokens = prompt + ids(call + tool + answer)
            mask = [0] * len(prompt) + [1] * call + [0] * tool + [1] * answer
            adv = rng.choice([-1.0, 1.0])
            seqs.append(TrainSequence(
                tokens=tokens, loss_mask=mask, rollout_logprobs=[-rng.random() * m for m in mask],
                advantages=[adv * m for m in mask], rollout_id=f"p{p}-r{g}", group_id=f"p{p}", reward=adv,
                denominator=float(sum(mask)),
            ))
    return TrainingBatch.from_sequences(seqs)


def backend_for(model: torch.nn.Module, shared: bool, budget: int) -> TorchTrainBackend:
    cfg = TorchBackendConfig(device="cpu", dtype="float32", packing=PackingConfig(max_tokens=budget),
                             loss=LossConfig(old_logprobs="recompute", eps_clip_high=0.28),
                             optimizer=OptimizerConfig(lr=5e-4), shared_prefix=shared)
    return TorchTrainBackend(copy.deepcopy(model), cfg)


def time_it(fn: object, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return times


def measure(model: torch.nn.Module, batch: TrainingBatch, shared: bool, budget: int, steps: int) -> dict[str, float]:
    backend = backend_for(model, shared, budget)
    first = backend.forward_backward(copy.deepcopy(batch))  # warm-up; the loss at the initial weights
    backend.optimizer.zero_grad(set_to_none=True)
    score = time_it(lambda: backend.compute_logprobs(batch), steps)
    step = time_it(lambda: backend.train_step(copy.deepcopy(batch)), steps)
    return {"step_s": statistics.median(step), "score_s": statistics.median(score), "loss": first["loss"],
            "forward_tokens": first["forward_tokens"], "packed_tokens": first["packed_tokens"],
            "micro_batches": first["micro_batches"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="timed steps per configuration (median reported)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1536, 8192], help="micro-batch token budgets")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**DEMO_MODEL)).float().eval()
    batch = demo_batch()
    lengths = [len(s.tokens) for s in batch.sequences]
    share = statistics.mean(316 / n for n in lengths)
    print(f"{len(batch.sequences)} sequences, {sum(n - 1 for n in lengths)} input tokens, prompt share {share:.1%}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters, {args.threads} thread(s)")
    results: dict[str, dict[str, float]] = {}
    for budget in args.budgets:
        for shared in (False, True):
            name = f"{'shared' if shared else 'plain'}_{budget}"
            results[name] = r = measure(model, batch, shared, budget, args.steps)
            print(f"  {name:12s} step {r['step_s']:.3f} s  scoring {r['score_s']:.3f} s  micro-batches "
                  f"{r['micro_batches']:.0f}  tokens run {r['forward_tokens']:.0f} / packed {r['packed_tokens']:.0f}")
    plain = min((results[f"plain_{b}"] for b in args.budgets), key=lambda r: r["step_s"])
    best = min((results[f"shared_{b}"] for b in args.budgets), key=lambda r: r["step_s"])
    loss_diff = max(abs(results[f"shared_{b}"]["loss"] - results[f"plain_{b}"]["loss"]) for b in args.budgets)
    figures = {name: {k: round(v, 4) for k, v in r.items()} for name, r in results.items()}
    figures["max_abs_loss_diff"] = loss_diff  # type: ignore[assignment]
    ratios = {
        "step_best_plain_over_shared": round(plain["step_s"] / best["step_s"], 2),
        "score_best_plain_over_shared": round(plain["score_s"] / best["score_s"], 2),
        **{f"step_plain_over_shared_{b}": round(results[f"plain_{b}"]["step_s"] / results[f"shared_{b}"]["step_s"], 2)
           for b in args.budgets},
    }
    print(f"  train step: best plain {plain['step_s']:.3f} s / best shared {best['step_s']:.3f} s = "
          f"{ratios['step_best_plain_over_shared']:.2f}x (target >= {TARGET_RATIO}x); max |loss diff| {loss_diff:.2e}")
    targets = {"step_best_plain_over_shared": TARGET_RATIO}
    met = {"step_best_plain_over_shared": ratios["step_best_plain_over_shared"] >= TARGET_RATIO}
    print("RESULT " + json.dumps({"figures": figures, "baseline": {"plain_step_s": round(plain["step_s"], 4)},
                                  "ratios": ratios, "targets": targets, "met": met}))


if __name__ == "__main__":
    main()
