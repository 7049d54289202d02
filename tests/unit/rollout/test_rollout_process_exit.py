"""A parent ended by SIGTERM, SIGHUP or SIGINT takes its servers' whole process trees with it.

Each server runs in its own session, so the parent's signal never reaches it; the registry in
``agentrl.rollout.process`` stops the trees from a signal handler (SIGTERM, SIGHUP) or at exit
(SIGINT's KeyboardInterrupt). The parent here is a real program in a subprocess."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

PARENT = """
import asyncio, signal, sys, time
from pathlib import Path
from agentrl.rollout.process import ManagedProcess

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in an interactive program
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal (a suite run under nohup ignores it)
SPAWNER = (
    "import subprocess, sys, time\\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']) for _ in range(2)]\\n"
    "time.sleep(300)\\n"
)
out = Path(sys.argv[1])
procs = [ManagedProcess([sys.executable, "-c", SPAWNER], env={"PATH": "/usr/bin:/bin"},
                        log_path=out.parent / f"server{i}.log", name=f"server{i}") for i in range(2)]
deadline = time.monotonic() + 60
while True:
    trees = [p.tree() for p in procs]
    if all(len(t) == 3 for t in trees):
        break
    if time.monotonic() > deadline:
        sys.exit(f"the servers did not start their children in 60 s: {trees}")
    time.sleep(0.05)
# written whole or not at all: the test reads the file as soon as it exists
Path(f"{out}.tmp").write_text(" ".join(str(p.pid) for t in trees for p in t))
Path(f"{out}.tmp").replace(out)


async def main() -> None:
    await asyncio.sleep(300)

asyncio.run(main())
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_parent_leaves_no_server_process_behind(tmp_path: Path, sig: signal.Signals) -> None:
    pids_file = tmp_path / "pids"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(pids_file)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT)
    pids: list[int] = []
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not pids_file.exists():
            assert parent.poll() is None, parent.stdout.read() if parent.stdout else b""
            assert time.monotonic() < deadline, "the parent did not start its servers"
            time.sleep(0.05)
        pids = [int(p) for p in pids_file.read_text().split()]
        started = [psutil.Process(p) for p in pids]  # psutil refuses to signal a reused pid
        assert len(pids) == 6 and not any(_gone(p) for p in pids)
        parent.send_signal(sig)
        code = parent.wait(timeout=60)
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in pids if not _gone(p)] == [], f"left behind after {sig.name}"
        # the signal still ended the parent as it would have (an uncaught KeyboardInterrupt exits by SIGINT)
        assert code == -sig
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for proc in started:  # only if the test failed: never leave the processes it started
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
