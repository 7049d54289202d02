"""A workspace's Python kernel: one long-lived interpreter whose variables persist across cells.

Runs inside the workspace's sandbox (``/usr/bin/python3 -I -S /opt/agentrl/kernel.py``), standard
library only, never imported by the host. Requests on fd 0 and answers on fd 1 are framed like the
sandbox worker's (4-byte big-endian length + JSON): ``{"code", "timeout_s", "max_output_bytes"}``
in, ``{"stdout", "stderr" (base64, capped), "stdout_bytes", "stderr_bytes", "exception",
"timed_out", "duration_s"}`` out.

A cell runs like a notebook cell (the value of a final bare expression is printed; a traceback shows
only the cell's frames). Its output is whatever reaches fds 1 and 2 while it runs, subprocesses
included: both point at files on the kernel's own tmpfs ``/tmp``, read back after the cell. A cell
past ``timeout_s`` gets :class:`CellTimeout` (a ``BaseException``, so ``except Exception`` does not
swallow it) from a ``SIGALRM`` timer; one that does not stop then (a loop inside C code, a handler
that ignores it) is killed by the host, which restarts the kernel. Memory is capped per kernel (a
cgroup around the whole sandbox on bwrap, ``--memory`` as ``RLIMIT_AS`` where there is none), never
per cell. The seccomp filter (``--seccomp=<base64>``) is installed before the first cell.
"""

from __future__ import annotations

import ast
import base64
import builtins
import io
import json
import linecache
import os
import resource
import signal
import struct
import sys
import time
import traceback
from typing import Any

CELL = "<cell>"


class CellTimeout(BaseException):
    """The cell ran past its time limit."""


def _alarm(signum: int, frame: Any) -> None:
    raise CellTimeout("the cell ran past its time limit")


class Kernel:
    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.out_fd = os.open("/tmp/.kernel-stdout", os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        self.err_fd = os.open("/tmp/.kernel-stderr", os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        signal.signal(signal.SIGALRM, _alarm)
        self.cells = 0

    def _wire(self) -> None:
        """fds 1 and 2 (and sys.stdout/stderr) on the capture files, emptied."""
        for fd, target in ((self.out_fd, 1), (self.err_fd, 2)):
            os.ftruncate(fd, 0)
            os.dup2(fd, target)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)

    def _collect(self, fd: int, cap: int) -> tuple[str, int]:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, cap), 0)
        return base64.b64encode(data).decode("ascii"), size

    def run(self, code: str, timeout_s: float, cap: int) -> dict[str, Any]:
        self.cells += 1
        self._wire()
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
                print("(error while formatting the traceback)", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        out, out_bytes = self._collect(self.out_fd, cap)
        err, err_bytes = self._collect(self.err_fd, cap)
        return {"stdout": out, "stderr": err, "stdout_bytes": out_bytes, "stderr_bytes": err_bytes,
                "exception": exception, "timed_out": timed_out,
                "duration_s": round(time.monotonic() - started, 6)}

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


def _limits(memory: int, max_files: int) -> None:
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if max_files:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: list[str]) -> None:
    options = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    try:
        os.setsid()  # its own process group: what its cells start is killed with it
    except OSError:
        pass
    proto_in, proto_out = os.dup(0), os.dup(1)
    for fd in (proto_in, proto_out):
        os.set_inheritable(fd, False)  # a subprocess of a cell never holds the protocol pipes
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    try:
        import site
        site.main()  # -S skipped it: the interpreter's dist-packages are importable by cells
    except Exception:
        pass
    kernel = Kernel()
    os.chdir(options.get("cwd", "/work"))
    sys.path.insert(0, os.getcwd())  # as in a notebook: the workspace's own modules import
    _limits(int(options.get("memory", 0)), int(options.get("max-files", 0)))
    if options.get("seccomp"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _worker_isolation as isolation

        isolation.SeccompFilter(base64.b64decode(options["seccomp"])).install()
        sys.path.pop(0)
    sys.argv = [CELL]
    _send(proto_out, {"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
    while True:
        head = _read_exact(proto_in, 4)
        body = _read_exact(proto_in, struct.unpack(">I", head)[0]) if head is not None else None
        if body is None:
            return
        request = json.loads(body)
        result = kernel.run(str(request["code"]), float(request.get("timeout_s") or 30.0),
                            int(request.get("max_output_bytes") or 65536))
        _send(proto_out, result)


if __name__ == "__main__":
    main(sys.argv[1:])
