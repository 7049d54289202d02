"""``agentrl train`` for real, in a subprocess: the tiny Qwen3 warmed up by ``agentrl sft`` (so the run
starts from an SFT output folder) on a CPU SGLang engine, toy arithmetic, two steps (Ray: a rollout actor and a train actor), then ``--resume`` of the run folder in-process
(``--no-ray``) after its last checkpoint is removed, as if the run had been killed in step 2.

One engine at a time (the second run starts after the first has ended). Asserted on what the run
folder holds: the config snapshot and its hash, one metrics line per step, the trajectory files,
the checkpoints and the summary, the TensorBoard events (read back); and on what the command printed
off a terminal: one line per step and the end-of-run summary.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1500)]


def _sft_model(tmp_path: Path) -> Path:
    """``agentrl sft`` of the tiny model on a few synthetic conversations: the folder RL starts from."""
    from agentrl.sft import arithmetic_conversations

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in arithmetic_conversations(make_arithmetic_rows(16, seed=1))))
    config = tmp_path / "sft.toml"
    config.write_text(f'output = "{tmp_path / "sft"}"\n[model]\npath = "{build_tiny_model()}"\n'
                      f'[data]\npath = "{data}"\n[train]\nsteps = 3\nbatch_size = 4\ndevice = "cpu"\nthreads = 1\n')
    exe = Path(sys.executable).with_name("agentrl")
    proc = subprocess.run([str(exe), "sft", str(config), "--quiet"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "sft" / "config.json").is_file()
    return tmp_path / "sft"


def _config(tmp_path: Path) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(16, seed=0)))
    config = tmp_path / "run.toml"
    config.write_text(f"""
[model]
path = "{_sft_model(tmp_path)}"
dtype = "float32"
[data.train]
path = "{data}"
[environment]
name = "toy_arithmetic"
[rollout.engines]
count = 1
context_length = 1024
max_total_tokens = 8192
random_seed = 0
[rollout.sampling]
max_new_tokens = 48
[rollout.scheduler]
groups_per_step = 2
group_size = 2
[train]
steps = 2
max_tokens_per_micro_batch = 2048
[train.optimizer]
lr = 1e-3
[logging]
run_dir = "{tmp_path / 'run'}"
[checkpoint]
every_steps = 1
keep_last = 3
""")
    return config


def _agentrl(*args: str, timeout: float = 700) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("agentrl")
    return subprocess.run([str(exe), "train", *args], capture_output=True, text=True, timeout=timeout)


def test_train_two_steps_then_resume(tmp_path: Path, shared_engine: str) -> None:
    """On the session's engine (``rollout.engines.urls``; the runner's own engine start is the
    runner e2e test's): each run loads its weights into it before its first rollout."""
    config = _config(tmp_path)
    run = tmp_path / "run"
    first = _agentrl(str(config), "train.seed=1", "logging.tensorboard=true", f"rollout.engines.urls={shared_engine}")
    assert first.returncode == 0, first.stderr[-4000:]
    assert f"done: 2 steps; run folder {run}" in first.stdout
    # not a terminal: one plain line per step, then the one-screen summary naming the run folder
    step_lines = [line for line in first.stdout.splitlines() if line.startswith("step ") and " reward=" in line]
    assert [line.split()[1] for line in step_lines] == ["1/2", "2/2"], first.stdout
    assert "run summary" in first.stdout and "tensorboard" in first.stdout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("rollout/reward_mean")] == [1, 2]

    record = json.loads((run / "config.json").read_text())
    assert record["config"]["train"]["seed"] == 1 and record["config"]["environment"]["name"] == "toy_arithmetic"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for step in (1, 2):
        with gzip.open(run / "trajectories" / f"step_{step:06d}.jsonl.gz", "rt") as f:
            header, *episodes = f.read().splitlines()
        assert json.loads(header)["config_hash"] == record["config_hash"] and len(episodes) == 4
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_")) == \
        ["step_000001", "step_000002"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["resumed_from"] is None

    # as if killed during step 2 before its checkpoint: resume from step 1, redo step 2
    shutil.rmtree(run / "checkpoints" / "step_000002")
    dry = _agentrl(str(run), "--resume", "--dry-run", timeout=300)  # the saved config holds the URL
    assert dry.returncode == 0, dry.stderr
    assert "resume from  " in dry.stdout and "dry run: nothing started" in dry.stdout
    second = _agentrl(str(run), "--resume", "--no-ray", "--quiet")
    assert second.returncode == 0, second.stderr[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and "step_000001" in str(summary["resumed_from"])
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]  # step 2 rewound and redone, not listed twice
    assert (run / "checkpoints" / "step_000002" / "meta.json").is_file()


def test_sigterm_during_the_warmup_stops_everything_the_run_started(tmp_path: Path, shared_engine: str) -> None:
    """A signal while the train actor warms up (before any training step): the command says how to
    resume and exits 130, and every process it started (Ray's, the actors') is gone."""
    import os
    import re
    import select
    import signal
    import time

    import psutil

    from agentrl.sft import arithmetic_conversations

    config = _config(tmp_path)
    warm = tmp_path / "warm.jsonl"
    warm.write_text("".join(json.dumps(c) + "\n" for c in arithmetic_conversations(make_arithmetic_rows(16, seed=3))))
    run = tmp_path / "run"
    exe = Path(sys.executable).with_name("agentrl")
    proc = subprocess.Popen([str(exe), "train", str(config), f"rollout.engines.urls={shared_engine}",
                             f"warmup.data={warm}", "warmup.steps=100000", "warmup.batch_size=2", "warmup.log_every=1",
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # the warm-up runs in the Ray train actor; its progress lines reach the command's stdout
        deadline, shown = time.monotonic() + 300, b""
        assert proc.stdout is not None
        while b"warm-up step " not in shown or not shown.endswith(b"\n"):
            if proc.poll() is not None or time.monotonic() >= deadline:
                proc.kill()
                pytest.fail(f"no warm-up line on stdout: {shown[-2000:]!r}\n{proc.communicate()[1][-3000:]!r}")
            if select.select([proc.stdout], [], [], 0.5)[0]:
                shown += os.read(proc.stdout.fileno(), 1 << 16)
        assert (run / "warmup_metrics.jsonl").is_file()
        assert re.search(rb"^warm-up step \d+/100000: loss \d+\.\d{4}$", shown, re.M), shown
        started = psutil.Process(proc.pid).children(recursive=True)
        assert started, "the run started no process"
        os.kill(proc.pid, signal.SIGTERM)
        err = proc.communicate(timeout=120)[1].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert f"interrupted; the run folder {run} can be resumed with --resume" in err
    assert "Traceback" not in err

    def alive(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 30
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [p.pid for p in started if alive(p)] == [], [p.name() for p in started if alive(p)]
