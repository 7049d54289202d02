"""ManagedProcess stops exactly the tree it started (children included), nothing else."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentrl.rollout.process import ManagedProcess, wait_ready

SPAWNER = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(2)]
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(300)
"""


def _wait_for_children(proc: ManagedProcess) -> list[psutil.Process]:
    for _ in range(100):
        tree = proc.tree()
        if len(tree) == 3:
            return tree
        time.sleep(0.05)
    raise AssertionError(f"expected a root and 2 children, got {proc.tree()}")


def test_stop_ends_the_whole_tree_and_spares_others(tmp_path: Path) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        proc = ManagedProcess([sys.executable, "-c", SPAWNER], env={"PATH": "/usr/bin:/bin"},
                              log_path=tmp_path / "p.log", name="spawner")
        tree = _wait_for_children(proc)
        proc.stop(grace_s=2.0)
        assert not proc.alive() and proc.tree() == []
        assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in tree)
        assert bystander.poll() is None  # not ours, still running
    finally:
        bystander.kill()
        bystander.wait()


def test_kill_now_and_log_tail(tmp_path: Path) -> None:
    proc = ManagedProcess([sys.executable, "-c", SPAWNER], env={"PATH": "/usr/bin:/bin"},
                          log_path=tmp_path / "k.log", name="spawner")
    tree = _wait_for_children(proc)
    for _ in range(100):
        if proc.log_tail().strip():
            break
        time.sleep(0.05)
    proc.kill_now()
    assert proc.returncode() == -9
    for p in tree[1:]:
        try:
            p.wait(timeout=5)
        except psutil.NoSuchProcess:
            pass
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in tree)
    assert sorted(int(x) for x in proc.log_tail().split()) == sorted(p.pid for p in tree[1:])


# A root that, like SGLang's server, answers its child's exit by stalling before it exits (it notes
# that it saw the exit), and a child that notes the SIGTERM it gets.
STALLING_ROOT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: None)  # the root waits on its child instead
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
child.wait()
open(sys.argv[3], "w").write("saw the child exit")
time.sleep(60)  # "crash diagnostics"
"""
NOTING_CHILD = """
import signal, sys, time
def done(*_):
    open(sys.argv[1], "w").write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
open(sys.argv[1], "w").write("ready")
time.sleep(300)
"""


@pytest.mark.parametrize("kill_root_first", [True, False])
def test_kill_root_first_kills_the_root_before_the_children_end(tmp_path: Path, kill_root_first: bool) -> None:
    child_note, root_note = tmp_path / "child", tmp_path / "root"
    proc = ManagedProcess([sys.executable, "-c", STALLING_ROOT, NOTING_CHILD, str(child_note), str(root_note)],
                          env={"PATH": "/usr/bin:/bin"}, log_path=tmp_path / "r.log", name="stalling",
                          kill_root_first=kill_root_first)
    for _ in range(200):
        if child_note.exists() and child_note.read_text() == "ready":
            break
        time.sleep(0.05)
    tree = proc.tree()
    assert len(tree) == 2
    proc.stop(grace_s=1.0)
    assert child_note.read_text() == "SIGTERM"  # the child shuts down on SIGTERM either way
    # killed first, the root never saw its child go (nothing to stall on); otherwise it did
    assert root_note.exists() is not kill_root_first
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in tree)


async def _never() -> bool:
    return False


async def test_start_stops_a_process_that_never_gets_ready(tmp_path: Path) -> None:
    started: list[ManagedProcess] = []

    async def ready(proc: ManagedProcess) -> None:
        started.append(proc)
        await wait_ready(_never, what="sleeper", timeout_s=0.3, poll_s=0.05, error_cls=RuntimeError, process=proc)

    with pytest.raises(RuntimeError, match=r"sleeper not ready after 0.3 s; log .*w.log"):
        await ManagedProcess.start([sys.executable, "-c", "import time; time.sleep(300)"], env={},
                                   log_path=tmp_path / "w.log", name="sleeper", ready=ready)
    assert len(started) == 1 and not started[0].alive()


async def test_wait_ready_reports_an_early_exit_with_the_log_tail(tmp_path: Path) -> None:
    proc = ManagedProcess([sys.executable, "-c", "print('no model here'); raise SystemExit(3)"], env={},
                          log_path=tmp_path / "x.log", name="quitter")
    with pytest.raises(ValueError, match=r"(?s)quitter exited with code 3 while starting; log .*no model here"):
        await wait_ready(_never, what="quitter", timeout_s=30, poll_s=0.05, error_cls=ValueError, process=proc)
