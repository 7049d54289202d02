"""The Docker calls of a Docker workspace, each blocking (the backend runs them in its thread pool).

- :func:`exec_io`: a ``docker exec`` on an attached socket, its input sent on stdin (never on the
  command line, where every process of the container could read it) and at most ``limit`` bytes of
  its stdout read (more is a :class:`~agentrl.tools.workspace.base.WorkspaceError`, and the rest is
  never read into memory);
- :func:`tar_folder`, :func:`tar_files`: what is unpacked into a container's ``/work``;
- :data:`KILL_GROUP`, :data:`KILL_ALL`: programs (run by ``python3 -I -S -c`` in the container as
  uid 65534) that kill every process of one group, or every process but the container's PID 1, and
  wait until none is left;
- :func:`death`: why a container stopped (``out of memory``), for the typed failure every later
  call gets.
"""

from __future__ import annotations

import io
import os
import socket
import struct
import tarfile
import time
from collections.abc import Mapping
from typing import Any

from agentrl.tools.workspace.base import WorkspaceError

__all__ = ["KILL_ALL", "KILL_GROUP", "death", "demux_stdout", "exec_io", "owned", "tar_files", "tar_folder"]

_SWEEP = """import os, signal, time
deadline = time.monotonic() + 3.0
me = os.getpid()
while time.monotonic() < deadline:
    found = []
    for pid in os.listdir('/proc'):
        if not pid.isdigit() or int(pid) in (1, me):
            continue
        try:
            with open(f'/proc/{pid}/status') as f:
                fields = dict(line.split(':', 1) for line in f if ':' in line)
        except (OSError, ValueError):
            continue
        if WANTED and not fields.get('State', '').strip().startswith('Z'):
            found.append(int(pid))
    if not found:
        break
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.01)
else:
    raise SystemExit(1)
"""
KILL_GROUP = _SWEEP.replace("WANTED", "fields.get('Gid', '').split()[:1] == [GID]")
"""Kills every process whose real group is ``GID`` (replace it with the number, quoted)."""
KILL_ALL = _SWEEP.replace("WANTED", "True")
"""Kills every process of the container but its PID 1 (and this one)."""


def demux_stdout(sock: Any, limit: int) -> bytes:
    """The stdout frames of an attached ``docker exec`` stream (8-byte headers), until it closes;
    :class:`WorkspaceError` once they pass ``limit`` bytes (the rest is not read)."""
    out, pending = bytearray(), bytearray()
    while chunk := sock.recv(1 << 20):
        pending += chunk
        while len(pending) >= 8:
            size = struct.unpack(">I", pending[4:8])[0]
            if len(pending) < 8 + size:
                break
            if pending[0] == 1:
                out += pending[8:8 + size]
                if len(out) > limit:
                    raise WorkspaceError(f"more than {limit} bytes of output")
            del pending[:8 + size]
        if len(pending) > limit + (1 << 20):
            raise WorkspaceError(f"more than {limit} bytes of output")
    return bytes(out)


def exec_io(api: Any, container_id: str, argv: list[str], *, user: str, limit: int, stdin: bytes | None = None,
            workdir: str | None = None, environment: Mapping[str, str] | None = None,
            timeout_s: float | None = None) -> tuple[bytes, int | None]:
    """Runs ``argv`` in the container with ``stdin`` as its input; returns its stdout (at most
    ``limit`` bytes) and exit code (None if it was still running when its output ended)."""
    exec_id = api.exec_create(container_id, argv, stdin=stdin is not None, stdout=True, stderr=False, user=user,
                              workdir=workdir, environment=dict(environment or {}))["Id"]
    sock = api.exec_start(exec_id, socket=True)
    raw = getattr(sock, "_sock", sock)
    try:
        if timeout_s is not None:
            raw.settimeout(timeout_s)
        if stdin is not None:
            raw.sendall(stdin)
            raw.shutdown(socket.SHUT_WR)
        out = demux_stdout(raw, limit)
    finally:
        raw.close()
    code = api.exec_inspect(exec_id).get("ExitCode")
    return out, None if code is None else int(code)


def death(container: Any) -> str | None:
    """Why ``container`` is not running (``None`` while it runs): its state as Docker reports it."""
    try:
        container.reload()
        state = container.attrs.get("State") or {}
    except Exception as exc:  # the Docker SDK's errors: the container is gone
        return f"it is gone ({type(exc).__name__})"
    if state.get("Running"):
        return None
    if state.get("OOMKilled"):
        return "it ran out of memory"
    return f"it stopped ({state.get('Status', 'unknown')}, exit code {state.get('ExitCode')})"


def tar_folder(folder: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in sorted(os.listdir(folder)):
            tf.add(os.path.join(folder, name), arcname=name, filter=owned)
    return buf.getvalue()


def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 65534
    info.uname = info.gname = ""
    return info


def tar_files(files: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path, data in sorted(files.items()):
            info = owned(tarfile.TarInfo(path))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
