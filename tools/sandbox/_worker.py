"""The program that runs inside a sandbox and executes code, one fork per execution.

It runs under the sandbox's own interpreter (``/usr/bin/python3 -I -S``), so it uses the standard
library only and is not imported by the host. Two modes:

``serve`` (bwrap and local pools)
    A long-lived worker reading requests from stdin and writing results to stdout, each framed as
    a 4-byte big-endian length plus a JSON object. A crash or hang of one execution never takes the
    worker down: every execution is a forked child.
``once`` (Docker)
    One request read from the base64 JSON arguments, one result written to stdout.

Per execution the child, when the worker holds capabilities in its user namespace (bwrap), becomes
PID 1 of a fresh PID namespace (so every process the program starts dies with it and nothing in it
can see or signal the worker), gets a fresh mount namespace with a private, size-capped tmpfs
``/tmp`` and its own ``/proc``, drops every capability and forks the program's process, whose
wait status it reports. Without capabilities (Docker, local) it falls back to a new session plus,
where the worker owns its PID namespace (never in ``local`` mode), a sweep of leftover processes.
Limits on CPU time, address space, processes and file size are rlimits set in the program's
process; wall time and output size are enforced here by the parent.

Result fields: ``stdout``/``stderr`` (base64 of the first ``max_output_bytes`` of each stream),
``stdout_bytes``/``stderr_bytes`` (total sizes), ``exit_code`` (``None`` when killed by a signal),
``signal``, ``timed_out``, ``killed_reason`` (``timeout``, ``cpu_time``, ``signal`` or ``None``),
``exception`` (class name of an uncaught Python exception), ``cpu_s`` and ``duration_s``.
"""

from __future__ import annotations

import ast
import base64
import builtins
import ctypes
import io
import json
import linecache
import os
import resource
import select
import signal
import struct
import sys
import time
import traceback
from typing import Any, NoReturn

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_NOSUID = 0x2
MS_NODEV = 0x4
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CELL = "<cell>"
EXIT_EXCEPTION = 1

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _drop_capabilities() -> None:
    """Empties the bounding, ambient, effective, permitted and inheritable sets."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _probe_namespaces() -> bool:
    """True when this process may create PID and mount namespaces (bwrap worker with caps)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16) & (1 << 21) != 0  # CAP_SYS_ADMIN
    except OSError:
        return False
    return False


# --------------------------------------------------------------------------- child side


def _set_limits(req: dict[str, Any]) -> None:
    cpu = req.get("cpu_s")
    if cpu:
        # soft == hard: SIGKILL at the limit (SIGXCPU alone is ignored by a PID-namespace init)
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu)))
    for key, res in (("address_space_bytes", resource.RLIMIT_AS), ("max_processes", resource.RLIMIT_NPROC),
                     ("max_file_bytes", resource.RLIMIT_FSIZE), ("max_open_files", resource.RLIMIT_NOFILE)):
        value = req.get(key)
        if value:
            resource.setrlimit(res, (int(value), int(value)))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _enter_private_mounts(tmp_bytes: int) -> None:
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    opts = f"size={int(tmp_bytes)},mode=1777".encode()
    _check(_libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount tmpfs /tmp")
    _check(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV, None), "mount proc /proc")


