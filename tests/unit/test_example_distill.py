"""The distillation example: ``examples/distill_prepare.py`` builds the teacher and a student that almost
never calls the tool from a demo run folder, ``examples/distill_cpu.toml`` dry-runs on them in its three
arms, and ``examples/distill_compare.py report`` judges curves by the issue's criteria."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from agentrl.cli import app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_prepare_builds_teacher_and_student_and_the_config_dry_runs(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    prep = subprocess.run([sys.executable, str(EXAMPLES / "demo_prepare.py"), "--warmup-rows", "64",
                           "--train-rows", "64"], capture_output=True, text=True, timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    weights = tmp_path / "runs" / "demo" / "weights"  # a demo run that kept every version (two here)
    for version in ("v000000", "v000001"):
        shutil.copytree(tmp_path / "models" / "demo-tiny", weights / version)
    made = subprocess.run([sys.executable, str(EXAMPLES / "distill_prepare.py"), "--demo-run", "runs/demo",
                           "--steps", "2", "--rounds", "1"], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert "round 1: 2 SFT steps (tool called in 1% of the conversations)" in made.stdout
    for folder in ("models/distill-teacher", "models/distill-student"):
        assert (tmp_path / folder / "config.json").is_file() and (tmp_path / folder / "tokenizer.json").is_file()
    # the noised student: the teacher plus noise of 0.4 x each tensor's RMS, the tokenizer unchanged
    made = subprocess.run([sys.executable, str(EXAMPLES / "distill_prepare.py"), "--demo-run", "runs/demo",
                           "--noise", "0.4", "--seed", "1234", "--student", "models/noised"],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert "(the teacher, noise 0.4 x RMS): P(call)" in made.stdout and "P(reference)" in made.stdout
    from safetensors.torch import load_file

    teacher, student = (load_file(tmp_path / f / "model.safetensors") for f in ("models/distill-teacher",
                                                                                "models/noised"))
    assert sorted(teacher) == sorted(student)
    for name, weight in teacher.items():
        rms = weight.float().pow(2).mean().sqrt()
        ratio = float((student[name].float() - weight.float()).pow(2).mean().sqrt() / rms)
        assert abs(ratio - 0.4) < 0.1 or weight.numel() < 64, (name, ratio)
    assert (tmp_path / "models/noised/tokenizer.json").read_bytes() == (
        tmp_path / "models/distill-teacher/tokenizer.json").read_bytes()
    runner = CliRunner()
    for arm, says in (([], "advantage 1 x (log p_teacher - log p_student)"),
                      (["teacher.task_reward=true"], "advantage A_task + 1 x (log p_teacher"),
                      (["teacher=none"], None)):
        result = runner.invoke(app, ["train", str(EXAMPLES / "distill_cpu.toml"), *arm, "--dry-run"],
                               env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        if says is None:
            assert "teacher " not in result.stdout
        else:
            assert "teacher       model: models/distill-teacher on the trainer; " + says in result.stdout


def _metrics(folder: Path, curve: list[float]) -> None:
    folder.mkdir(parents=True)
    lines = [{"step": step, "eval/greedy/pass@1": acc, **({"initial": True} if step == 0 else {})}
             for step, acc in enumerate(curve)]
    lines.append({"step": len(curve) - 1, "final": True, "eval/greedy/pass@1": curve[-1]})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_the_report_judges_by_the_issue_criteria(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compare = _module("distill_compare")
    _metrics(tmp_path / "distill-seed0", [0.0, 0.3, 0.85, 0.95, 1.0])
    _metrics(tmp_path / "rl-seed0", [0.0, 0.0, 0.02, 0.05, 0.08])
    _metrics(tmp_path / "distill-seed1", [0.0, 0.1, 0.5, 0.7, 0.78])   # below 80% of the teacher at the end
    _metrics(tmp_path / "rl-seed1", [0.0, 0.0, 0.0, 0.0, 0.0])
    result = compare.report(argparse.Namespace(root=tmp_path, seeds=[0, 1], arms=["distill", "rl"],
                                               teacher_accuracy=1.0, plot=tmp_path / "c.png"))
    v0, v1 = result["verdicts"]["0"], result["verdicts"]["1"]
    assert v0["met"] and v0["distill_steps_to_90pct"] == 3 and v0["rl_steps_to_90pct"] is None
    assert not v1["met"] and not v1["distill_at_least_80pct"] and not v1["distill_faster"]
    assert not result["met"]
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert capsys.readouterr().out.splitlines()[-1].startswith("RESULT {")


def test_run_gives_each_arm_its_own_overrides_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An --override of the teacher's fields must not bring back the teacher that the RL arm removes."""
    compare = _module("distill_compare")
    commands: list[list[str]] = []
    monkeypatch.setattr(compare.subprocess, "run", lambda cmd, check: commands.append(cmd))
    compare.run(argparse.Namespace(root=tmp_path, seeds=[0], arms=["distill", "rl", "both"], steps=16,
                                   config=EXAMPLES / "distill_cpu.toml", override=["teacher.path=elsewhere"]))
    assert [c[-1] for c in commands] == ["teacher.path=elsewhere", "teacher=none", "teacher.task_reward=true"]
    assert all("train.steps=16" in c for c in commands)
