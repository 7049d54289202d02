"""Padding of the token-budget packer vs fixed-size micro-batches, on a skewed length distribution.

Agentic rollouts have a long right tail: most episodes are short, a few run to the context limit.
Lengths here are log-normal (median ~1.2k tokens, sigma 0.9), clipped to [64, 16384], for 512
sequences (64 prompts x 8 samples), shuffled in data order. Same run, same lengths:

- **fixed-size baseline**: micro-batches of ``k`` consecutive sequences, each padded to the
  longest in its micro-batch (a ``[k, max_len]`` tensor), for several ``k``;
- **packer**: :func:`agentrl.train.plan_micro_batches` with a token budget of 16,384 on each of
  ``--world-size`` ranks. Its padding is counted as if every micro-batch were padded to the full
  budget (static shapes), an upper bound: the torch backend runs packed rows of their own length,
  which have no padding at all.

Padding fraction = padded slots / all slots. Target for the packer: <= 5%.

    .venv/bin/python bench/bench_packing.py [--world-size 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

from agentrl.train import PackingConfig, plan_micro_batches

TARGET_PADDING = 0.05


def skewed_lengths(n: int, seed: int, *, median: float = 1200.0, sigma: float = 0.9,
                   low: int = 64, high: int = 16384) -> list[int]:
    rng = random.Random(seed)
    mu = math.log(median)
    return [min(high, max(low, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def fixed_padding(lengths: list[int], k: int) -> tuple[float, int]:
    slots = 0
    for start in range(0, len(lengths), k):
        group = lengths[start:start + k]
        slots += len(group) * max(group)
    return 1.0 - sum(lengths) / slots, -(-len(lengths) // k)


def packer_padding(lengths: list[int], budget: int, world_size: int, algorithm: str) -> tuple[float, int, float]:
    cfg = PackingConfig(max_tokens=budget, algorithm=algorithm)  # type: ignore[arg-type]
    plans = [plan_micro_batches(lengths, cfg, world_size=world_size, rank=r) for r in range(world_size)]
    # Ranks step in lockstep per micro-batch: the rank with most micro-batches sets the count.
    steps = max(len(p) for p in plans)
    slots = steps * world_size * budget
    loads = [sum(lengths[i] for mb in p for i in mb) for p in plans]
    imbalance = max(loads) / (sum(loads) / world_size)
    return 1.0 - sum(lengths) / slots, sum(len(p) for p in plans), imbalance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=512)
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lengths = skewed_lengths(args.sequences, args.seed)
    srt = sorted(lengths)
    print(f"{args.sequences} sequences, {sum(lengths)} tokens; length p50 {srt[len(srt) // 2]}, "
          f"p90 {srt[int(len(srt) * 0.9)]}, max {srt[-1]}; budget {args.budget} tokens, {args.world_size} ranks")
    baseline = {}
    for k in (2, 4, 8):
        frac, n_mb = fixed_padding(lengths, k)
        baseline[k] = frac
        print(f"  fixed-size k={k:<2d}               padding {frac:6.1%}  micro-batches {n_mb}")
    figures: dict[str, float] = {}
    for algorithm in ("first_fit_decreasing", "best_fit_decreasing"):
        start = time.perf_counter()
        frac, n_mb, imbalance = packer_padding(lengths, args.budget, args.world_size, algorithm)
        ms = (time.perf_counter() - start) * 1e3
        verdict = "PASS" if frac <= 0.05 else "FAIL"
        print(f"  packer {algorithm:22s} padding {frac:6.1%}  micro-batches {n_mb}  rank load max/mean "
              f"{imbalance:.3f}  plan {ms:.0f} ms  (target <= 5%: {verdict})")
        print(f"    padding ratio packer / fixed k=4: {frac / baseline[4]:.3f}")
        figures[f"{algorithm}_padding"] = round(frac, 5)
        figures[f"{algorithm}_rank_imbalance"] = round(imbalance, 4)
    ratios = {f"{name.removesuffix('_padding')}_vs_fixed_k4_padding": round(value / baseline[4], 4)
              for name, value in figures.items() if name.endswith("_padding")}
    targets = {name: TARGET_PADDING for name in figures if name.endswith("_padding")}
    met = {name: figures[name] <= limit for name, limit in targets.items()}
    print("RESULT " + json.dumps({"figures": figures, "baseline": {f"fixed_k{k}_padding": round(v, 5)
                                                                   for k, v in baseline.items()},
                                  "ratios": ratios, "targets": targets, "met": met}))


if __name__ == "__main__":
    main()
