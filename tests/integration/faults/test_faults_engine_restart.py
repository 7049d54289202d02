"""``agentrl train`` with its only engine SIGKILLed after the first step: the whole run is the real CLI
(Ray, the engine's host actor, a CPU SGLang engine of its own serving the tiny Qwen3, the real
sglang-router, the torch trainer, disk weight sync), in a child process; the test kills the engine's
process tree (SGLang's scheduler and detokenizer included) once step 1 is in the metrics.

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

import orjson
import psutil
import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, GROUPS = 3, 2


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
            "scheduler": {"groups_per_step": GROUPS, "group_size": 2},
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
    no server of that port runs (before it started, or between a stop and a restart)."""
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


def _serving_engine_tree(run: Path, deadline: float) -> list[psutil.Process]:
    """The run's engine tree once it is whole (the server and its scheduler), waiting for it: the test
    must not depend on the moment it looks (the health monitor may be restarting the engine then)."""
    while time.monotonic() < deadline:
        tree = _engine_tree(run)
        if any("sglang::scheduler" in " ".join(_cmdline(p)) for p in tree):
            return tree
        time.sleep(0.2)
    return []


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


MARKER = "AGENTRL_TEST_RUN_MARKER"  # set in the run's environment: every process it starts inherits it


def _marked(token: str) -> list[psutil.Process]:
    """Every live process on this machine whose environment carries the run's marker: the driver, Ray's
    processes and actors, the reaper, the router, the engine and its scheduler and detokenizer, whenever
    each started (a restarted engine included)."""
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER) == token and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    return out


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
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", "train", str(config), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    killed: list[int] = []
    try:
        deadline = time.monotonic() + 420
        while _steps_done(run) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        tree = _serving_engine_tree(run, deadline)
        assert tree, "the run's SGLang server was not found"
        for victim in tree:
            killed.append(victim.pid)
            victim.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=max(10.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
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
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in killed)


def test_kill_9_of_the_driver_leaves_nothing_behind(tmp_path: Path) -> None:
    """Only the root of a real ``agentrl train`` process tree (the CLI, which started Ray locally) is
    SIGKILLed once step 1 is trained: its engine (SGLang and its scheduler and detokenizer), the router,
    the Ray actors and Ray itself must all be gone within 10 s (no handler of the driver runs: the
    servers' reapers and Ray's own fate-sharing do it)."""
    config = _config(tmp_path)
    run = tmp_path / "run"
    token = os.urandom(8).hex()
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", "train", str(config), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, MARKER: token})
    try:
        deadline = time.monotonic() + 420
        while _steps_done(run) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before step 1"
        # the whole engine (server, scheduler) is up: the kill must find it, not a restart in between
        engines = _serving_engine_tree(run, deadline)
        assert engines, "the run's SGLang server and scheduler were not found after step 1"
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
