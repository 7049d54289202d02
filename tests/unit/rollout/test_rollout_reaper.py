"""The reaper: servers a process started do not outlive it, even when it is SIGKILLed (no handler of
its own runs then). A child process starts a server tree (a process and its child, in their own
session, as every server launcher does); the test kills only that owner with SIGKILL and finds the
tree gone within 10 s. A PID registered and since reused by another process is never touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from agentrl._reaper import reap

OWNER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from agentrl.rollout.process import ManagedProcess
    server = ManagedProcess([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); time.sleep(300)"],
                            env={}, log_path=Path(sys.argv[1]), name="sleeper")
    deadline = time.monotonic() + 60
    while len(server.tree()) < 2 and time.monotonic() < deadline:  # its child started
        time.sleep(0.05)
    print(server.pid, " ".join(str(c.pid) for c in server.tree()[1:]), flush=True)
    time.sleep(300)
""")


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_a_sigkilled_owner_leaves_no_server_behind(tmp_path: object) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path) + "/sleeper.log"], stdout=subprocess.PIPE,
                             text=True)
    assert owner.stdout is not None
    server, *children = (int(x) for x in owner.stdout.readline().split())
    tree = [server, *children]
    assert children and _alive(tree) == tree
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    t0 = time.monotonic()
    while _alive(tree) and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    assert _alive(tree) == [], f"still alive {time.monotonic() - t0:.1f} s after the owner's SIGKILL"


def test_a_reused_pid_is_never_touched() -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        created = psutil.Process(bystander.pid).create_time()
        reap({bystander.pid: created - 100.0})  # registered for an earlier process with that PID
        assert bystander.poll() is None
        t0 = time.monotonic()
        reap({bystander.pid: created})
        bystander.wait(timeout=10)  # (the reaper collected its status: Popen sees 0)
        assert not _alive([bystander.pid]) and time.monotonic() - t0 < 5
    finally:
        if bystander.poll() is None:
            os.kill(bystander.pid, signal.SIGKILL)
