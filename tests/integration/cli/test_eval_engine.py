"""`agentrl eval CONFIG --checkpoint RUN` on a real CPU SGLang engine behind the real router: the
checkpoint of a short training run (fake engine, real trainer on the tiny Qwen3) is exported to a
Hugging Face folder whose weights equal the trained ones, served, and evaluated on toy arithmetic;
the report lands in the run folder. One engine, started by the command itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.testing import build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

AGENTRL = Path(sys.executable).parent / "agentrl"

CONFIG = """
[model]
path = "MODEL"
dtype = "float32"
[data.train]
path = "ROOT/train.jsonl"
[[data.eval]]
name = "arith"
path = "ROOT/train.jsonl"
samples_per_prompt = 2
pass_k = [1, 2]
sampling = {temperature = 1.0, max_new_tokens = 24}
[environment]
name = "toy_arithmetic"
[rollout.sampling]
max_new_tokens = 48
[rollout.engines]
context_length = 1024
max_total_tokens = 8192
random_seed = 0
[logging]
run_dir = "ROOT/run"
"""


def test_eval_checkpoint_on_a_real_engine(tmp_path: Path) -> None:
    train = subprocess.run([sys.executable, "-m", "agentrl.testing.runner", str(tmp_path), "--steps", "1",
                            "--rows", "4"], capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr[-2000:]
    config = tmp_path / "eval.toml"
    config.write_text(CONFIG.replace("MODEL", str(build_tiny_model())).replace("ROOT", str(tmp_path)))
    proc = subprocess.run([str(AGENTRL), "eval", str(config), "--checkpoint", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=800, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    out = tmp_path / "run" / "evals" / "step_000001"
    report = json.loads((out / "arith.json").read_text())
    assert report["source"]["kind"] == "checkpoint" and report["message_level"] is False
    assert (report["prompts"], report["samples"]) == (4, 8)
    assert set(report["pass_at_k"]) == {"1", "2"} and 0.0 <= report["pass_at_k"]["1"] <= report["pass_at_k"]["2"]
    assert 0.0 <= report["truncation_rate"] <= 1.0 and sum(report["stop_reasons"].values()) == 8
    episodes = [json.loads(x) for x in (out / "arith.episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 8 and all(len(e["sequences"][0]["tokens"]) > 0 for e in episodes)  # token-level
    # the served folder holds the checkpoint's weights, not the base model's
    from safetensors.torch import load_file

    served = load_file(str(out / "model" / "model.safetensors"))
    trained = torch.load(tmp_path / "run" / "checkpoints" / "step_000001" / "trainer" / "trainer.pt",
                         weights_only=True)["model"]
    base = load_file(str(next(build_tiny_model().glob("*.safetensors"))))
    name = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(served[name], trained[name].to(served[name].dtype))
    assert not torch.equal(served[name], base[name].to(served[name].dtype))
    assert "engines ready" in proc.stdout and "arith" in proc.stdout
