"""Child process of ``test_megatron_runner.py``: ``agentrl.run`` with megatron on its own local Ray.

A process that is already connected to a Ray (the test session's two-node cluster) cannot give
Ray's job-level ``worker_process_setup_hook`` to new workers, so the run happens here, in a fresh
interpreter. Usage: ``python _megatron_run.py CONFIG.json`` (a :class:`RunConfig` dict). It trains,
deletes step 2's checkpoint (as if killed in step 2 before it), resumes from step 1's, and prints
one line ``SUMMARY {json}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

SHIM_DIR = Path(__file__).resolve().parents[2] / "unit" / "train"


async def main(config_path: str) -> None:
    from agentrl.runner import RunConfig
    from agentrl.runner.api import run_async
    from agentrl.runner.cluster import RayRuntime
    from agentrl.testing.runner import index_reward

    config = RunConfig.from_dict(json.loads(Path(config_path).read_text()))
    path = os.pathsep.join(p for p in (str(SHIM_DIR), os.environ.get("PYTHONPATH", "")) if p)
    runtime = RayRuntime.start(namespace="agentrl-megatron-runner", object_store_memory=128 * 1024 * 1024,
                               runtime_env={"worker_process_setup_hook": "_megatron_cpu.install",
                                            "env_vars": {"PYTHONPATH": path}})
    run = Path(config.logging.run_dir)
    try:
        summary = await run_async(config, reward=index_reward)  # rewards that differ: advantages are not 0
        shutil.rmtree(run / "checkpoints" / "step_000002")
        resumed = await run_async(config, reward=index_reward, resume=str(run))
    finally:
        runtime.shutdown()
    print("SUMMARY " + json.dumps({
        "steps": summary.steps, "policy_version": summary.policy_version,
        "resumed_steps": resumed.steps, "resumed_from": str(resumed.resumed_from)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
