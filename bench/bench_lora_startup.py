"""Start-up time of a LoRA run on CPU against the same run with full weights.

``agentrl.run`` of ``examples/tiny_cpu.toml`` for one step (tiny Qwen3, CPU engine, Ray unless
``--no-ray``), once as configured (the baseline, measured in the same run) and once with
``train.lora`` (rank 8, alpha 16; ``sync.probe_bound=0.02``, since the probe adapter of that rank
moves the tiny model's logprobs by about 0.19, too little for the example's bound). Figures: seconds
from the call to the first ``collect_rollouts`` phase (engines up, trainer built, the LoRA run's
adapter check done), the adapter check itself, the first weight sync, and the whole run.

Target (issue "[First hour]"): a LoRA run starts within 1.5x of the full-weight run. Ends with one
``RESULT {json}`` line.

    .venv/bin/python bench/bench_lora_startup.py            # ~70 s on 2 cores
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import agentrl
from agentrl.cli.config_files import load_run_config
from agentrl.runner import RunCallback
from agentrl.runner import loop as loop_mod
from agentrl.testing import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
TIMES: dict[str, Any] = {}
LORA = ["train.lora.rank=8", "train.lora.alpha=16", "sync.probe_bound=0.02"]
TARGET_RATIO = 1.5


def _timed(name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            TIMES.setdefault(name, []).append(round(time.perf_counter() - started, 2))
    return wrapper


class _Phases(RunCallback):
    def __init__(self, t0: float) -> None:
        self.t0 = t0

    def on_phase(self, phase: str, step: int) -> None:
        TIMES.setdefault("first_" + phase + "_s", round(time.perf_counter() - self.t0, 1))


def _run(out: Path, extra: list[str], use_ray: bool) -> dict[str, Any]:
    TIMES.clear()
    overrides = [f"model.path={build_tiny_model()}", "train.steps=1", f"logging.run_dir={out}",
                 "checkpoint.every_steps=null", "checkpoint.save_final=false", *extra]
    config = load_run_config(ROOT / "examples" / "tiny_cpu.toml", overrides).config
    t0 = time.perf_counter()
    agentrl.run(config, use_ray=use_ray, callbacks=[_Phases(t0)])
    return {**TIMES, "run_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-ray", action="store_true", help="run in the driver process")
    args = parser.parse_args()
    loop_mod.Runner._check_adapter = _timed("check_adapter_s", loop_mod.Runner._check_adapter)  # type: ignore[method-assign]
    loop_mod.Runner.sync_weights = _timed("sync_weights_s", loop_mod.Runner.sync_weights)  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        full = _run(Path(tmp) / "full", [], not args.no_ray)
        print("full weights", json.dumps(full), flush=True)
        lora = _run(Path(tmp) / "lora", LORA, not args.no_ray)
        print("lora", json.dumps(lora), flush=True)
    ratio = round(lora["first_collect_rollouts_s"] / full["first_collect_rollouts_s"], 2)
    print("RESULT " + json.dumps({
        "figures": {"lora": lora}, "baseline": {"full": full},
        "ratios": {"startup_ratio": ratio, "run_ratio": round(lora["run_s"] / full["run_s"], 2)},
        "targets": {"startup_ratio": f"<= {TARGET_RATIO}"}, "met": {"startup_ratio": ratio <= TARGET_RATIO}}))


if __name__ == "__main__":
    main()
