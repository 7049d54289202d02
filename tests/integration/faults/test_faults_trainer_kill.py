"""The training process SIGKILLed in the middle of a step and resumed, on real components: the session's
CPU SGLang engine (attached through ``rollout.engines.urls``), the real sglang-router the run starts,
the torch trainer and real checkpoints, in a child process (``_killable_run.py``) killed with its whole
process tree (its router too) when it starts the train step of step 2.

Expected: the resumed run continues from step 1's checkpoint, ends after every step, and the prompts
trained — read back from the run folder — are each trained once, none lost (the killed step's prompts
are drawn again by the resumed run). Deadline: 240 s per child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import _procs
import psutil
import pytest

from agentrl.runner.checkpoint import RunCheckpointer
from agentrl.runner.rundir import RunDirectory
from agentrl.testing.runner import trained_prompts

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).with_name("_killable_run.py")
STEPS = 4


def start(root: Path, engine: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(SCRIPT), str(root), engine, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def kill_tree(proc: subprocess.Popen[str]) -> list[int]:
    """SIGKILLs ``proc`` and every process it started (its router leads its own session)."""
    try:
        tree = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        tree = [proc.pid]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    return tree


def test_the_trainer_killed_mid_step_resumes_and_trains_every_prompt_once(tmp_path: Path,
                                                                          shared_engine: str) -> None:
    from _killable_run import config

    run = start(tmp_path, shared_engine)
    lines: list[str] = []
    deadline = time.monotonic() + 240
    assert run.stdout is not None
    for line in run.stdout:
        lines.append(line.rstrip())
        if line.strip() == "phase train_step 2":
            break
        assert time.monotonic() < deadline, "the run did not reach step 2 in time"
    else:
        raise AssertionError("the run ended before step 2:\n" + "\n".join(lines[-40:]))
    killed = kill_tree(run)
    left = _procs.running(killed, within_s=10)
    assert not left, f"processes of the killed run still running 10 s after SIGKILL: {left}"
    cfg = config(tmp_path, shared_engine)
    latest = RunCheckpointer(cfg.run_dir() / "checkpoints", keep_last=2, config_hash=cfg.hash()).latest()
    assert latest is not None and latest.name == "step_000001"

    resumed = start(tmp_path, shared_engine, "--resume")
    out, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, out[-4000:]
    assert f"done steps={STEPS} resumed_from=" in out and "step_000001" in out.split("resumed_from=")[-1]
    steps = trained_prompts(RunDirectory(cfg.run_dir(), config_hash="read-only"))
    print(f"\nkilled at 'phase train_step 2' ({len(killed)} processes); trained per step after resume: {steps}")
    assert [len(s) for s in steps] == [2] * STEPS
    flat = [p for s in steps for p in s]
    assert len(flat) == len(set(flat)), f"a prompt was trained twice: {steps}"



def test_a_run_killed_mid_broadcast_leaves_no_engine_half_updated_and_the_resumed_run_loses_nothing(
        tmp_path: Path) -> None:
    """``sync.method = distributed`` with the run's own engine: the run (driver and trainer in one
    process) is SIGKILLed while it broadcasts step 2's weights over gloo. The engine is then blocked in
    the broadcast (measured: it never answers ``/health_generate`` again; SGLang's side of the group
    waits out a fixed 30-minute timeout, on NCCL too), so it must not outlive its run: it goes with
    the run's process tree, and no engine holding part of step 2's weights serves anyone. The resumed
    run starts a new engine, pushes the checkpoint's weights to it in a new group (the post-sync probe
    checks they are served) and trains every prompt once."""
    from _killable_run import config

    run = start(tmp_path, "launch", "--method", "distributed", "--slow-broadcast", "1.0")
    lines: list[str] = []
    deadline = time.monotonic() + 300
    assert run.stdout is not None
    synced = False
    for line in run.stdout:
        lines.append(line.rstrip())
        synced = synced or line.strip() == "phase sync_weights 2"
        if synced and line.startswith("broadcast "):
            time.sleep(0.3)  # inside the (slowed) broadcast of step 2's weights
            break
        assert time.monotonic() < deadline, "the run did not reach step 2's sync in time"
    else:
        raise AssertionError("the run ended before step 2's sync:\n" + "\n".join(lines[-40:]))
    tree = psutil.Process(run.pid).children(recursive=True)
    engines = [p for p in tree if "sglang" in " ".join(p.cmdline())]
    assert engines, "the run's engine was not found in its process tree"
    killed = kill_tree(run)
    assert {p.pid for p in engines} <= set(killed)
    # SIGKILLed, each exits once the kernel gets to it (a loaded machine: up to seconds)
    _, alive = psutil.wait_procs(engines, timeout=30)
    assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    resumed = start(tmp_path, "launch", "--resume", "--method", "distributed")
    out, _ = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, out[-4000:]
    cfg = config(tmp_path, "launch", "distributed")
    steps = trained_prompts(RunDirectory(cfg.run_dir(), config_hash="read-only"))
    print(f"\nkilled mid-broadcast ({len(killed)} processes, its engine among them); trained per step: {steps}")
    assert [len(s) for s in steps] == [2] * STEPS
    flat = [p for s in steps for p in s]
    assert len(flat) == len(set(flat)), f"a prompt was trained twice: {steps}"
