"""``kill -9`` a training run (fake engine, real trainer and checkpoints) at many points and resume it:
the prompts trained and the final weights equal an uninterrupted run's, and every prompt of the
epoch is trained exactly once — whether the kill landed mid-rollout, mid-train, mid-sync or in the
middle of writing a checkpoint."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.runner.rundir import RunDirectory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, ROWS = 6, 12
PHASES = ("collect_rollouts", "train_step", "sync_weights", "checkpoint")


def _command(root: Path) -> list[str]:
    return [sys.executable, "-m", "agentrl.testing.runner", str(root), "--steps", str(STEPS), "--rows", str(ROWS),
            "--token-delay", "0.001", "--resume"]


def run_with_kills(root: Path, targets: list[tuple[int, str]], rng: random.Random) -> tuple[str, list[str]]:
    """Runs until done, killing (SIGKILL) the process when it starts each target ``(step, phase)``
    in turn (after a random 0-40 ms). Returns the final weight digest and the phases killed in."""
    pending = list(targets)
    killed: list[str] = []
    for _ in range(len(targets) + 3):
        proc = subprocess.Popen(_command(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        digest = None
        for line in proc.stdout:
            line = line.strip()
            if line.startswith("phase "):
                _, name, step = line.split()
                # a target the resumed run will not reach again (its step was checkpointed) is dropped
                while pending and (pending[0][0], PHASES.index(pending[0][1])) < (int(step), _order(name)):
                    pending.pop(0)
            if pending and line == f"phase {pending[0][1]} {pending[0][0]}":
                time.sleep(rng.uniform(0.0, 0.04))
                proc.kill()
                killed.append(line)
                pending.pop(0)
                break
            if line.startswith("done "):
                digest = line.split("digest=", 1)[1]
        proc.wait(timeout=60)
        if digest is not None:
            return digest, killed
        if not killed or not killed[-1]:
            raise AssertionError(f"the run ended without finishing: {proc.stderr.read() if proc.stderr else ''}")
    raise AssertionError("too many restarts")


def _order(phase: str) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def trained(root: Path) -> list[list[str]]:
    run = RunDirectory(root / "run", config_hash="read-only")
    return [m["prompt_ids"] for m in run.read_metrics() if "prompt_ids" in m]


def test_kill_9_at_twenty_points_loses_and_repeats_no_prompt(tmp_path: Path) -> None:
    straight = subprocess.run(_command(tmp_path / "straight"), capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]
    digest = straight.stdout.strip().splitlines()[-1].split("digest=", 1)[1]

    rng = random.Random(7)
    targets = sorted({(rng.randint(1, STEPS), rng.choice(PHASES)) for _ in range(60)},
                     key=lambda t: (t[0], PHASES.index(t[1])))
    targets = targets[:22]
    # each target once more: a kill before a step's checkpoint makes the resumed run redo that step
    targets = sorted(targets + targets[::3], key=lambda t: (t[0], PHASES.index(t[1])))
    assert len(targets) >= 20
    resumed_digest, killed = run_with_kills(tmp_path / "killed", targets, rng)

    assert len(killed) >= 20
    assert {k.split()[1] for k in killed} == set(PHASES)
    assert trained(tmp_path / "killed") == trained(tmp_path / "straight")
    flat = [p for step in trained(tmp_path / "killed") for p in step]
    assert sorted(flat) == sorted(set(flat)) and len(flat) == ROWS  # 0 lost, 0 trained twice
    assert resumed_digest == digest                                  # bitwise the same weights
