"""A workspace's Python kernel: one long-lived interpreter whose variables persist across cells.

Runs inside the workspace's sandbox (``/usr/bin/python3 -I -S /opt/agentrl/kernel.py``), standard
library only, never imported by the host. Two processes:

- the *supervisor* (this program's first process) holds the channel to the host: requests on fd 0
  and answers on fd 1, each framed as a 4-byte big-endian length + JSON,
  ``{"code", "timeout_s", "max_output_bytes", "nonce"}`` in and ``{"nonce", "stdout", "stderr"
  (base64, capped), "stdout_bytes", "stderr_bytes", "exception", "timed_out", "duration_s"}`` (or
  ``{"nonce", "died"}``, ``{"nonce", "broken"}``) out. It runs no user code, is not dumpable (a
  process of the same uid can neither ptrace it nor open its ``/proc/<pid>/fd``), and the
  interpreter does not inherit that channel: no cell can write a frame the host reads;
- the *interpreter* (a forked child) runs the cells. Its fds 1 and 2 are pipes the supervisor reads
  while a cell runs (the first ``max_output_bytes`` of each kept, the rest counted: a flood costs no
  memory), subprocesses of a cell included; nothing is written to ``/tmp``, so a full ``/tmp`` does
  not stop a kernel. After each cell it sends a small status frame (exception, timed out) carrying
  the supervisor's per-cell nonce on its own pipe. A cell can write there too, and so can lie to
  itself about its status, never about its output: the supervisor reads at most
  :data:`STATUS_CAP` bytes a frame, skips frames of other cells, and answers ``broken`` for a frame
  that is not one (the host then restarts the kernel).

A cell runs like a notebook cell (the value of a final bare expression is printed; a traceback shows
only the cell's frames). A cell past ``timeout_s`` gets :class:`CellTimeout` (a ``BaseException``,
so ``except Exception`` does not swallow it) from a ``SIGALRM`` timer; one that does not stop then (a
loop inside C code, a handler that ignores it) is killed by the host, which restarts the kernel.
Memory is capped per kernel (a cgroup around the whole sandbox on bwrap, ``--memory`` as
``RLIMIT_AS`` on the interpreter where there is none), never per cell. The seccomp filter
(``--seccomp=<base64>``) is installed before the interpreter starts.
"""

from __future__ import annotations

import ast
import base64
import builtins
import ctypes
import fcntl
import io
import json
import linecache
import os
import resource
import secrets
import select
import signal
import struct
import sys
import time
import traceback
from typing import Any, NoReturn

CELL = "<cell>"
STATUS_CAP = 4096  # bytes of one status frame from the interpreter
MAX_STRAY = 256  # status frames of other cells skipped in one cell before the channel counts as broken
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
# the interpreter's fds: stdin (/dev/null), stdout and stderr (pipes), requests in, status out
FD_REQUEST, FD_STATUS = 3, 4


class CellTimeout(BaseException):
    """The cell ran past its time limit."""


def _alarm(signum: int, frame: Any) -> None:
    raise CellTimeout("the cell ran past its time limit")


