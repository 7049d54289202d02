"""The reaper: a small process that outlives its owner only long enough to stop what the owner started,
and the owner's link to it.

``python -m agentrl._reaper`` reads lines on stdin from the process that started it (its
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

The owner's side is :func:`reap_with_this_process` / :func:`unreap` (a process tree),
:func:`reap_path_with_this_process` / :func:`unreap_path` and :func:`reap_container_with_this_process` /
:func:`unreap_container`: the first entry starts this process's reaper, the last one taken back ends it.
A shared utility below every layer: the server launchers (:mod:`agentrl.rollout.process`), the runner's
local Ray and the workspaces of :mod:`agentrl.tools` all register here.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import psutil

__all__ = ["reap_container_with_this_process", "reap_path_with_this_process", "reap_with_this_process", "unreap",
           "unreap_container", "unreap_path"]

GRACE_S = 3.0


def _tree(pid: int, created: float) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        if abs(root.create_time() - created) > 0.01:
            return []  # that PID belongs to another process now
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def terminate(procs: list[psutil.Process], grace_s: float) -> None:
    """SIGTERM ``procs``, wait up to ``grace_s``, SIGKILL the survivors and wait for them briefly."""
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


def reap(registered: dict[int, float]) -> None:
    """Stops every registered tree: SIGTERM, then SIGKILL after :data:`GRACE_S`."""
    procs: list[psutil.Process] = []
    groups: list[int] = []
    for pid, created in registered.items():
        tree = _tree(pid, created)
        procs += tree
        if tree:
            groups.append(pid)  # each server leads its own session: its group id is its pid
    terminate(procs, GRACE_S)
    for group in groups:  # children that left the tree but kept the group
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    psutil.wait_procs(procs, timeout=GRACE_S)


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


# -- the owner's side ------------------------------------------------------------------------
class _ReaperLink:
    """This process's pipe to its reaper (started with the first thing it guards, ended with the last;
    started again after a fork or if it died). Guards process trees (``registered``) and, for
    workspaces, containers and folders (``others``: the line that registers each, by key)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.owner = -1
        self.lock = threading.Lock()
        self.registered: dict[int, float] = {}
        self.others: dict[str, str] = {}

    def _send(self, line: str) -> None:
        if self.proc is None or self.owner != os.getpid() or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", "agentrl._reaper"], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
            self.owner = os.getpid()
            assert self.proc.stdin is not None
            for pid, created in self.registered.items():  # a new reaper learns what the last one knew
                self.proc.stdin.write(f"add {pid} {created}\n".encode())
            for known in self.others.values():
                self.proc.stdin.write(known.encode())
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()

    def add_other(self, key: str, line: str) -> None:
        with self.lock:
            self.others[key] = line
            try:
                self._send(line)
            except OSError:
                pass

    def remove_other(self, key: str, line: str) -> None:
        with self.lock:
            if self.others.pop(key, None) is None:
                return
            try:
                self._send_or_end(line)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def _send_or_end(self, line: str) -> None:
        """Sends ``line``, or ends the reaper when nothing is left to guard (a later entry starts a new one)."""
        if self.registered or self.others or self.proc is None or self.owner != os.getpid():
            self._send(line)
        else:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
            self.proc = None

    def add(self, pid: int) -> None:
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            return
        with self.lock:
            self.registered[pid] = created
            try:
                self._send(f"add {pid} {created}\n")
            except OSError:  # no reaper: the atexit and signal hooks still stop the tree
                pass

    def remove(self, pid: int) -> None:
        with self.lock:
            if self.registered.pop(pid, None) is None:
                return
            try:
                self._send_or_end(f"remove {pid}\n")
            except (OSError, subprocess.TimeoutExpired):
                pass


_REAPER = _ReaperLink()


def reap_with_this_process(pid: int) -> None:
    """Registers the process tree of ``pid`` (started by this process, in a session of its own) with
    this process's reaper: if this process dies without stopping it, the reaper does (e.g. a local Ray
    this process started). :func:`unreap` once it stopped the tree itself."""
    _REAPER.add(pid)


def unreap(pid: int) -> None:
    _REAPER.remove(pid)


def _one_line(value: str, what: str) -> str:
    if not value or "\n" in value or "\r" in value:
        raise ValueError(f"{what}: expected a non-empty value without line breaks, got {value!r}")
    return value


def reap_path_with_this_process(path: str) -> None:
    """Registers a folder (absolute path) the reaper removes with everything in it if this process dies
    before :func:`unreap_path` (a workspace's staged base, a cgroup parent: deepest groups first)."""
    path = _one_line(os.path.abspath(path), "reap_path_with_this_process(path)")
    _REAPER.add_other(f"path {path}", f"path {path}\n")


def unreap_path(path: str) -> None:
    path = os.path.abspath(path)
    _REAPER.remove_other(f"path {path}", f"unpath {path}\n")


def reap_container_with_this_process(container_id: str, docker_host: str) -> None:
    """Registers a Docker container the reaper removes (with force, through the daemon at ``docker_host``)
    if this process dies before :func:`unreap_container`."""
    if not container_id.isalnum() or " " in docker_host:
        raise ValueError(f"reap_container_with_this_process: expected a container id and a DOCKER_HOST URL, got "
                         f"{container_id!r}, {docker_host!r}")
    _one_line(docker_host, "reap_container_with_this_process(docker_host)")
    _REAPER.add_other(f"container {container_id}", f"container {container_id} {docker_host}\n")


def unreap_container(container_id: str) -> None:
    _REAPER.remove_other(f"container {container_id}", f"uncontainer {container_id}\n")


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
