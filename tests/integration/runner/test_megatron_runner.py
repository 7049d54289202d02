"""``train.backend = "megatron"`` through the runner itself: ``agentrl.run`` on Ray with two train
actors (megatron TP=2 over gloo), a real CPU SGLang engine (the session's, through
``rollout.engines.urls``), toy arithmetic, two GRPO steps with the disk weight sync after each and a
checkpoint after each; then a resume from step 1's checkpoint (megatron's sharded files) redoes step 2.

The test-only megatron CPU shim reaches the train actors through Ray's own
``worker_process_setup_hook`` (the library never imports it). That hook is a job-level setting, and
this pytest process may already be connected to the session's Ray cluster, so the run happens in a
child process (``_megatron_run.py``) that starts its own local Ray with the hook. Checked: the step trained (finite loss, the weight version moved), the engine
serves version 2 afterwards, and after every sync (the resumed run's first one included) the post-sync probe — engine against megatron trainer logprobs on
fixed sequences — passed (the run stops otherwise) with a mean far below its bound.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model

pytestmark = [
    pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed"),
]

CHILD = Path(__file__).resolve().with_name("_megatron_run.py")


async def test_the_runner_trains_megatron_tp2_and_syncs_the_engine(tmp_path: Path, shared_engine: str) -> None:
    from agentrl.rollout import SGLangEngine

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(8, seed=0)))
    run = tmp_path / "run"
    config = {
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data)}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {"engines": {"urls": [shared_engine], "context_length": 1024, "max_total_tokens": 8192},
                    "sampling": {"max_new_tokens": 32}, "scheduler": {"groups_per_step": 2, "group_size": 2}},
        "train": {"backend": "megatron", "tensor_parallel_size": 2, "steps": 2, "optimizer": {"lr": 1e-2},
                  "max_tokens_per_micro_batch": 2048},
        "logging": {"run_dir": str(run)},
        "checkpoint": {"every_steps": 1, "keep_last": 2},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}  # not the session's cluster
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), str(tmp_path / "config.json"), env=env, cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    summary = json.loads(next(line for line in text.splitlines() if line.startswith("SUMMARY "))[len("SUMMARY "):])
    assert summary["steps"] == 2 and summary["policy_version"] == 2
    assert summary["resumed_steps"] == 2 and "step_000001" in summary["resumed_from"]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if not m.get("final")] == [1, 2]
    for step in steps:
        assert math.isfinite(step["train/loss"]) and step["train/skipped"] == 0.0
        print(f"step {step['step']}: probe mean |d| {step['probe/mean_abs_diff']:.2e}, "
              f"mismatch mean {step['mismatch/mean']:.2e}")
        assert step["probe/mean_abs_diff"] < 1e-4 and step["mismatch/mean"] < 1e-4
    engine = await SGLangEngine.attach(shared_engine)
    assert await engine.weight_version() == "2"
