"""A training run on an engine already running, in its own process, printing ``phase NAME STEP`` as each
named step starts (the trainer-kill test reads them and SIGKILLs this process mid-step).

    python _killable_run.py ROOT ENGINE_URL [--resume] [--method distributed] [--slow-broadcast SECONDS]

``ENGINE_URL`` ``launch``: the run starts its own engine (a child of this process).

``--method``: the run's ``sync.method``. ``--slow-broadcast``: this process's ``torch.distributed.broadcast``
prints ``broadcast N`` and waits that long before each call (test instrumentation: a kill then lands
in the middle of a weight broadcast).
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


def config(root: Path, engine_url: str, method: str = "disk") -> RunConfig:
    data = root / "train.jsonl"
    if not data.exists():
        data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in make_arithmetic_rows(ROWS, seed=0)))
    raw: dict[str, Any] = {
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data), "seed": 1}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {
            "engines": {"context_length": 1024, "max_total_tokens": 8192 if engine_url != "launch" else 4096,
                        "random_seed": 0, "urls": [engine_url] if engine_url != "launch" else []},
            "sampling": {"max_new_tokens": 32, "temperature": 1.0},
            "scheduler": {"groups_per_step": 2, "group_size": 2},
        },
        "train": {"steps": STEPS, "optimizer": {"lr": 1e-3}, "max_tokens_per_micro_batch": 2048},
        "logging": {"run_dir": str(root / "run")},
        "checkpoint": {"every_steps": 1, "keep_last": 2},
        "sync": {"method": method, "bucket_mb": 1},
    }
    return RunConfig.from_dict(raw)


def _slow_broadcasts(seconds: float) -> None:
    import time

    import torch.distributed as dist

    original, count = dist.broadcast, [0]

    def slow(*a: Any, **k: Any) -> Any:
        count[0] += 1
        print(f"broadcast {count[0]}", flush=True)
        time.sleep(seconds)
        return original(*a, **k)

    dist.broadcast = slow  # type: ignore[assignment]


def main() -> None:
    from agentrl.runner.api import run

    root, url = Path(sys.argv[1]), sys.argv[2]
    args = sys.argv[3:]
    method = args[args.index("--method") + 1] if "--method" in args else "disk"
    if "--slow-broadcast" in args:
        _slow_broadcasts(float(args[args.index("--slow-broadcast") + 1]))
    cfg = config(root, url, method)
    resume = str(cfg.run_dir()) if "--resume" in sys.argv[3:] else None
    summary = run(cfg, reward=index_reward, callbacks=(PrintPhases(),), use_ray=False, resume=resume)
    print(f"done steps={summary.steps} resumed_from={summary.resumed_from}", flush=True)


if __name__ == "__main__":
    main()
