"""The program that runs inside a sandbox and executes code, one fork per execution.

It runs under the sandbox's own interpreter (``/usr/bin/python3 -I -S``), so it uses the standard
library only and is not imported by the host; ``_worker_isolation.py`` (namespaces, mounts,
capabilities, seccomp) and ``_worker_container.py`` (the reset of a container between executions)
sit next to it and are loaded from its directory. Two modes:

``serve`` (bwrap and local pools)
    A long-lived worker reading requests from stdin and writing results to stdout, each framed as
    a 4-byte big-endian length plus a JSON object. The worker itself never runs user code: every
    execution is a forked child, so a crash or hang of one never takes the worker down.
``once`` (Docker)
    One request read from the base64 JSON arguments, one result written to stdout.

Every execution is a *prepared child*: forked from the worker, it builds its sandbox, reports
``R`` (ready) on a pipe, waits for its request, sets the request's limits, reports ``G`` (going)
and closes that pipe before the code runs, so the program can never write on it. With namespaces
(bwrap) the child gets fresh mount, IPC, UTS and PID namespaces, drops every capability
and stays PID 1 of its PID namespace while the program runs in a forked process (its exit kills
whatever the program left behind); in ``serve`` mode the next execution's child is prepared while
the current one runs, which keeps the set-up off the critical path. The program's process installs
the seccomp filter given with ``--seccomp=<base64>`` right before the code runs. Without
capabilities (Docker, local) the child only starts a new session; in a container whose PID 1 is
this program's ``reaper``, ``--sweep`` resets the container after every execution. Either way the
result says whether the worker was verified clean afterwards (for bwrap: no TCP state left in the
worker's network namespace).

Result fields, all observed by this supervisor, not by the program: ``stdout``/``stderr`` (base64
of the first ``max_output_bytes`` of each stream), ``stdout_bytes``/``stderr_bytes`` (total sizes),
``exit_code`` (``None`` when killed by a signal), ``signal``, ``timed_out``, ``killed_reason``
(``timeout``, ``cpu_time``, ``signal`` or ``None``), ``cpu_s``, ``duration_s``, ``clean`` and
``unclean`` (why not), ``prepared`` (``ahead`` or ``on_demand``) — except ``claimed_exception``:
the class name the program's own interpreter wrote on fd 3 for an uncaught exception. The program
can write anything there, so it is passed on only with the exit status an uncaught exception gives
(1), and only as the program's claim. ``{"error": ...}`` means the sandbox machinery failed.
"""

from __future__ import annotations

import ast
import base64
import builtins
import fcntl
import gc
import importlib.util
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
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

CLONE_NEWPID = 0x20000000
PR_SET_DUMPABLE = 4
CELL = "<cell>"
EXIT_EXCEPTION = 1
EXIT_SETUP = 70
READY_TIMEOUT_S = 20.0
# fds of the program's process: stdin (/dev/null), stdout, stderr, the exception-name pipe, and
# (until the code starts) the request pipe and the ready pipe.
FD_STATUS, FD_REQUEST, FD_READY = 3, 4, 5


def _sibling(name: str) -> ModuleType:
    """Loads ``name``.py from this program's directory (``-I`` keeps that directory off sys.path)."""
    return _load(name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))


def _load(name: str, path: str) -> ModuleType:
    """Imports the module ``name`` from the file ``path`` (once)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"the worker program's part {path} is missing")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from agentrl.tools.sandbox import _worker_isolation as isolation
else:
    isolation = _sibling("_worker_isolation")


def _container() -> ModuleType:
    return _sibling("_worker_container")


# --------------------------------------------------------------------------- the program's side


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


def script_path(req: dict[str, Any]) -> str:
    """Where a bash program is written: ``/tmp/.cell.sh``, or the request's ``script`` (a name in /tmp:
    a Docker workspace keeps its /tmp across calls, which may run at the same time)."""
    name = str(req.get("script") or ".cell.sh")
    return "/tmp/" + (name if name.replace(".", "").replace("-", "").isalnum() else ".cell.sh")


def _memfd(name: str, data: bytes) -> int:
    """An in-memory file holding ``data``, read from its start, inherited across exec."""
    fd = os.memfd_create(name, 0)
    _write_all(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


def _script(req: dict[str, Any]) -> str:
    """The path bash reads the program from: :func:`script_path` (never the working directory: a
    workspace's files stay the program's own), or an in-memory file where /tmp has no room left (a
    full /tmp must not stop every later command, a cleanup included)."""
    data = str(req["code"]).encode("utf-8", "replace")
    path = script_path(req)
    try:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        return path
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
        return f"/proc/self/fd/{_memfd('cell.sh', data)}"


def _read_to_end(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _wire_fds(fds: dict[str, int]) -> None:
    """fds 0-5 of the program's process (see FD_*); every other fd closed."""
    sources = [os.open("/dev/null", os.O_RDONLY), fds["out"], fds["err"], fds["status"], fds["request"], fds["ready"]]
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in sources]  # so that no dup2 below clobbers a source
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    isolation.close_fds_except(tuple(range(len(high))))


