"""How the sandbox worker isolates one execution: namespaces, mounts, capabilities, seccomp.

Part of the worker program (``_worker.py``, which loads this file from its own directory): the
standard library only, run by the sandbox's interpreter, never imported by the host.

:func:`fresh_namespaces` gives a prepared child (bwrap, where the worker holds capabilities in its
user namespace) its own mount, IPC and UTS namespaces. The worker's view is already
read-only (bwrap's ``--remount-ro`` of ``/`` and ``/dev``; ``/usr`` is a read-only bind), so the
execution's only writable mounts are its own size-capped tmpfs ``/tmp`` and ``/dev/shm``, its
``/proc`` and ``/dev/pts``, all created here and gone with the namespace. The worker checks its
own layout once with :func:`writable_mounts` (nothing writable but ``/proc`` and ``/dev/pts``,
which every execution replaces); each execution's mount namespace is a copy of it.
SysV IPC objects and POSIX message queues live in the IPC namespace: a later execution sees none
of them. The network namespace is the worker's (loopback only; a fresh one per execution costs
the kernel too much under load): :func:`sockets_left` tells the worker when an execution left TCP
state behind, and the host then replaces the worker.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUTS = 0x04000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
IPC_RMID = 0
MSG_INFO, SHM_INFO, SEM_INFO = 12, 14, 19
# The execution's own writable mounts; every other mount must be read-only (device nodes aside).
FRESH_MOUNTS = ("/tmp", "/dev/shm", "/proc", "/dev/pts")

libc = ctypes.CDLL(None, use_errno=True)
_ulong = ctypes.c_ulong


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def prctl(option: int, arg: int = 0) -> int:
    return int(libc.prctl(option, _ulong(arg), _ulong(0), _ulong(0), _ulong(0)))


def bounding_capabilities() -> list[int]:
    """The capabilities in this process's bounding set (read once by the worker)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                mask = int(line.split()[1], 16)
                return [cap for cap in range(64) if mask >> cap & 1]
    return list(range(64))


def drop_capabilities(bounding: list[int]) -> None:
    """Empties the bounding (``bounding`` lists its members), ambient, effective, permitted and
    inheritable sets."""
    for cap in bounding:
        check(prctl(PR_CAPBSET_DROP, cap), f"prctl(PR_CAPBSET_DROP, {cap})")
    libc.prctl(PR_CAP_AMBIENT, _ulong(PR_CAP_AMBIENT_CLEAR_ALL), _ulong(0), _ulong(0), _ulong(0))
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    check(libc.capset(ctypes.byref(header), data), "capset")


