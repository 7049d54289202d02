"""``agentrl train`` with its only engine SIGKILLed after the first step: the whole run is the real CLI
(Ray, the engine's host actor, a CPU SGLang engine of its own serving the tiny Qwen3, the real
sglang-router, the torch trainer, disk weight sync), in a child process; the test kills the engine's
process tree (SGLang's scheduler and detokenizer included) once step 1 is in the metrics. The run's
reward (``_gate.py``) holds it inside step 2 until the test has done so: with the tiny model a whole
run can take two seconds past step 1, and a test that only polled the run folder could find it over.

Expected: the run's health monitor sees the engine die, takes it out of the router's rotation,
restarts it, loads the current weight version into it before it serves again (the post-sync probe of
every later step would stop the run otherwise), and puts it back; the requests of the step in flight
wait for it instead of failing; every step trains all its prompts (none failed, none lost); the step
report counts the engine's death and restart. Deadline: 420 s for the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import _gate
import _procs
import orjson
import psutil
import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, GROUPS, GROUP_SIZE = 3, 2, 2


def _config(root: Path) -> Path:
    data = root / "train.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in make_arithmetic_rows(16, seed=0)))
    config = {
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data), "seed": 1}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {
            "engines": {"count": 1, "context_length": 1024, "max_total_tokens": 4096, "random_seed": 0,
                        "startup_timeout_s": 300},
            "health": {"check_interval_s": 0.5},
            "sampling": {"max_new_tokens": 32, "temperature": 1.0},
            "scheduler": {"groups_per_step": GROUPS, "group_size": GROUP_SIZE},
        },
        "train": {"steps": STEPS, "optimizer": {"lr": 1e-3}, "max_tokens_per_micro_batch": 2048},
        "logging": {"run_dir": str(root / "run")},
        "checkpoint": {"save_final": False},
    }
    path = root / "run.json"
    path.write_text(json.dumps(config))
    return path


def _engine_tree(run: Path) -> list[psutil.Process]:
    """The run's SGLang server (found by the port its log is named after) and its children: empty while
    no server of that port runs."""
    for log in (run / "logs").glob("sglang-*.log"):
        port = log.stem.split("-", 1)[1]
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if "sglang.launch_server" in cmd and port in cmd:
                try:
                    return [proc, *proc.children(recursive=True)]
                except psutil.NoSuchProcess:
                    return []
    return []


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


MARKER = "AGENTRL_TEST_RUN_MARKER"  # set in the run's environment: every process it starts inherits it


def _marked(token: str) -> list[psutil.Process]:
    """Every live process on this machine whose environment carries the run's marker: the driver, Ray's
    processes and actors, the reaper, the router, the engine and its scheduler and detokenizer, the reward
    workers, whenever each started."""
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER) == token and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    return out


def _start_held(config: Path, tmp_path: Path, **env: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``agentrl train`` with the gated reward: after step 1 the run waits inside step 2 (its first
    reward held, its engine up) until the test opens the gate, however fast its steps are."""
    gate = tmp_path / "gate"
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli.main", "train", str(config), "--quiet", "--reward", "_gate:gated_reward"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **_gate.close(gate, GROUPS * GROUP_SIZE), **env})
    return proc, gate


def _wait_held(proc: subprocess.Popen[bytes], run: Path, gate: Path, deadline: float) -> None:
    """Until step 1 is recorded and step 2's first reward waits at the gate (the run cannot end meanwhile)."""
    while (_steps_done(run) < 1 or not _gate.held(gate, GROUPS * GROUP_SIZE)) and proc.poll() is None:
        assert time.monotonic() < deadline, "the run did not reach step 2's rewards in time"
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0][-3000:]


def _steps_done(run: Path) -> int:
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        return 0
    text = metrics.read_text()
    complete = text[: text.rfind("\n") + 1]  # a line still being written is not a step yet
    return sum(1 for line in complete.splitlines() if line.strip() and "prompt_ids" in json.loads(line))


def test_an_engine_killed_mid_run_is_restarted_resynced_and_no_prompt_is_lost(tmp_path: Path) -> None:
    config = _config(tmp_path)
    run = tmp_path / "run"
    proc, gate = _start_held(config, tmp_path)
    killed: list[int] = []
    try:
        deadline = time.monotonic() + 420
        _wait_held(proc, run, gate, deadline)
        tree = _engine_tree(run)
        assert any("sglang::scheduler" in " ".join(_cmdline(p)) for p in tree), "the run's engine was not found whole"
        for victim in tree:
            killed.append(victim.pid)
            victim.send_signal(signal.SIGKILL)
        _gate.open_gate(gate)  # step 2 goes on; step 3's requests need the engine back
        raw, _ = proc.communicate(timeout=max(10.0, deadline - time.monotonic()))
        out = raw.decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [line for line in lines if "prompt_ids" in line]
    assert len(steps) == STEPS
    assert all(len(s["prompt_ids"]) == GROUPS for s in steps)                 # every step trained all its prompts
    assert all(not any(k.startswith("report/failed/") for k in s) for s in steps)  # none failed
    events = {k.rsplit("/", 1)[1]: sum(s.get(k, 0) for s in steps)
              for k in {k for s in steps for k in s if k.startswith("report/engine_events/")}}
    assert events.get("dead", 0) >= 1 and events.get("restarted", 0) >= 1, events
    assert events.get("given_up", 0) == 0
    assert all(s["probe/mean_abs_diff"] <= 1e-3 for s in steps[1:])          # the restarted engine serves the trainer
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["prompts_trained"] == STEPS * GROUPS
    assert not _procs.running(killed, within_s=10)


def test_kill_9_of_the_driver_leaves_nothing_behind(tmp_path: Path) -> None:
    """Only the root of a real ``agentrl train`` process tree (the CLI, which started Ray locally) is
    SIGKILLed once step 1 is trained: its engine (SGLang and its scheduler and detokenizer), the router,
    the Ray actors and Ray itself must all be gone within 10 s (no handler of the driver runs: the
    servers' reapers and Ray's own fate-sharing do it)."""
    config = _config(tmp_path)
    run = tmp_path / "run"
    token = os.urandom(8).hex()
    proc, gate = _start_held(config, tmp_path, **{MARKER: token})
    try:
        deadline = time.monotonic() + 420
        _wait_held(proc, run, gate, deadline)  # mid-run, its engine serving, a reward of step 2 held
        engines = _engine_tree(run)
        assert any("sglang::scheduler" in " ".join(_cmdline(p)) for p in engines), "the run's engine was not found"
        before = _marked(token)
        assert {p.pid for p in engines} <= {p.pid for p in before} and len(before) > 5, \
            ([(p.pid, _cmdline(p)[:3]) for p in before], [p.pid for p in engines])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        t0 = time.monotonic()

        def left() -> list[str]:  # any process of the run, found afresh each time (none can hide by timing)
            return [f"{p.pid} {' '.join(_cmdline(p))[:80]}" for p in _marked(token)]

        while left() and time.monotonic() - t0 < 10:
            time.sleep(0.2)
        survivors = left()
        assert not survivors, f"alive {time.monotonic() - t0:.1f} s after the driver's SIGKILL: {survivors}"
        print(f"\nkill -9 of the driver: {len(before)} processes gone in {time.monotonic() - t0:.1f} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
