"""A training run on an engine already running, in its own process, printing ``phase NAME STEP`` as each
named step starts (the trainer-kill test reads them and SIGKILLs this process mid-step).

    python _killable_run.py ROOT ENGINE_URL [--resume]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from agentrl.environments import make_arithmetic_rows
from agentrl.runner import RunCallback, RunConfig
from agentrl.testing import build_tiny_model
from agentrl.testing.runner import index_reward

STEPS, ROWS = 4, 16


class PrintPhases(RunCallback):
    def on_phase(self, phase: str, step: int) -> None:
        print(f"phase {phase} {step}", flush=True)


def config(root: Path, engine_url: str) -> RunConfig:
    data = root / "train.jsonl"
    if not data.exists():
        data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in make_arithmetic_rows(ROWS, seed=0)))
    raw: dict[str, Any] = {
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data), "seed": 1}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {
            "engines": {"context_length": 1024, "max_total_tokens": 8192, "random_seed": 0, "urls": [engine_url]},
            "sampling": {"max_new_tokens": 32, "temperature": 1.0},
            "scheduler": {"groups_per_step": 2, "group_size": 2},
        },
        "train": {"steps": STEPS, "optimizer": {"lr": 1e-3}, "max_tokens_per_micro_batch": 2048},
        "logging": {"run_dir": str(root / "run")},
        "checkpoint": {"every_steps": 1, "keep_last": 2},
    }
    return RunConfig.from_dict(raw)


def main() -> None:
    from agentrl.runner.api import train

    root, url = Path(sys.argv[1]), sys.argv[2]
    cfg = config(root, url)
    resume = str(cfg.run_dir()) if "--resume" in sys.argv[3:] else None
    summary = train(cfg, reward=index_reward, callbacks=(PrintPhases(),), use_ray=False, resume=resume)
    print(f"done steps={summary.steps} resumed_from={summary.resumed_from}", flush=True)


if __name__ == "__main__":
    main()
