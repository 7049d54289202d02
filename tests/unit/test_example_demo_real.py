"""``make demo-real``'s files, without the 93 MB download: the prepare script writes the recipe's data
and keeps a model folder that already holds the pinned import (here a tiny imported Llama whose import
record names the pinned file), the config dry-runs on them with every check passing, and the summary
script reads a run folder laid out as the recipe's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli.main import app
from agentrl.models import KNOWN_GGUFS, MARKER, import_gguf
from agentrl.testing.gguf import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]


def test_prepare_keeps_the_imported_model_and_the_config_dry_runs(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "models" / "smollm2-135m-instruct"
    import_gguf(write_tiny_gguf(tmp_path / "tiny.gguf")[0], model)
    record = json.loads((model / MARKER).read_text())
    (model / MARKER).write_text(json.dumps({**record, "sha256": KNOWN_GGUFS["smollm2-135m-instruct"].sha256}))
    prep = subprocess.run([sys.executable, str(ROOT / "examples" / "demo_real_prepare.py"), "--warmup-rows", "64",
                           "--train-rows", "64"], capture_output=True, text=True, timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    assert "already imported" in prep.stdout and "nothing to do" in prep.stdout
    result = CliRunner().invoke(app, ["train", str(ROOT / "examples" / "demo_real_cpu.toml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "(llama, 2 layers, serving float32), template qwen3" in result.stdout
    assert "per step      4 prompts x 8 samples = 32 episodes" in result.stdout
    assert "warm-up       40 supervised steps x 16 of 64 conversations (data/demo-real/warmup.jsonl)" in result.stdout
    data = tmp_path / "data" / "demo-real"
    held = [json.loads(line)["question"] for line in (data / "held_out.jsonl").read_text().splitlines()]
    train = [json.loads(line)["question"] for line in (data / "train.jsonl").read_text().splitlines()]
    warm = (data / "warmup.jsonl").read_text() + (data / "warmup_check.jsonl").read_text()
    assert len(held) == 64 and not set(held) & set(train) and not any(q in warm for q in held)


def test_summary_reads_a_recipe_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "evals" / "base-model").mkdir(parents=True)
    (run / "evals" / "base-model" / "greedy.json").write_text(json.dumps(
        {"prompts": 64, "pass_at_k": {"1": 0.0}, "tool_calls_per_episode": 0.0}))
    (run / "warmup.json").write_text(json.dumps({"steps": 30, "seconds": 480.0}))
    (run / "summary.json").write_text(json.dumps({"wall_s": 600.0}))
    lines = [{"step": 0, "time": 1000.0, "initial": True, "eval/greedy/pass@1": 0.0625,
              "eval/greedy/tool_calls_per_episode": 0.1, "eval/greedy/wall_s": 20.0},
             {"step": 1, "time": 1100.0, "reward": 0.3},
             {"step": 2, "time": 1300.0, "eval/greedy/pass@1": 0.5, "eval/greedy/tool_calls_per_episode": 0.6},
             {"step": 4, "time": 1600.0, "eval/greedy/pass@1": 0.953125, "eval/greedy/tool_calls_per_episode": 1.0},
             {"step": 4, "time": 1601.0, "final": True, "eval/greedy/pass@1": 0.953125,
              "eval/greedy/tool_calls_per_episode": 1.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "demo_real_summary.py"), str(run), "--plot",
                          str(tmp_path / "acc.png")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "after the warm-up        6.2%" in out.stdout and "after 4 RL steps        95.3%" in out.stdout
    assert "rise +95.3 points, RL's share +89.1 points" in out.stdout
    assert "0: 6.2% (0.10), 2: 50.0% (0.60), 4: 95.3% (1.00)" in out.stdout
    assert (tmp_path / "acc.png").stat().st_size > 1000
