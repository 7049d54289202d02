"""The reaper: a small process that outlives its owner only long enough to stop what the owner started.

``python -m agentrl.rollout._reaper`` reads lines on stdin from the process that started it (its
owner): ``add PID CREATE_TIME`` for each server process tree the owner starts, ``remove PID`` when
the owner stopped it. When stdin reaches end of file — the owner exited, however it exited: a
``kill -9`` included, since the kernel closes a dead process's end of the pipe — it stops every tree
still registered: SIGTERM to the process, its descendants and its process group, SIGKILL to what is
left after a grace period, all within seconds. A PID is only acted on while its start time is the one
registered (a recycled PID is never touched). It runs in its own session, so a signal to the
owner's process group does not reach it. Standard library and psutil only (it starts in ~50 ms).
"""

from __future__ import annotations

import os
import signal
import sys

import psutil

GRACE_S = 3.0


def _tree(pid: int, created: float) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        if abs(root.create_time() - created) > 0.01:
            return []  # that PID belongs to another process now
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def reap(registered: dict[int, float]) -> None:
    """Stops every registered tree: SIGTERM, then SIGKILL after :data:`GRACE_S`."""
    procs: list[psutil.Process] = []
    groups: list[int] = []
    for pid, created in registered.items():
        tree = _tree(pid, created)
        procs += tree
        if tree:
            groups.append(pid)  # each server leads its own session: its group id is its pid
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=GRACE_S)
    for proc in alive:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    for group in groups:  # children that left the tree but kept the group
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    psutil.wait_procs(alive, timeout=GRACE_S)


def main() -> None:
    registered: dict[int, float] = {}
    for line in sys.stdin:
        parts = line.split()
        try:
            if parts[:1] == ["add"] and len(parts) == 3:
                registered[int(parts[1])] = float(parts[2])
            elif parts[:1] == ["remove"] and len(parts) == 2:
                registered.pop(int(parts[1]), None)
        except ValueError:
            continue  # a torn line from an owner killed mid-write
    reap(registered)


if __name__ == "__main__":
    main()
