"""The training loop's own cost, and weight-sync time for the tiny model and a 0.5B-parameter Qwen3.

1. **Runner overhead.** ``agentrl.train`` on Ray (a rollout actor with the real sglang-router and a
   real CPU SGLang engine serving the tiny Qwen3, one train actor with the torch backend),
   ``ToyArithmeticEnv``, disk weight sync and the post-sync probe every step (a checkpoint at the
   end only). Per step (the first, warm-up, left out) the wall time between two step ends, measured by
   the bench, against the sum of the parts the runner measures around its calls (rollout, train,
   sync): the difference is what the loop itself costs (advantages, actor calls, metrics, trajectory
   files). Target: overhead ≤ 5% of the step.
2. **Weight sync** (export + reload, ``WeightSync`` by disk on a real engine): the tiny model, and a
   random 0.5B-parameter Qwen3 (Qwen2.5-0.5B's shape with Qwen3 layers, bfloat16) served by its own
   CPU engine. Baseline in the same run: copying the same safetensors bytes on the same disk.

    .venv/bin/python bench/bench_runner.py [--steps 6] [--skip-large]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from agentrl.environments import make_arithmetic_rows
from agentrl.rollout import EngineConfig, SGLangEngine
from agentrl.runner import RunCallback, RunConfig, WeightSyncConfig
from agentrl.runner.api import run_async
from agentrl.runner.weights import WeightSync
from agentrl.testing import build_tiny_model, build_tokenizer

TARGETS = {"overhead_fraction": 0.05}
LARGE_SHAPE = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
               "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936, "tie_word_embeddings": True,
               "max_position_embeddings": 4096, "rms_norm_eps": 1e-6}


class StepClock(RunCallback):
    def __init__(self) -> None:
        self.ends: list[float] = []
        self.metrics: list[dict[str, Any]] = []

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.ends.append(time.perf_counter())
        self.metrics.append(dict(metrics))


async def runner_overhead(root: Path, steps: int) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    data = root / "train.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in make_arithmetic_rows(64, seed=0)))
    config = RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data)}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {"engines": {"context_length": 1024, "max_total_tokens": 16384, "random_seed": 0},
                    "sampling": {"max_new_tokens": 64}, "scheduler": {"groups_per_step": 4, "group_size": 4}},
        "train": {"steps": steps, "optimizer": {"lr": 1e-3}, "max_tokens_per_micro_batch": 2048},
        "logging": {"run_dir": str(root / "run")},
        "checkpoint": {"keep_last": 1},
    })
    clock = StepClock()
    started = time.perf_counter()
    await run_async(config, callbacks=[clock])
    total = time.perf_counter() - started
    rows = []
    for k in range(1, len(clock.ends)):
        m = clock.metrics[k]
        wall = clock.ends[k] - clock.ends[k - 1]
        parts = m.get("time/collect_s", 0.0) + m["time/train_s"] + m["time/sync_s"]
        rows.append({"wall_s": wall, "parts_s": parts, "collect_s": m.get("time/collect_s", 0.0),
                     "train_s": m["time/train_s"], "sync_s": m["time/sync_s"],
                     "export_s": m.get("sync/export_s", 0.0), "load_s": m.get("sync/load_s", 0.0)})
    wall = statistics.median(r["wall_s"] for r in rows)
    parts = statistics.median(r["parts_s"] for r in rows)
    overhead = statistics.median(r["wall_s"] - r["parts_s"] for r in rows)
    return {"steps": len(clock.ends), "run_wall_s": total, "step_wall_s": wall, "parts_s": parts,
            "overhead_s": overhead, "overhead_fraction": overhead / wall,
            "collect_s": statistics.median(r["collect_s"] for r in rows),
            "train_s": statistics.median(r["train_s"] for r in rows),
            "sync_s": statistics.median(r["sync_s"] for r in rows),
            "tiny_export_s": statistics.median(r["export_s"] for r in rows),
            "tiny_load_s": statistics.median(r["load_s"] for r in rows), "per_step": rows}


def build_large(folder: Path) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**LARGE_SHAPE)).to(torch.bfloat16)
    model.save_pretrained(str(folder), safe_serialization=True)
    build_tokenizer().save_pretrained(str(folder))
    return sum(p.numel() for p in model.parameters())


async def large_sync(root: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    src = root / "large"
    src.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    params = build_large(src)
    build_s = time.perf_counter() - t0
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16)
    tok = build_tokenizer()
    engine = await SGLangEngine.launch(EngineConfig(model_path=str(src), device="cpu", dtype="bfloat16",
                                                    context_length=512, max_total_tokens=2048, random_seed=0,
                                                    log_dir=root / "logs", startup_timeout_s=900))
    try:
        sync = WeightSync([engine], root / "weights", WeightSyncConfig(load_s=900.0, export_s=900.0))

        def export(folder: Path) -> None:
            model.save_pretrained(str(folder), safe_serialization=True)
            tok.save_pretrained(str(folder))

        reports = [await sync.sync(v, export) for v in (1, 2)]
    finally:
        engine.stop()
    weights = next(src.glob("*.safetensors"))
    t0 = time.perf_counter()
    shutil.copyfile(weights, root / "copy.safetensors")
    copy_s = time.perf_counter() - t0
    best = min(reports, key=lambda r: r.total_s)
    return {"params": params, "bytes": weights.stat().st_size, "build_s": build_s, "export_s": best.export_s,
            "load_s": best.load_s, "sync_total_s": best.total_s, "copy_baseline_s": copy_s}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip-large", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-runner-") as tmp:
        root = Path(tmp)
        overhead = await runner_overhead(root / "loop", args.steps)
        print(f"runner: step {overhead['step_wall_s']:.3f} s, parts {overhead['parts_s']:.3f} s, overhead "
              f"{overhead['overhead_s'] * 1000:.1f} ms ({100 * overhead['overhead_fraction']:.2f}%)", flush=True)
        large = None if args.skip_large else await large_sync(root / "big")
        if large is not None:
            print(f"0.5B sync: export {large['export_s']:.2f} s + load {large['load_s']:.2f} s "
                  f"(copy baseline {large['copy_baseline_s']:.2f} s)", flush=True)
    figures = {k: v for k, v in overhead.items() if k != "per_step"}
    if large is not None:
        figures["large"] = large
    baseline: dict[str, float] = {"step_parts_s": overhead["parts_s"]}
    ratios = {"overhead_fraction": overhead["overhead_fraction"]}
    if large is not None:
        baseline["large_copy_s"] = large["copy_baseline_s"]
        ratios["large_sync_vs_copy"] = large["sync_total_s"] / large["copy_baseline_s"]
    met = {"overhead_fraction": overhead["overhead_fraction"] <= TARGETS["overhead_fraction"]}
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": TARGETS,
                                  "met": met}))


if __name__ == "__main__":
    asyncio.run(main())
