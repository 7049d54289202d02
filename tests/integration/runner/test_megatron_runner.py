"""``train.backend = "megatron"`` through the runner itself: ``agentrl.train`` on Ray with two train
actors (megatron TP=2 over gloo), a real CPU SGLang engine (the session's, through
``rollout.engines.urls``), toy arithmetic, two GRPO steps with the disk weight sync after each and a
checkpoint after each; then a resume from step 1's checkpoint (megatron's sharded files) redoes step 2.

The test-only megatron CPU shim reaches the train actors through Ray's own
``worker_process_setup_hook`` (the library never imports it): the test starts Ray with it, and the
run reuses that Ray. Checked: the step trained (finite loss, the weight version moved), the engine
serves version 2 afterwards, and after every sync (the resumed run's first one included) the post-sync probe — engine against megatron trainer logprobs on
fixed sequences — passed (the run stops otherwise) with a mean far below its bound.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
from pathlib import Path

import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model

pytestmark = [
    pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed"),
]

SHIM_DIR = Path(__file__).resolve().parents[2] / "unit" / "train"


async def test_the_runner_trains_megatron_tp2_and_syncs_the_engine(tmp_path: Path, shared_engine: str) -> None:
    from agentrl.rollout import SGLangEngine
    from agentrl.runner import RunConfig
    from agentrl.runner.api import train_async
    from agentrl.runner.cluster import RayRuntime
    from agentrl.testing.runner import index_reward

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(8, seed=0)))
    config = RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data)}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {"engines": {"urls": [shared_engine], "context_length": 1024, "max_total_tokens": 8192},
                    "sampling": {"max_new_tokens": 32}, "scheduler": {"groups_per_step": 2, "group_size": 2}},
        "train": {"backend": "megatron", "tensor_parallel_size": 2, "steps": 2, "optimizer": {"lr": 1e-2},
                  "max_tokens_per_micro_batch": 2048},
        "logging": {"run_dir": str(tmp_path / "run")},
        "checkpoint": {"every_steps": 1, "keep_last": 2},
    })
    path = os.pathsep.join(p for p in (str(SHIM_DIR), os.environ.get("PYTHONPATH", "")) if p)
    runtime = RayRuntime.start(namespace="agentrl-megatron-runner", object_store_memory=128 * 1024 * 1024,
                               runtime_env={"worker_process_setup_hook": "_megatron_cpu.install",
                                            "env_vars": {"PYTHONPATH": path}})
    run = tmp_path / "run"
    try:
        summary = await train_async(config, reward=index_reward)  # rewards that differ: advantages are not 0
        assert summary.steps == 2 and summary.policy_version == 2
        # as if killed in step 2 before its checkpoint: resume from step 1's megatron checkpoint
        shutil.rmtree(run / "checkpoints" / "step_000002")
        resumed = await train_async(config, reward=index_reward, resume=str(run))
    finally:
        runtime.shutdown()
    assert resumed.steps == 2 and "step_000001" in str(resumed.resumed_from)
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if not m.get("final")] == [1, 2]
    for step in steps:
        assert math.isfinite(step["train/loss"]) and step["train/skipped"] == 0.0
        print(f"step {step['step']}: probe mean |d| {step['probe/mean_abs_diff']:.2e}, "
              f"mismatch mean {step['mismatch/mean']:.2e}")
        assert step["probe/mean_abs_diff"] < 1e-4 and step["mismatch/mean"] < 1e-4
    engine = await SGLangEngine.attach(shared_engine)
    assert await engine.weight_version() == "2"