def _run_python(code: str, status_fd: int) -> int:
    """Runs ``code`` like a notebook cell; returns the exit code. Output goes to fds 1 and 2."""
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.argv = [CELL]
    linecache.cache[CELL] = (len(code), None, code.splitlines(True), CELL)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    status = 0
    try:
        tree = ast.parse(code, CELL, "exec")
        last = None
        final = tree.body[-1] if tree.body else None
        if isinstance(final, ast.Expr):
            tree.body.pop()
            last = ast.Expression(final.value)
        exec(compile(tree, CELL, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, CELL, "eval"), namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        status = EXIT_EXCEPTION
        try:
            os.write(status_fd, type(exc).__name__.encode("ascii", "replace")[:200])
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != CELL:
                tb = tb.tb_next  # hide the worker's own frames: the user sees only <cell> and below
            traceback.print_exception(type(exc), exc, tb)
        except BaseException:
            os.write(2, b"\n(error while formatting the traceback)\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status


def _close_fds_except(keep: tuple[int, ...]) -> None:
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:  # e.g. the directory listing's own fd, already closed
                pass


def _supervise(wait_fd: int) -> None:
    """Forks the program's process; this process stays PID 1 of the execution's namespace.

    The program then behaves like an ordinary process (default signal actions apply to it, which
    the kernel would ignore for a namespace's init; ``getpid()`` is not 1). PID 1 waits for it,
    writes its wait status to ``wait_fd`` and exits, which kills whatever the program left behind.
    """
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program (same uid, no capabilities) cannot ptrace PID 1
    pid = os.fork()
    if pid == 0:
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        os.close(wait_fd)
        return
    _close_fds_except((0, 1, 2, wait_fd))
    _, status = os.waitpid(pid, 0)
    os.write(wait_fd, str(status).encode())
    os._exit(0)


def _child(req: dict[str, Any], fds: dict[str, int], private_ns: bool) -> NoReturn:
    """The forked child: isolates itself, sets limits, wires fds 0-3 and runs the code. Never returns."""
    code = 70
    try:
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        os.setsid()
        if private_ns:
            _enter_private_mounts(int(req.get("tmp_bytes") or 64 << 20))
            _drop_capabilities()
            _supervise(fds["wait"])  # returns in the program's process only
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        devnull = os.open("/dev/null", os.O_RDONLY)
        for target, fd in enumerate((devnull, fds["out"], fds["err"], fds["status"])):
            os.dup2(fd, target)
        _close_fds_except((0, 1, 2, 3))
        workdir = req.get("workdir") or "/tmp"
        os.chdir(workdir)
        _set_limits(req)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        if req.get("language") == "bash":
            path = os.path.join(workdir, ".cell.sh")
            with open(path, "w") as f:
                f.write(req["code"])
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"}
            os.execve("/bin/bash", ["bash", path], env)
        code = _run_python(req["code"], 3)
    except BaseException as exc:
        try:
            os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        except BaseException:
            pass
    os._exit(code)


# --------------------------------------------------------------------------- parent side


class _Capture:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.total, self.kept = cap, 0, 0
        self.chunks: list[bytes] = []

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - self.kept
        if room > 0:
            self.chunks.append(data[:room])
            self.kept += min(room, len(data))

    def b64(self) -> str:
        return base64.b64encode(b"".join(self.chunks)).decode("ascii")


def _drain(readers: list[int], captures: dict[int, _Capture], deadline: float, pidfd: int | None,
           pid: int) -> bool:
    """Reads the child's pipes until the child has exited and its pipes are closed (or 50 ms after
    its exit, for pipes a killed grandchild held); False when the deadline passed first."""
    exited_at = None
    while True:
        now = time.monotonic()
        if exited_at is None and pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
            exited_at = now
        if exited_at is not None and (not readers or now >= exited_at + 0.05):
            return True
        if now >= deadline:
            return False
        wait = deadline - now
        if exited_at is not None:
            wait = min(wait, exited_at + 0.05 - now)
        if pidfd is None:
            wait = min(wait, 0.02)
        watch = list(readers) + ([pidfd] if pidfd is not None and exited_at is None else [])
        if not watch:
            time.sleep(wait)
            continue
        ready, _, _ = select.select(watch, [], [], wait)
        for fd in ready:
            if fd == pidfd:
                exited_at = time.monotonic()
                continue
            data = os.read(fd, 1 << 16)
            if data:
                captures[fd].feed(data)
            else:
                readers.remove(fd)


def _clear_dir(path: str) -> None:
    """Removes everything in ``path`` (the container's /tmp between executions)."""
    import shutil

    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        full = os.path.join(path, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            try:
                os.unlink(full)
            except OSError:
                pass


def _tree_cpu(pid: int) -> float:
    """CPU seconds used so far by ``pid`` and its descendants (from /proc)."""
    total, stack, tick = 0.0, [pid], os.sysconf("SC_CLK_TCK")
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def _alive(pid: int | str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _reap_exited() -> None:
    """Reaps every child that has exited, without blocking."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _sweep() -> None:
    """Kills every process of this PID namespace except PID 1 and this worker (isolated modes only),
    and waits (up to 2 s) until PID 1 has reaped them all."""
    me = os.getpid()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        present = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not present:
            return
        others = [p for p in present if _alive(p)]
        if not others:
            time.sleep(0.002)  # zombies: PID 1 reaps them
            continue
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap_exited()
        time.sleep(0.002)


def execute(req: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """Runs one request in a forked child and returns the result dict."""
    start = time.monotonic()
    cap = int(req.get("max_output_bytes") or 65536)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    st_r, st_w = os.pipe()
    wait_r, wait_w = os.pipe()
    private_ns = state["namespaces"]
    if private_ns:
        _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    pid = os.fork()
    if pid == 0:
        _child(req, {"out": out_w, "err": err_w, "status": st_w, "wait": wait_w}, private_ns)
    if private_ns:  # the worker's next fork must again start from its own PID namespace
        _check(_libc.setns(state["pidns_fd"], CLONE_NEWPID), "setns(CLONE_NEWPID)")
    for fd in (out_w, err_w, st_w, wait_w):
        os.close(fd)
    captures = {out_r: _Capture(cap), err_r: _Capture(cap), st_r: _Capture(256)}
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            pidfd = None
    deadline = start + float(req.get("timeout_s") or 10.0)
    finished = _drain([out_r, err_r, st_r], captures, deadline, pidfd, pid)
    timed_out = not finished
    tree_cpu = _tree_cpu(pid) if timed_out else 0.0  # before the kill: the program's own CPU time
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    _, status, usage = os.wait4(pid, 0)
    waited = os.read(wait_r, 64) if private_ns and not timed_out else b""
    if waited:  # the program's own status, reported by the namespace's PID 1
        status = int(waited)
    if not private_ns:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if state["sweep"]:
            _sweep()
            _clear_dir(req.get("workdir") or "/tmp")
    for fd in (out_r, err_r, st_r, wait_r) + ((pidfd,) if pidfd is not None else ()):
        os.close(fd)
    cpu_s = max(usage.ru_utime + usage.ru_stime, tree_cpu)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    reason = None
    if timed_out:
        reason = "timeout"
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and req.get("cpu_s") and cpu_s >= 0.85 * float(req["cpu_s"])):
        # (rusage can read a little below the kernel's RLIMIT_CPU clock, hence the tolerance)
        reason = "cpu_time"
    elif sig is not None:
        reason = "signal"
    exc_name = b"".join(captures[st_r].chunks).decode("ascii", "replace") or None
    return {
        "stdout": captures[out_r].b64(), "stderr": captures[err_r].b64(),
        "stdout_bytes": captures[out_r].total, "stderr_bytes": captures[err_r].total,
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": sig, "timed_out": timed_out, "killed_reason": reason, "exception": exc_name,
        "cpu_s": round(cpu_s, 4), "duration_s": round(time.monotonic() - start, 6),
    }


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _write_all(fd: int, data: bytes) -> None:
    """Writes all of ``data`` (a pipe takes large writes in parts)."""
    while data:
        data = data[os.write(fd, data):]


def _write_frame(fd: int, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    _write_all(fd, struct.pack(">I", len(data)) + data)


def _own_pid_namespace() -> bool:
    """Moves the worker into a PID namespace owned by its own user namespace; False if impossible.

    bwrap's PID namespace belongs to an outer user namespace, where ``setns`` back into it is not
    permitted. The original process stays behind as a plain waiter and mirrors the worker's exit.
    """
    if _libc.unshare(CLONE_NEWPID) != 0:
        return False
    pid = os.fork()
    if pid == 0:
        return True
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _owns_pid_namespace() -> bool:
    """True inside bwrap (the worker is PID 2 under bwrap's init) or a sandbox container whose PID 1
    is this program's ``reaper``: only there may leftover processes be swept. Never true on a host."""
    if os.getpid() <= 3:
        return True
    try:
        with open("/proc/1/cmdline", "rb") as f:
            return f.read().endswith(b"/worker.py\0reaper\0")
    except OSError:
        return False


def reaper() -> NoReturn:
    """PID 1 of a sandbox container: reaps orphans (killed leftovers must not stay zombies, which
    would count against the container's process limit)."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # not ptrace-able by the sandboxed code (same uid)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # pending until sigtimedwait: no lost wakeup
    while True:
        _reap_exited()
        signal.sigtimedwait([signal.SIGCHLD], 1.0)


def _state(sweep: bool) -> dict[str, Any]:
    # Non-dumpable: code running as the same uid (the Docker backend) cannot ptrace the worker or
    # read its memory; the child makes itself dumpable again.
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    namespaces = _probe_namespaces() and _own_pid_namespace()
    state: dict[str, Any] = {"namespaces": namespaces, "pidns_fd": None,
                             "sweep": sweep and not namespaces and _owns_pid_namespace()}
    if namespaces:
        state["pidns_fd"] = os.open("/proc/self/ns/pid", os.O_RDONLY)
    return state


def serve(sweep: bool) -> None:
    """The request loop of a pooled worker: frames in on fd 0, frames out on fd 1."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    state = _state(sweep)
    _write_frame(proto_out, {"ready": True, "namespaces": state["namespaces"], "pid": os.getpid(),
                             "python": sys.version.split()[0]})
    while True:
        head = _read_exact(proto_in, 4)
        if head is None:
            return
        body = _read_exact(proto_in, struct.unpack(">I", head)[0])
        if body is None:
            return
        req = json.loads(body)
        try:
            result = execute(req, state)
        except Exception as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        _write_frame(proto_out, result)


def once(chunks: list[str], sweep: bool) -> None:
    """Runs the single request carried (base64 JSON, split over arguments) and prints its result."""
    req = json.loads(base64.b64decode("".join(chunks)))
    state = _state(sweep)
    try:
        result = execute(req, state)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    _write_all(1, json.dumps(result).encode())


def main(argv: list[str]) -> None:
    sweep = "--sweep" in argv
    args = [a for a in argv if a != "--sweep"]
    if args and args[0] == "once":
        once(args[1:], sweep)
    elif args and args[0] == "reaper":
        reaper()
    else:
        try:
            import site
            site.main()  # -S skipped it: make the interpreter's dist-packages importable by user code
        except Exception:
            pass
        serve(sweep)


if __name__ == "__main__":
    main(sys.argv[1:])
