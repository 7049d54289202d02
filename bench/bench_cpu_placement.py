"""CPU placement: a real CPU SGLang engine and a trainer stand-in sharing this machine's cores.

Two layouts in the same run, each with a fresh engine serving the tiny model:

- ``default``: the engine with SGLang's defaults, the trainer with torch's default threads;
- ``plan``: :func:`agentrl.runner.cpu.plan_cpu` — the engine started with ``plan.engine_env(0)`` and
  its process tree pinned with ``plan.pin``, the trainer with ``plan.trainer_threads`` threads on
  the trainer's cores.

Measured per layout while the trainer runs: the wall time of a batch of 8 requests x 32 new
tokens (median of 3) and the trainer's matmul iterations per second. No time is asserted.

    .venv/bin/python bench/bench_cpu_placement.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrl.rollout import EngineConfig, SamplingParams, SGLangEngine
from agentrl.rollout.client import ClientConfig, InferenceClient
from agentrl.runner.cpu import plan_cpu
from agentrl.testing import build_tiny_model

TRAINER = """
import os, sys, time, torch
cores, threads = sys.argv[1], int(sys.argv[2])
if cores:
    os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
if threads:
    torch.set_num_threads(threads)
a = torch.randn(384, 384)
stop = time.monotonic() + float(sys.argv[3])
n = 0
while time.monotonic() < stop:
    a = torch.tanh(a @ a) ; n += 1
print(n / float(sys.argv[3]), flush=True)
"""
BATCH = SamplingParams(max_new_tokens=32, temperature=1.0, ignore_eos=True)


async def batch_times(engine: SGLangEngine, reps: int = 3) -> list[float]:
    async with InferenceClient(ClientConfig(base_url=engine.url, max_retries=0)) as client:
        await client.generate([5, 6, 7], SamplingParams(max_new_tokens=4))  # warm-up
        times = []
        for r in range(reps):
            t0 = time.perf_counter()
            await asyncio.gather(*(client.generate([10 + i, 20 + r, 30], BATCH) for i in range(8)))
            times.append(time.perf_counter() - t0)
        return times


async def layout(name: str, logs: Path) -> dict[str, float]:
    plan = plan_cpu(engines=1)
    env = plan.engine_env(0) if name == "plan" else {}
    config = EngineConfig(model_path=str(build_tiny_model()), device="cpu", dtype="float32", context_length=512,
                          max_total_tokens=4096, log_dir=logs, startup_timeout_s=600, env=env)
    t0 = time.perf_counter()
    engine = await SGLangEngine.launch(config)
    start_s = time.perf_counter() - t0
    try:
        if name == "plan":
            assert engine.process is not None
            plan.pin(0, engine.process.pid)
        cores = ",".join(map(str, plan.trainer_cores)) if name == "plan" else ""
        threads = plan.trainer_threads if name == "plan" else 0
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER, cores, str(threads), "40"],
                                   stdout=subprocess.PIPE, text=True)
        try:
            await asyncio.sleep(2.0)
            times = await batch_times(engine)
        finally:
            out, _ = trainer.communicate(timeout=120)
        return {"engine_start_s": start_s, "batch_s": statistics.median(times), "trainer_it_s": float(out.strip())}
    finally:
        await asyncio.to_thread(engine.stop)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: await layout(name, Path(tmp)) for name in ("default", "plan")}
    for name, r in results.items():
        print(f"{name:8s} batch 8x32 {r['batch_s']:.2f} s, trainer {r['trainer_it_s']:.1f} it/s, "
              f"engine start {r['engine_start_s']:.0f} s")
    speed = results["default"]["batch_s"] / results["plan"]["batch_s"]
    trainer = results["plan"]["trainer_it_s"] / results["default"]["trainer_it_s"]
    figures = {"plan_env": plan_cpu(engines=1).engine_env(0), **{f"{k}_{m}": round(v, 3)
               for k, r in results.items() for m, v in r.items() if k == "plan"}}
    baseline = {f"default_{m}": round(v, 3) for m, v in results["default"].items()}
    ratios = {"engine_speedup": round(speed, 3), "trainer_speedup": round(trainer, 3)}
    targets = {"engine_speedup": 1.0, "trainer_speedup": 1.0}  # the plan must not be slower than the defaults
    met = {k: ratios[k] >= t for k, t in targets.items()}
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met}))


if __name__ == "__main__":
    asyncio.run(main())