def _prctl(option: int, arg: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(fd: int, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


# --------------------------------------------------------------------------- the interpreter's side


class Interpreter:
    """The cells' namespace; runs in the interpreter process only."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        signal.signal(signal.SIGALRM, _alarm)
        self.pipes = [os.dup(1), os.dup(2)]  # (a cell that closes or redirects fd 1 or 2 breaks only itself)
        for fd in self.pipes:
            os.set_inheritable(fd, False)
        self.cells = 0

    def _wire(self) -> None:
        """fds 1 and 2, and sys.stdout/stderr, on the output pipes again."""
        for fd, target in zip(self.pipes, (1, 2), strict=True):
            os.dup2(fd, target)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)

    def run(self, code: str, timeout_s: float) -> dict[str, Any]:
        self.cells += 1
        try:
            self._wire()
        except OSError:
            pass  # (the cell before closed the kept pipes too: its output is lost, its status is not)
        name = f"<cell {self.cells}>"
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        started = time.monotonic()
        exception = None
        timed_out = False
        signal.setitimer(signal.ITIMER_REAL, max(timeout_s, 0.001))
        try:
            try:
                self._exec(code, name)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except CellTimeout:
            timed_out = True
            exception = "CellTimeout"
            print(f"CellTimeout: the cell ran past its time limit of {timeout_s:g} s; the kernel keeps its "
                  "variables", file=sys.stderr)
        except SystemExit as exc:
            exception = "SystemExit"
            print(f"SystemExit({exc.code!r}) ignored: the kernel keeps running", file=sys.stderr)
        except BaseException as exc:
            exception = type(exc).__name__
            tb = exc.__traceback__
            while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
                tb = tb.tb_next  # the kernel's own frames are not the model's business
            try:
                traceback.print_exception(type(exc), exc, tb)
            except BaseException:
                try:
                    print("(error while formatting the traceback)", file=sys.stderr)
                except BaseException:
                    pass  # (the cell closed its stderr: its status still goes out)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        return {"exception": exception, "timed_out": timed_out, "duration_s": round(time.monotonic() - started, 6)}

    def _exec(self, code: str, name: str) -> None:
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
        exec(compile(tree, name, "exec"), self.namespace)
        if last is not None:
            value = eval(compile(last, name, "eval"), self.namespace)
            if value is not None:
                print(repr(value))


def _interpreter(options: dict[str, str]) -> NoReturn:
    """The interpreter process's life: set up, report ready, run cells until its requests end."""
    code = 0
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # it never outlives its supervisor
        _prctl(PR_SET_DUMPABLE, 1)
        for fd in (FD_REQUEST, FD_STATUS):
            os.set_inheritable(fd, False)  # a subprocess of a cell holds neither
        try:
            import site
            site.main()  # -S skipped it: the interpreter's dist-packages are importable by cells
        except Exception:
            pass
        os.chdir(options.get("cwd", "/work"))
        sys.path.insert(0, os.getcwd())  # as in a notebook: the workspace's own modules import
        memory, max_files = int(options.get("memory", 0)), int(options.get("max-files", 0))
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if max_files:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        sys.argv = [CELL]
        interpreter = Interpreter()
        _send(FD_STATUS, {"ready": True, "python": sys.version.split()[0]})
        while True:
            head = _read_exact(FD_REQUEST, 4)
            body = _read_exact(FD_REQUEST, struct.unpack(">I", head)[0]) if head is not None else None
            if body is None:
                break
            request = json.loads(body)
            status = interpreter.run(str(request["code"]), float(request["timeout_s"]))
            _send(FD_STATUS, {"nonce": request["nonce"], **status})
    except BaseException:
        code = 70
    os._exit(code)


# --------------------------------------------------------------------------- the supervisor's side


class _Capture:
    """Keeps the first ``cap`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.total = cap, 0
        self.kept = bytearray()

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]


class Supervisor:
    """Starts the interpreter and relays cells to it (see the module doc)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.status = bytearray()
        self.ended: set[int] = set()  # output pipes at their end (every writer closed them)
        self.pid = self.pidfd = self.request = self.status_fd = self.out = self.err = -1

    def start(self) -> dict[str, Any]:
        """Forks the interpreter; returns its ready frame (or raises ``RuntimeError``)."""
        req_r, req_w = os.pipe()
        st_r, st_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            sources = [os.open("/dev/null", os.O_RDONLY), out_w, err_w, req_r, st_w]
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in sources]  # no dup2 below clobbers a source
            for target, fd in enumerate(high):
                os.dup2(fd, target)
            os.closerange(FD_STATUS + 1, max(os.sysconf("SC_OPEN_MAX"), 1 << 16))  # the host's channel too
            _interpreter(self.options)
        for fd in (req_r, st_w, out_w, err_w):
            os.close(fd)
        self.pid, self.request, self.status_fd, self.out, self.err = pid, req_w, st_r, out_r, err_r
        for fd in (st_r, out_r, err_r):
            os.set_blocking(fd, False)
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = -1
        ready = self._next_status(None, {}, 30.0)
        if not isinstance(ready, dict) or not ready.get("ready"):
            raise RuntimeError(f"the interpreter did not start: {ready}")
        return ready

    def _exited(self) -> str | None:
        """How the interpreter ended, or ``None`` while it runs."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return "gone"
        if pid == 0:
            return None
        if os.WIFSIGNALED(status):
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        return f"exit status {os.WEXITSTATUS(status)}"

    def _wait_exit(self, wait_s: float) -> str | None:
        """How the interpreter ended, waiting up to ``wait_s`` for it; ``None`` if it still runs."""
        deadline = time.monotonic() + wait_s
        while (how := self._exited()) is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return how

    def _frame(self) -> dict[str, Any] | str | None:
        """The next complete status frame in the buffer, ``None`` if there is none yet, or a string
        saying why the bytes there are not a frame."""
        if len(self.status) < 4:
            return None
        size = struct.unpack(">I", self.status[:4])[0]
        if size > STATUS_CAP:
            return f"a status frame of {size} bytes (at most {STATUS_CAP})"
        if len(self.status) < 4 + size:
            return None
        body = bytes(self.status[4:4 + size])
        del self.status[:4 + size]
        try:
            data = json.loads(body)
        except ValueError:
            return f"a status frame that is not JSON: {body[:60]!r}"
        return data if isinstance(data, dict) else f"a status frame that is not an object: {body[:60]!r}"

    def _read_status(self) -> bool:
        """Appends what the status pipe holds now to the buffer; False at its end."""
        while True:
            try:
                chunk = os.read(self.status_fd, 1 << 16)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self.status += chunk
            if len(self.status) > 4 * STATUS_CAP:
                return True  # enough to judge: _frame() refuses or consumes it

    def _next_status(self, nonce: str | None, captures: dict[int, _Capture], wait_s: float | None) -> Any:
        """Reads output into ``captures`` until the status frame of cell ``nonce`` (``None``: any)
        arrives; returns it, or ``("died", how)`` or ``("broken", why)``."""
        stray = 0
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            while (frame := self._frame()) is not None:
                if isinstance(frame, str):
                    return ("broken", frame)
                if nonce is None or frame.get("nonce") == nonce:
                    return frame
                stray += 1  # a frame the cell wrote, or one of an earlier cell: not this cell's status
                if stray > MAX_STRAY:
                    return ("broken", f"more than {MAX_STRAY} status frames of other cells")
            watch = [self.status_fd, *(fd for fd in captures if fd not in self.ended)]
            watch += [self.pidfd] if self.pidfd >= 0 else []
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = 0.05 if self.pidfd < 0 else left
            ready, _, _ = select.select(watch, [], [], wait if left is None or wait is None else min(wait, left))
            for fd in ready:
                if fd in captures:
                    self._pump(fd, captures[fd])
            if self.status_fd in ready and not self._read_status():
                how = self._wait_exit(1.0)  # (a killed process's pipes close before it can be waited for)
                return ("died", how) if how else ("broken", "the cell closed the kernel's status channel")
            if self.pidfd in ready or self.pidfd < 0:
                how = self._exited()
                if how is not None:
                    self._read_status()  # a last frame written before the end
                    frame = self._frame()
                    if isinstance(frame, dict) and frame.get("nonce") == nonce and nonce is not None:
                        return frame
                    return ("died", how)
            if deadline is not None and time.monotonic() >= deadline:
                return ("broken", "no status frame in time")

    def _pump(self, fd: int, capture: _Capture | None) -> None:
        """Reads what ``fd`` holds now (into ``capture``, or nowhere)."""
        while fd not in self.ended:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            if not data:
                self.ended.add(fd)  # (never watched again: it would always be ready)
                return
            if capture is not None:
                capture.feed(data)

    def cell(self, request: dict[str, Any]) -> dict[str, Any]:
        """Runs one cell of the host's ``request``; returns the answer frame's fields."""
        cap = int(request.get("max_output_bytes") or 65536)
        for fd in (self.out, self.err):
            self._pump(fd, None)  # what background work wrote between cells is not this cell's
        nonce = secrets.token_hex(8)
        try:
            _send(self.request, {"code": str(request["code"]), "timeout_s": float(request.get("timeout_s") or 30.0),
                                 "nonce": nonce})
        except OSError:
            return {"died": self._exited() or "its request pipe closed"}
        captures = {self.out: _Capture(cap), self.err: _Capture(cap)}
        status = self._next_status(nonce, captures, None)
        for fd, capture in captures.items():
            self._pump(fd, capture)
        if isinstance(status, tuple):
            return {status[0]: status[1]}
        exception, duration = status.get("exception"), status.get("duration_s")
        return {"stdout": base64.b64encode(captures[self.out].kept).decode("ascii"),
                "stderr": base64.b64encode(captures[self.err].kept).decode("ascii"),
                "stdout_bytes": captures[self.out].total, "stderr_bytes": captures[self.err].total,
                "exception": exception[:200] if isinstance(exception, str) else None,
                "timed_out": status.get("timed_out") is True,
                "duration_s": float(duration) if isinstance(duration, (int, float)) else 0.0}


def main(argv: list[str]) -> None:
    options = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    try:
        os.setsid()  # its own process group: what its cells start is killed with it
    except OSError:
        pass
    _prctl(PR_SET_DUMPABLE, 0)  # the interpreter (same uid) can neither ptrace this nor open its fds
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if options.get("seccomp"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _worker_isolation as isolation

        isolation.SeccompFilter(base64.b64decode(options["seccomp"])).install()
        sys.path.pop(0)
    supervisor = Supervisor(options)
    ready = supervisor.start()
    _send(proto_out, {"ready": True, "pid": os.getpid(), "python": ready.get("python")})
    while True:
        head = _read_exact(proto_in, 4)
        body = _read_exact(proto_in, struct.unpack(">I", head)[0]) if head is not None else None
        if body is None:
            return
        request = json.loads(body)
        answer = supervisor.cell(request)
        _send(proto_out, {"nonce": request.get("nonce"), **answer})
        if "died" in answer or "broken" in answer:
            return  # the host restarts the kernel


if __name__ == "__main__":
    main(sys.argv[1:])
