"""The ``warmup`` section on the megatron backend (megatron-core on the CPU through the test shim, in a
process of its own: it needs a process group): the supervised steps run on the run's megatron
trainer, the report is written, and the optimiser's state and step counter are fresh for RL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.timeout(600)

WORKER = Path(__file__).with_name("_megatron_warmup_worker.py")


def test_the_warmup_trains_the_megatron_backend_and_resets_its_optimizer(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(WORKER), str(tmp_path)], capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    report = out["report"]
    assert report["steps"] == 3 and report["conversations"] == 8
    assert report["last_loss"] < report["first_loss"]
    assert json.loads((tmp_path / "run" / "warmup.json").read_text())["steps"] == 3
    assert len((tmp_path / "run" / "warmup_metrics.jsonl").read_text().splitlines()) == 3
    # Megatron's ChainedOptimizer: each chained optimizer's Adam state is cleared, the step counter is 0
    assert out["optimizer"] == "ChainedOptimizer" and out["states"] and set(out["states"]) == {0}
    assert out["step"] == 0