def _tmp(req: dict[str, Any]) -> tuple[int, int]:
    """The size and the inode cap of an execution's /tmp and /dev/shm (0: the kernel's default)."""
    return int(req.get("tmp_bytes") or 64 << 20), int(req.get("tmp_inodes") or 0)


def _prepared_child(fds: dict[str, int], state: dict[str, Any], tmp: tuple[int, int]) -> NoReturn:
    """Builds the execution's sandbox, reports ready, waits for the request and runs it. Never returns."""
    code = EXIT_SETUP
    try:
        isolation.prctl(PR_SET_DUMPABLE, 1)
        os.setsid()
        if state["namespaces"]:
            isolation.fresh_namespaces(*tmp)
            isolation.drop_capabilities(state["bounding"])
            isolation.supervise(fds["wait"])  # returns in the program's process only
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        _wire_fds(fds)
        if state["seccomp"] is not None:
            state["seccomp"].install()
        os.write(FD_READY, b"R")
        req = json.loads(_read_to_end(FD_REQUEST))
        os.close(FD_REQUEST)
        workdir = req.get("workdir") or "/tmp"
        os.chdir(workdir)
        if req.get("stdin") is not None:  # the program's input (a file tool's request): in memory, any size
            os.dup2(_memfd("stdin", base64.b64decode(req["stdin"])), 0)
        path = _script(req) if req.get("language") == "bash" else ""
        _set_limits(req)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        if path:
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8",
                   **{str(k): str(v) for k, v in (req.get("env") or {}).items()}}
            os.write(FD_READY, b"G")
            os.close(FD_READY)
            os.execve("/bin/bash", ["bash", path], env)
        os.write(FD_READY, b"G")
        os.close(FD_READY)  # from here on only the program's own channels remain
        code = _run_python(req["code"], FD_STATUS)
    except BaseException as exc:
        try:
            os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        except BaseException:
            pass
    os._exit(code)


# --------------------------------------------------------------------------- the worker's side


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


def prepare(state: dict[str, Any], tmp: tuple[int, int]) -> dict[str, Any]:
    """Forks a prepared child (see the module doc); returns the worker's ends of its pipes."""
    names = ("out", "err", "status", "request", "ready") + (("wait",) if state["namespaces"] else ())
    pipes = {name: os.pipe() for name in names}
    child_ends = {name: (r if name == "request" else w) for name, (r, w) in pipes.items()}
    if state["namespaces"]:
        isolation.check(isolation.libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    pid = os.fork()
    if pid == 0:
        _prepared_child(child_ends, state, tmp)
    if state["namespaces"]:  # the worker's next fork must again start from its own PID namespace
        isolation.check(isolation.libc.setns(state["pidns_fd"], CLONE_NEWPID), "setns(CLONE_NEWPID)")
    for fd in child_ends.values():
        os.close(fd)
    handle: dict[str, Any] = {name: (w if name == "request" else r) for name, (r, w) in pipes.items()}
    handle.update(pid=pid, tmp=tmp, pidfd=None)
    if hasattr(os, "pidfd_open"):
        try:
            handle["pidfd"] = os.pidfd_open(pid)
        except OSError:
            pass
    return handle


def _close_handle(handle: dict[str, Any]) -> None:
    for name in ("out", "err", "status", "request", "ready", "wait", "pidfd"):
        fd = handle.get(name)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _discard(handle: dict[str, Any]) -> str:
    """Kills a prepared child that will not be used; returns what it wrote on stderr."""
    for kill in (os.killpg, os.kill):
        try:
            kill(handle["pid"], signal.SIGKILL)
        except OSError:
            pass
    os.waitpid(handle["pid"], 0)
    os.set_blocking(handle["err"], False)
    try:
        message = os.read(handle["err"], 4096).decode("utf-8", "replace").strip()
    except OSError:
        message = ""
    _close_handle(handle)
    return message


def _take_prepared(state: dict[str, Any], tmp: tuple[int, int]) -> tuple[dict[str, Any], str]:
    """A prepared child that has reported ready (set up now if none is waiting)."""
    reason = ""
    for _ in range(2):
        handle = state.pop("prepared", None)
        how = "ahead"
        if handle is not None and handle["tmp"] != tmp:
            _discard(handle)
            handle = None
        if handle is None:
            handle, how = prepare(state, tmp), "on_demand"
        ready, _, _ = select.select([handle["ready"]], [], [], READY_TIMEOUT_S)
        if ready and os.read(handle["ready"], 1) == b"R":
            return handle, how
        reason = _discard(handle) or "the execution's sandbox did not get ready"
    raise RuntimeError(f"cannot set up the execution's sandbox: {reason}")


def _classify(status: int, timed_out: bool, cpu_s: float, req: dict[str, Any]) -> tuple[int | None, str | None]:
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    reason = None
    if timed_out:
        reason = "timeout"
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and req.get("cpu_s") and cpu_s >= 0.85 * float(req["cpu_s"])):
        # (rusage can read a little below the kernel's RLIMIT_CPU clock, hence the tolerance)
        reason = "cpu_time"
    elif sig is not None:
        reason = "signal"
    return sig, reason


