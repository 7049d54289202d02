"""The reaper: a small process that outlives its owner only long enough to stop what the owner started.

``python -m agentrl.rollout._reaper`` reads lines on stdin from the process that started it (its
owner): ``add PID CREATE_TIME`` for each server process tree the owner starts, ``remove PID`` when
the owner stopped it. When stdin reaches end of file — the owner exited, however it exited: a
``kill -9`` included, since the kernel closes a dead process's end of the pipe — it stops every tree
still registered: SIGTERM to the process, its descendants and its process group, SIGKILL to what is
left after a grace period, all within seconds. A PID is only acted on while its start time is the one
registered (a recycled PID is never touched). It runs in its own session, so a signal to the
owner's process group does not reach it. Standard library and psutil only (it starts in ~50 ms).

Workspaces (:mod:`agentrl.tools.workspace`) leave more than processes behind, so two more kinds of
entries exist, each undone after the processes are gone: ``container ID DOCKER_HOST`` (removed with
force through the Docker API, over the daemon's unix socket or TCP: no Docker client needed) and
``path PATH`` (a folder removed with everything in it; a cgroup folder with its child groups,
deepest first). ``uncontainer ID`` and ``unpath PATH`` take them back.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import sys
import time
from urllib.parse import urlparse

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


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def remove_container(container_id: str, docker_host: str, timeout_s: float = 30.0) -> bool:
    """``DELETE /containers/ID?force=1`` on the daemon at ``docker_host``; True when it is gone."""
    url = urlparse(docker_host)
    try:
        if url.scheme == "unix":
            conn: http.client.HTTPConnection = _UnixHTTP(url.path, timeout_s)
        else:
            conn = http.client.HTTPConnection(url.hostname or "localhost", url.port or 2375, timeout=timeout_s)
        conn.request("DELETE", f"/containers/{container_id}?force=1&v=1")
        status = conn.getresponse().status
        conn.close()
    except OSError:
        return False
    return status in (204, 404)


def remove_path(path: str) -> None:
    """Removes a folder tree; a cgroup folder (which only ``rmdir`` removes) deepest group first."""
    if path.startswith("/sys/fs/cgroup/"):
        for _ in range(50):  # a group is busy until the kernel released its last task
            groups = sorted((os.path.join(r, d) for r, ds, _ in os.walk(path) for d in ds), key=len, reverse=True)
            for group in [*groups, path]:
                with contextlib.suppress(OSError):
                    os.rmdir(group)
            if not os.path.exists(path):
                return
            time.sleep(0.05)
        return
    shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    registered: dict[int, float] = {}
    containers: dict[str, str] = {}
    paths: set[str] = set()
    for line in sys.stdin:
        parts = line.split()
        try:
            if parts[:1] == ["add"] and len(parts) == 3:
                registered[int(parts[1])] = float(parts[2])
            elif parts[:1] == ["remove"] and len(parts) == 2:
                registered.pop(int(parts[1]), None)
            elif parts[:1] == ["container"] and len(parts) == 3:
                containers[parts[1]] = parts[2]
            elif parts[:1] == ["uncontainer"] and len(parts) == 2:
                containers.pop(parts[1], None)
            elif line.startswith("path /") and line.endswith("\n"):
                paths.add(line[5:-1])
            elif line.startswith("unpath /") and line.endswith("\n"):
                paths.discard(line[7:-1])
        except ValueError:
            continue  # a torn line from an owner killed mid-write
    reap(registered)
    for container_id, host in containers.items():
        remove_container(container_id, host)
    for path in sorted(paths, key=len, reverse=True):
        remove_path(path)


if __name__ == "__main__":
    main()
