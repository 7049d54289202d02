"""Resume with workspaces, killed at both points: after the checkpoint (buffered episodes hold live
workspaces) and in the middle of the resumed run's replay. Each kill -9 leaves nothing (the reaper);
the last resume rebuilds the buffered episodes' workspaces by replaying their tool calls, and they
finish on the files they had: the hidden tests pass only with the fix made before the first kill.

The two sides run as processes of their own (``workspace_resume_run.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

RUN = Path(__file__).with_name("workspace_resume_run.py")


def start(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(RUN), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, **env})


def tree(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True)
                if "agentrl._reaper" not in " ".join(p.cmdline())]
    except psutil.Error:
        return []


def kill_and_check_nothing_left(proc: subprocess.Popen[str], owned: list[psutil.Process]) -> None:
    """kill -9 of the owner's process group (as a crash would end it), then: every process it started
    (holders, sandboxes, kernels) and every cgroup it made is gone within seconds."""
    assert owned, "the owner had started no workspace processes"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        alive = [p.pid for p in owned if _alive(p)]
        groups = list(Path("/sys/fs/cgroup").glob(f"*/agentrl-sandbox-{proc.pid}-*"))
        if not alive and not groups:
            return
        time.sleep(0.1)
    pytest.fail(f"left behind by pid {proc.pid}: processes {alive}, cgroups {groups}")


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_kills_at_the_checkpoint_and_in_the_replay_leave_nothing_and_resume_restores(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    saver = start("save", str(state))
    assert saver.stdout is not None
    saved: dict[str, Any] = json.loads(saver.stdout.readline() or "{}")
    assert saved.get("saved"), saver.stderr.read() if saver.stderr else ""
    assert saved["buffered"] and saved["workspaces"]["workspaces"] == 2  # the slow group's two live workspaces
    kill_and_check_nothing_left(saver, tree(saver.pid))  # kill 1: after the checkpoint

    replaying = start("resume", str(state), STALL_REPLAY="1")
    assert replaying.stdout is not None
    assert replaying.stdout.readline().strip() == "replaying"
    assert "stalled" in [replaying.stdout.readline().strip() for _ in range(2)]  # a replayed step ran in a fork
    kill_and_check_nothing_left(replaying, tree(replaying.pid))  # kill 2: in the middle of the replay

    done = subprocess.run([sys.executable, str(RUN), "resume", str(state)], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["restored"] == 2 and report["mismatch"] == 0 and report["problems"] == [], report
    assert report["rewards"] == [[saved["buffered"][0], 1.0]] * 2, report  # the fix survived both kills
    assert report["replayed_calls"] == [5, 5]