def execute(req: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """Runs one request in a prepared child and returns the result dict."""
    handle, how = _take_prepared(state, _tmp(req))
    start = time.monotonic()
    pid = handle["pid"]
    try:
        _write_all(handle["request"], json.dumps(req).encode())
    except OSError:
        pass  # the child died after reporting ready: its status below says how
    os.close(handle.pop("request"))
    cap = int(req.get("max_output_bytes") or 65536)
    out_r, err_r, st_r, ready_r = handle["out"], handle["err"], handle["status"], handle["ready"]
    captures = {out_r: _Capture(cap), err_r: _Capture(cap), st_r: _Capture(4096), ready_r: _Capture(8)}
    deadline = start + float(req.get("timeout_s") or 10.0)
    timed_out = not _drain([out_r, err_r, st_r, ready_r], captures, deadline, handle["pidfd"], pid)
    tree_cpu = _tree_cpu(pid) if timed_out else 0.0  # before the kill: the program's own CPU time
    if timed_out:
        for kill in (os.killpg, os.kill):  # PID 1 of the execution's namespace: its death kills the rest
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
    _, status, usage = os.wait4(pid, 0)
    if state["namespaces"] and not timed_out:
        waited = os.read(handle["wait"], 64)
        if waited:  # the program's own status, reported by the namespace's PID 1
            status = int(waited)
    unclean = isolation.sockets_left() if state["namespaces"] else None  # the worker's network namespace
    if not state["namespaces"]:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        if req.get("language") == "bash":  # (with namespaces, the execution's own /tmp is gone already)
            try:
                os.unlink(script_path(req))
            except OSError:
                pass
        if state["sweep"]:
            unclean = _container().reset_container()
    _close_handle(handle)
    if b"G" not in b"".join(captures[ready_r].chunks):
        message = base64.b64decode(captures[err_r].b64()).decode("utf-8", "replace").strip()
        return {"error": f"the execution's sandbox failed before the code ran: {message or 'no message'}"}
    cpu_s = max(usage.ru_utime + usage.ru_stime, tree_cpu)
    sig, reason = _classify(status, timed_out, cpu_s, req)
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    channel = b"".join(captures[st_r].chunks)
    claim = channel[:200].decode("ascii", "replace") or None
    bash = req.get("language") == "bash"
    return {
        "stdout": captures[out_r].b64(), "stderr": captures[err_r].b64(),
        "stdout_bytes": captures[out_r].total, "stderr_bytes": captures[err_r].total,
        "exit_code": exit_code, "signal": sig, "timed_out": timed_out, "killed_reason": reason,
        "claimed_exception": claim if exit_code == EXIT_EXCEPTION and not bash else None,
        # what a bash program wrote on fd 3 (a workspace's shell reports its working directory there)
        "channel": channel.decode("utf-8", "replace") if bash else None,
        "cpu_s": round(cpu_s, 4), "duration_s": round(time.monotonic() - start, 6),
        "clean": unclean is None, "unclean": unclean, "prepared": how,
    }


# --------------------------------------------------------------------------- a container between executions


# --------------------------------------------------------------------------- protocol and modes


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
    if isolation.libc.unshare(CLONE_NEWPID) != 0:
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


def _state(sweep: bool, seccomp: bytes | None, ahead: bool, writable: tuple[str, ...] = ()) -> dict[str, Any]:
    # Non-dumpable: code running as the same uid (the Docker backend) cannot ptrace the worker or
    # read its memory; the child makes itself dumpable again.
    isolation.prctl(PR_SET_DUMPABLE, 0)
    namespaces = isolation.probe_namespaces() and _own_pid_namespace()
    state: dict[str, Any] = {"namespaces": namespaces, "pidns_fd": None, "bounding": [], "layout_error": None,
                             "seccomp": isolation.SeccompFilter(seccomp) if seccomp else None,
                             "sweep": sweep and not namespaces and _owns_pid_namespace(),
                             "ahead": ahead and namespaces}
    if namespaces:
        state["pidns_fd"] = os.open("/proc/self/ns/pid", os.O_RDONLY)
        state["bounding"] = isolation.bounding_capabilities()
        # Each execution's mount namespace copies this one and replaces /proc and /dev/pts (and mounts
        # its own /tmp and /dev/shm): nothing else may be writable, but a workspace (``--writable=``),
        # which is meant to keep one episode's files from one call to the next.
        extra = isolation.writable_mounts(("/proc", "/dev/pts", *writable))
        if extra:
            state["layout_error"] = f"writable mounts {extra}: each execution could leave files for the next"
    return state


def serve(sweep: bool, seccomp: bytes | None, writable: tuple[str, ...] = (), preload: tuple[str, ...] = ()) -> None:
    """The request loop of a pooled worker: frames in on fd 0, frames out on fd 1. The ``preload``
    programs are imported now, so every execution finds them loaded."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    for path in preload:
        try:
            _load(os.path.splitext(os.path.basename(path))[0], path)
        except Exception:
            pass  # an execution that needs it imports it itself (and reports why it cannot)
    state = _state(sweep, seccomp, ahead=True, writable=writable)
    gc.freeze()  # the worker's objects stay out of the children's collections (fewer copy-on-write faults)
    _write_frame(proto_out, {"ready": True, "namespaces": state["namespaces"], "pid": os.getpid(),
                             "python": sys.version.split()[0], "seccomp": seccomp is not None,
                             "prepare_ahead": state["ahead"], "layout_error": state["layout_error"]})
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
        if state["ahead"] and "error" not in result:  # the next execution's sandbox, built while idle
            try:
                state["prepared"] = prepare(state, _tmp(req))
            except OSError:
                pass  # the next execution sets its own up (and reports why it cannot)


def once(chunks: list[str], sweep: bool, seccomp: bytes | None) -> None:
    """Runs the single request carried (base64 JSON, split over arguments; ``-``: JSON on stdin, which
    no other process sees) and prints its result."""
    req = json.loads(_read_to_end(0) if chunks == ["-"] else base64.b64decode("".join(chunks)))
    state = _state(sweep, seccomp, ahead=False)
    try:
        if state["layout_error"]:
            raise RuntimeError(state["layout_error"])
        result = execute(req, state)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    _write_all(1, json.dumps(result).encode())


def main(argv: list[str]) -> None:
    sweep = "--sweep" in argv
    seccomp = None
    args: list[str] = []
    writable: list[str] = []
    preload: list[str] = []
    for arg in argv:
        if arg.startswith("--seccomp="):
            seccomp = base64.b64decode(arg.split("=", 1)[1])
        elif arg.startswith("--writable="):
            writable.append(arg.split("=", 1)[1])
        elif arg.startswith("--preload="):
            preload.append(arg.split("=", 1)[1])
        elif arg != "--sweep":
            args.append(arg)
    if args and args[0] == "once":
        once(args[1:], sweep, seccomp)
    elif args and args[0] == "reaper":
        _container().reaper()
    else:
        try:
            import site
            site.main()  # -S skipped it: make the interpreter's dist-packages importable by user code
        except Exception:
            pass
        serve(sweep, seccomp, tuple(writable), tuple(preload))


if __name__ == "__main__":
    main(sys.argv[1:])
