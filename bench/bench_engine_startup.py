"""Start-up of a CPU SGLang engine: its children forked (agentrl's CPU default) against spawned (SGLang's own).

SGLang starts its scheduler and detokenizer with the ``spawn`` method, which protects a CUDA context; a
CPU engine has none, and the CPU shims make it fork them (``AGENTRL_SGLANG_START_METHOD``, default
``fork``). Spawned, each child imports torch, transformers and SGLang again. This boots the tiny Qwen3
(float32, context 1024, KV budget 8,192 tokens, as the tests' shared engine) ``--repeats`` times with
each method, alternating, and reports per method the median seconds from launch to healthy and the
median CPU seconds of the engine's whole process tree at that moment (read from /proc before it is
stopped). The baseline (``spawn``) is measured in the same run.

Target (issue "[Test time]", where engine boots were most of ``make test``): forked, an engine's start-up
costs at most 0.6x the CPU of a spawned one. Ends with one ``RESULT {json}`` line.

    .venv/bin/python bench/bench_engine_startup.py              # --repeats 3: six boots, ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from agentrl.rollout import EngineConfig, SGLangEngine
from agentrl.testing import build_tiny_model

TARGET_CPU_RATIO = 0.6


def _tree_cpu_s(pid: int) -> float:
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def boot(method: str, logs: Path) -> dict[str, float]:
    config = EngineConfig(model_path=str(build_tiny_model()), device="cpu", dtype="float32", context_length=1024,
                          max_total_tokens=8192, random_seed=0, log_dir=logs,
                          env={"AGENTRL_SGLANG_START_METHOD": method})
    started = time.perf_counter()
    engine = asyncio.run(SGLangEngine.launch(config))
    ready_s = time.perf_counter() - started
    try:
        assert engine.process is not None
        cpu_s = _tree_cpu_s(engine.process.pid)
    finally:
        engine.stop()
    return {"ready_s": round(ready_s, 2), "cpu_s": round(cpu_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="boots per start method (default 3)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: expected an int >= 1")
    runs: dict[str, list[dict[str, float]]] = {"fork": [], "spawn": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for method in ("fork", "spawn"):
                runs[method].append(boot(method, Path(tmp) / f"{method}-{i}"))
                print(method, i + 1, json.dumps(runs[method][-1]), flush=True)
    median: dict[str, dict[str, Any]] = {
        m: {k: round(statistics.median(r[k] for r in rs), 2) for k in ("ready_s", "cpu_s")} for m, rs in runs.items()}
    cpu_ratio = round(median["fork"]["cpu_s"] / median["spawn"]["cpu_s"], 3)
    print("RESULT " + json.dumps({
        "figures": {"fork": median["fork"], "boots": runs}, "baseline": {"spawn": median["spawn"]},
        "ratios": {"fork_vs_spawn_cpu": cpu_ratio,
                   "fork_vs_spawn_ready": round(median["fork"]["ready_s"] / median["spawn"]["ready_s"], 3)},
        "targets": {"fork_vs_spawn_cpu": f"<= {TARGET_CPU_RATIO}"},
        "met": {"fork_vs_spawn_cpu": cpu_ratio <= TARGET_CPU_RATIO}}))


if __name__ == "__main__":
    main()