def probe_namespaces() -> bool:
    """True when this process may create PID and mount namespaces (bwrap worker with caps)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16) & (1 << 21) != 0  # CAP_SYS_ADMIN
    except OSError:
        return False
    return False


class SeccompFilter:
    """A filter program (``struct sock_filter`` array) held in memory, ready to be installed."""

    def __init__(self, program: bytes) -> None:
        if not program or len(program) % 8:
            raise ValueError(f"seccomp filter: expected a non-empty array of 8-byte instructions, got {len(program)} bytes")
        self._buf = ctypes.create_string_buffer(program, len(program))
        self._prog = _SockFprog(len(program) // 8, ctypes.cast(self._buf, ctypes.c_void_p))

    def install(self) -> None:
        """Installs the filter on the calling (single-threaded) process, after no_new_privs."""
        check(prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(PR_SET_NO_NEW_PRIVS)")
        check(libc.prctl(PR_SET_SECCOMP, _ulong(SECCOMP_MODE_FILTER), ctypes.byref(self._prog), _ulong(0),
                         _ulong(0)), "prctl(PR_SET_SECCOMP)")


def _mount(source: bytes, target: bytes, fstype: bytes, flags: int, data: bytes | None) -> None:
    check(libc.mount(source, target, fstype, _ulong(flags), data), f"mount {fstype.decode()} on {target.decode()}")


def fresh_namespaces(tmp_bytes: int, tmp_inodes: int = 0) -> None:
    """Own mount, IPC and UTS namespaces, with fresh /tmp, /dev/shm (``tmp_bytes`` and, unless 0,
    ``tmp_inodes`` files each), /proc and /dev/pts."""
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS), "unshare(mount, ipc, uts)")
    check(libc.mount(b"none", b"/", None, _ulong(MS_REC | MS_PRIVATE), None), "mount --make-rprivate /")
    size = (f"size={int(tmp_bytes)},mode=1777" + (f",nr_inodes={int(tmp_inodes)}" if tmp_inodes else "")).encode()
    _mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, size)
    _mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, size)
    _mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    _mount(b"devpts", b"/dev/pts", b"devpts", MS_NOSUID | MS_NOEXEC, b"newinstance,ptmxmode=0666,mode=620")


def writable_mounts(allowed: tuple[str, ...]) -> list[str]:
    """Mount points writable here other than ``allowed`` and device nodes (``/dev/null`` and the
    like: a device, not a place to leave files)."""
    with open("/proc/self/mountinfo") as f:
        rows = [line.split() for line in f]
    found = []
    for row in rows:
        point = row[4].replace("\\040", " ")
        if "rw" not in row[5].split(",") or point in allowed:
            continue
        try:
            if stat.S_ISCHR(os.stat(point).st_mode):
                continue
        except OSError:
            pass
        found.append(point)
    return found


def close_fds_except(keep: tuple[int, ...]) -> None:
    """Closes every fd but ``keep`` (``close_range`` where the kernel has it)."""
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(os.sysconf("SC_OPEN_MAX"), 1 << 16))


def supervise(wait_fd: int) -> None:
    """Forks the program's process; this process stays PID 1 of the execution's namespace.

    The program then behaves like an ordinary process (default signal actions apply to it, which
    the kernel would ignore for a namespace's init; ``getpid()`` is not 1). PID 1 waits for it,
    ends the execution (see :func:`_end_execution`), writes the program's wait status to
    ``wait_fd`` and exits.
    """
    prctl(PR_SET_DUMPABLE, 0)  # the program (same uid, no capabilities) cannot ptrace PID 1
    pid = os.fork()
    if pid == 0:
        prctl(PR_SET_DUMPABLE, 1)
        os.close(wait_fd)
        return
    close_fds_except((0, 1, 2, wait_fd))
    _, status = os.waitpid(pid, 0)
    _end_execution()
    os.write(wait_fd, str(status).encode())
    os._exit(0)


def _end_execution() -> None:
    """PID 1 of an execution, once the program has exited: kills what it left, then removes its SysV
    IPC objects. The kernel frees a dead IPC namespace only later, from a work queue; this way the
    memory they hold is given back before the result goes out (the segments a killed process still
    has attached go when it is gone, before this namespace's PID 1 can be reaped)."""
    try:
        os.kill(-1, signal.SIGKILL)  # from a namespace's init: every other process of the namespace
    except OSError:
        pass
    try:
        if sysv_ipc_in_use():
            remove_sysv_ipc()
    except OSError:
        pass


def sysv_ipc_in_use() -> bool:
    """Whether this IPC namespace holds any SysV segment, semaphore set or message queue (three
    ``*_INFO`` calls, cheaper than reading ``/proc/sysvipc``)."""
    buf = ctypes.create_string_buffer(256)
    counts = []
    for call, args, index in ((libc.shmctl, (0, SHM_INFO, buf), 0), (libc.semctl, (0, 0, SEM_INFO, buf), 7),
                              (libc.msgctl, (0, MSG_INFO, buf), 0)):
        if call(*args) < 0:
            return True  # cannot tell: look at /proc/sysvipc
        counts.append(struct.unpack_from("=10i", buf.raw)[index])
    return any(counts)


def sockets_left() -> str | None:
    """A network namespace outlives the processes of an execution (the worker's, the container's):
    a TCP socket still counted once they are gone (``TIME_WAIT``, an orphaned connection) would be
    there for the next one. Reads this namespace's counters in ``/proc/net/sockstat{,6}`` (cheap;
    ``/proc/net/tcp`` walks every namespace's sockets). Returns what is left, or None."""
    counts: dict[str, int] = {}
    for name, prefix in (("sockstat", "TCP:"), ("sockstat6", "TCP6:")):
        try:
            with open(f"/proc/net/{name}") as f:
                for line in f:
                    if line.startswith(prefix):
                        fields = line.split()[1:]
                        for key, value in zip(fields[::2], fields[1::2], strict=False):
                            if key in ("inuse", "tw"):
                                counts[f"{prefix[:-1]} {key}"] = int(value)
        except (OSError, ValueError):
            continue
    left = {k: v for k, v in counts.items() if v > 0}
    return f"TCP sockets remain in the network namespace: {left}" if left else None


def sysv_ipc_ids() -> dict[str, list[int]]:
    """The ids of this IPC namespace's SysV shared memory segments, semaphore sets and message queues."""
    ids: dict[str, list[int]] = {}
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as f:
            ids[kind] = [int(line.split()[1]) for line in list(f)[1:] if line.strip()]
    return ids


def remove_sysv_ipc() -> dict[str, list[int]]:
    """Removes every SysV IPC object this uid may remove (its creator may, whatever the object's
    mode); returns those that remain."""
    for kind, ids in sysv_ipc_ids().items():
        for ipc_id in ids:
            if kind == "shm":
                libc.shmctl(ipc_id, IPC_RMID, None)
            elif kind == "sem":
                libc.semctl(ipc_id, 0, IPC_RMID)
            else:
                libc.msgctl(ipc_id, IPC_RMID, None)
    return {kind: ids for kind, ids in sysv_ipc_ids().items() if ids}
