"""How the sandbox worker resets a container between two executions (the Docker backend).

Part of the worker program (``_worker.py``, which loads this file from its own directory): the
standard library only, run by the sandbox's interpreter, never imported by the host.

A container cannot give each execution its own namespaces (no capabilities), so after every
execution :func:`reset_container` kills every leftover process, empties ``/tmp`` and ``/dev/shm``
whatever permissions the program set, removes every SysV IPC object and POSIX message queue of the
container's private IPC namespace, checks that its network namespace holds no socket any more
(TCP ``TIME_WAIT`` state outlives a process), and then *verifies* all of it; what it cannot verify it reports,
and the host replaces the container. :func:`reaper` is the container's PID 1.
"""

from __future__ import annotations

import os
import signal
import stat
import time
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from agentrl.tools.sandbox import _worker_isolation as isolation
else:
    import _worker_isolation as isolation  # loaded by _worker.py from its own directory



def _alive(pid: int | str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def reap_exited() -> None:
    """Reaps every child that has exited, without blocking."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def sweep() -> bool:
    """Kills every process of this PID namespace except PID 1 and this worker (isolated modes only),
    and waits (up to 2 s) until PID 1 has reaped them all; False if some remain."""
    me = os.getpid()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        present = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not present:
            return True
        others = [p for p in present if _alive(p)]
        if not others:
            time.sleep(0.002)  # zombies: PID 1 reaps them
            continue
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap_exited()
        time.sleep(0.002)
    return False


def _purge(dir_fd: int, depth: int = 0) -> None:
    """Removes everything below ``dir_fd`` without following symlinks, making each directory
    searchable and writable first (the program's permission tricks do not stop its owner, which
    this process is). Runs when no other process is left, so nothing can race it."""
    for name in os.listdir(dir_fd):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and depth < 64:
            try:
                os.chmod(name, 0o700, dir_fd=dir_fd)  # a directory, not a symlink (lstat above)
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                _purge(sub, depth + 1)
            finally:
                os.close(sub)
            try:
                os.rmdir(name, dir_fd=dir_fd)
            except OSError:
                pass
        else:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass


def _empty_tmpfs(path: str) -> str | None:
    """Empties the tmpfs at ``path``; returns what is left when that failed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    try:
        _purge(fd)
        left = os.listdir(fd)
        vfs = os.fstatvfs(fd)
    finally:
        os.close(fd)
    if left:
        return f"{path} still holds {sorted(left)[:5]}"
    if vfs.f_bfree != vfs.f_blocks:
        return f"{path} still uses {(vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize} bytes"
    return None


def _remove_ipc() -> str | None:
    """Removes every SysV IPC object and POSIX message queue of the container's IPC namespace
    (the program created them all as this uid, so their creator may remove them whatever their
    mode); returns what is left when that failed."""
    try:
        left = isolation.remove_sysv_ipc() if isolation.sysv_ipc_in_use() else {}
    except OSError as exc:
        return f"SysV IPC cannot be listed: {exc}"
    if left:
        return f"SysV IPC objects remain: {left}"
    try:
        for name in os.listdir("/dev/mqueue"):
            try:
                os.unlink(os.path.join("/dev/mqueue", name))
            except OSError:
                pass
        queues = os.listdir("/dev/mqueue")
    except OSError as exc:
        return f"POSIX message queues cannot be listed (/dev/mqueue: {exc.strerror})"
    return f"POSIX message queues remain: {queues[:5]}" if queues else None


def reset_container() -> str | None:
    """Between two executions in one container: kills leftovers, empties /tmp and /dev/shm, removes
    IPC objects, checks that no socket is left, and verifies all of it. Returns why the container is
    not clean, or None."""
    if not sweep():
        return "processes of the previous execution could not be killed"
    problems = [p for p in (_empty_tmpfs("/tmp"), _empty_tmpfs("/dev/shm"), _remove_ipc(), isolation.sockets_left()) if p]
    return "; ".join(problems) or None


def reaper() -> NoReturn:
    """PID 1 of a sandbox container: reaps orphans (killed leftovers must not stay zombies, which
    would count against the container's process limit)."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    isolation.prctl(isolation.PR_SET_DUMPABLE, 0)  # not ptrace-able by the sandboxed code (same uid)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # pending until sigtimedwait: no lost wakeup
    while True:
        reap_exited()
        signal.sigtimedwait([signal.SIGCHLD], 1.0)
