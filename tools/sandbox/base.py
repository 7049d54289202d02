"""The sandbox contract shared by every backend: limits in, :class:`ExecResult` out.

A :class:`Sandbox` runs untrusted code and always answers with a result, never with an exception
caused by the code itself: a crash, hang, memory or output flood of the program shows up in the
result's fields (``exit_code``, ``timed_out``, ``killed_reason``, ``truncated``). Exceptions are
reserved for misuse (bad arguments, a closed sandbox) and for an unusable backend
(:class:`SandboxUnavailableError`, whose message names the fix).

Sandboxes are async context managers; ``close()`` stops every process they started and is safe to
call twice. All methods must be called from one event loop.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

__all__ = [
    "LANGUAGES",
    "SCOPES",
    "Capabilities",
    "ExecResult",
    "KilledReason",
    "Sandbox",
    "SandboxClosedError",
    "SandboxLimits",
    "SandboxUnavailableError",
]

Language = Literal["python", "bash"]
LANGUAGES: tuple[str, ...] = ("python", "bash")

SCOPES: tuple[str, ...] = ("execution", "worker", "pool", "host")
"""How long a piece of sandbox state lives (see :attr:`Capabilities.scopes`)."""

KilledReason = Literal["timeout", "cpu_time", "memory", "signal", "sandbox_error"]
"""Why an execution did not end on its own: wall-clock timeout, CPU-time limit, out of memory (the
cgroup OOM killer), another signal (e.g. a segfault), or a failure of the sandbox machinery."""

TRUNCATION_MARKER = "\n[... output truncated: {omitted} more bytes not shown ...]"


class SandboxUnavailableError(RuntimeError):
    """The backend cannot run on this machine; the message says why and how to fix it."""


class SandboxClosedError(RuntimeError):
    """``run`` was called on a sandbox after ``close()``."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-execution limits. ``timeout_s`` is wall time; the rest are enforced where the backend can
    (see :meth:`Sandbox.capabilities`); a limit a backend cannot apply is reported, never ignored
    silently. ``tmp_mb`` sizes each of ``/tmp`` and ``/dev/shm``, which then hold at most one file
    per 4 KiB of it (:func:`tmpfs_files`)."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 512
    max_processes: int = 64
    max_output_bytes: int = 65536
    max_file_mb: int = 64
    tmp_mb: int = 64
    max_open_files: int = 256
    cpu_cores: float = 1.0
    max_code_bytes: int = 512 * 1024

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxLimits.{f.name}: expected a positive number, got {value!r}")
        for name in ("cpu_s", "memory_mb", "max_processes", "max_output_bytes", "max_file_mb", "tmp_mb",
                     "max_open_files", "max_code_bytes"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"SandboxLimits.{name}: expected an integer, got {getattr(self, name)!r}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


@dataclass
class ExecResult:
    """The outcome of one execution. ``stdout``/``stderr`` are decoded as UTF-8 with replacement
    characters for invalid bytes and capped at the sandbox's ``max_output_bytes`` each; when a stream
    was cut, ``truncated`` is true and the stream ends with a visible marker. ``exit_code`` is
    ``None`` when the process was killed by a signal.

    ``exit_code``, ``signal``, ``timed_out``, ``killed_reason``, ``duration_s`` and ``cpu_s`` are
    what the sandbox's supervisor observed; the program cannot forge them. ``claimed_exception`` is
    the program's own claim (its interpreter names the uncaught exception, e.g.
    ``"ZeroDivisionError"``, on a channel the program could also write): use it to describe a
    failure, never to score one. It is ``None`` unless the exit code is 1, the status an uncaught
    exception gives."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    killed_reason: KilledReason | None = None
    duration_s: float = 0.0
    truncated: bool = False
    claimed_exception: str | None = None
    signal: int | None = None
    cpu_s: float = 0.0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the program ran to completion with exit code 0 (as the supervisor observed)."""
        return self.exit_code == 0 and self.killed_reason is None

    @classmethod
    def sandbox_error(cls, message: str, duration_s: float = 0.0) -> ExecResult:
        return cls(stdout="", stderr=message, exit_code=None, killed_reason="sandbox_error", duration_s=duration_s)


@dataclass(frozen=True)
class Capabilities:
    """What a backend enforces on this machine. ``enforced`` maps a limit or isolation property to
    the mechanism that enforces it (e.g. ``"memory": "cgroup v1 memory.limit_in_bytes"``);
    ``not_enforced`` lists those it cannot apply here, each with the reason.

    ``scopes`` says how long each piece of sandbox state lives and who shares it: every value
    starts with one of :data:`SCOPES` and a colon, then how. ``execution``: fresh for every call,
    gone when it ends; ``worker``: one worker (bwrap) or container (Docker) keeps it across the
    calls it serves, one at a time; ``pool``: every worker of the sandbox shares it; ``host``:
    shared with the machine (read-only unless said otherwise)."""

    backend: str
    enforced: dict[str, str]
    not_enforced: dict[str, str] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)

    def scope(self, key: str) -> str:
        """The scope word (one of :data:`SCOPES`) of ``scopes[key]``."""
        value = self.scopes.get(key)
        if value is None:
            raise KeyError(f"Capabilities.scopes: no entry {key!r}; expected one of {sorted(self.scopes)}")
        return value.split(":", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Sandbox(abc.ABC):
    """Runs untrusted code with limits. See the module docstring for the contract."""

    backend: str = "abstract"

    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits
        self._closed = False

    @abc.abstractmethod
    async def run(self, code: str, *, language: str = "python", timeout_s: float | None = None) -> ExecResult:
        """Executes ``code`` and returns its result; ``timeout_s`` overrides the wall-time limit."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stops every process and releases every resource of the sandbox. Idempotent."""

    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """Which limits and isolation properties this backend enforces on this machine."""

    async def start(self) -> None:
        """Warms the backend up (starts its pool). ``run`` calls it when needed."""
        return None

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_request(self, code: str, language: str, timeout_s: float | None) -> float:
        """Validates ``run``'s arguments and returns the effective timeout."""
        if self._closed:
            raise SandboxClosedError(f"{type(self).__name__}.run: the sandbox is closed")
        if not isinstance(code, str):
            raise TypeError(f"Sandbox.run(code=...): expected a str, got {type(code).__name__}")
        size = len(code.encode("utf-8", errors="surrogatepass"))
        if size > self.limits.max_code_bytes:
            raise ValueError(f"Sandbox.run(code=...): {size} bytes of code, expected at most "
                             f"max_code_bytes={self.limits.max_code_bytes}")
        if language not in LANGUAGES:
            raise ValueError(f"Sandbox.run(language=...): expected one of {LANGUAGES}, got {language!r}")
        if timeout_s is None:
            return self.limits.timeout_s
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
            raise ValueError(f"Sandbox.run(timeout_s=...): expected a positive number of seconds, got {timeout_s!r}")
        return float(timeout_s)

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def decode_output(raw: bytes, total: int) -> tuple[str, bool]:
    """Decodes a captured stream and appends the truncation marker when ``total`` exceeds it."""
    text = raw.decode("utf-8", errors="replace")
    if total > len(raw):
        return text + TRUNCATION_MARKER.format(omitted=total - len(raw)), True
    return text, False


# -- what the worker-based backends (bwrap, docker, local) share ---------------------------------

WORKER_SOURCE = Path(__file__).with_name("_worker.py")
"""The worker program every backend runs (bind-mounted read-only into bwrap and Docker sandboxes)."""
WORKER_PARTS: tuple[Path, ...] = (Path(__file__).with_name("_worker_isolation.py"),
                                  Path(__file__).with_name("_worker_container.py"))
"""The files the worker program loads from its own directory (bound next to it, read-only)."""


def worker_binds(directory: str) -> list[tuple[str, str]]:
    """``(host path, sandbox path)`` of the worker program and its parts in ``directory``."""
    return [(str(WORKER_SOURCE), f"{directory}/worker.py"),
            *((str(part), f"{directory}/{part.name}") for part in WORKER_PARTS)]
BYTES_PER_FILE = 4096
"""A tmpfs the sandbox mounts holds at most one file (inode) per this many bytes of its size (at
least :data:`MIN_FILES`): a file costs kernel memory (about 1-2 KiB with its directory entry) that
no size limit counts, so empty files would otherwise fill memory, not the tmpfs."""
MIN_FILES = 1024


def tmpfs_files(size_bytes: int) -> int:
    """The file (inode) cap of a tmpfs of ``size_bytes`` (see :data:`BYTES_PER_FILE`)."""
    return max(MIN_FILES, int(size_bytes) // BYTES_PER_FILE)


WORKER_MEMORY_OVERHEAD_MB = 32
"""Memory for the worker itself, on top of ``memory_mb`` in a worker's (or container's) cgroup."""
EXTRA_PIDS = 8
"""Processes of the machinery on top of ``max_processes`` in the process limit: bwrap, its init,
the worker's waiter and the worker, the running execution's PID 1, the next execution's prepared
PID 1 and process (or the container's reaper and runner), plus slack."""


def default_pool_size() -> int:
    """Workers in a pool when ``pool_size`` is not given: the CPU count, between 2 and 8."""
    return max(2, min(8, os.cpu_count() or 2))


def result_from_worker(data: dict[str, Any], duration_s: float) -> ExecResult:
    """Builds an :class:`ExecResult` from the worker program's JSON result."""
    import base64

    if "error" in data:
        return ExecResult.sandbox_error(f"sandbox worker failed: {data['error']}", duration_s)
    stdout, cut_out = decode_output(base64.b64decode(data["stdout"]), int(data["stdout_bytes"]))
    stderr, cut_err = decode_output(base64.b64decode(data["stderr"]), int(data["stderr_bytes"]))
    return ExecResult(
        stdout=stdout, stderr=stderr, exit_code=data["exit_code"], timed_out=bool(data["timed_out"]),
        killed_reason=data["killed_reason"], duration_s=duration_s, truncated=cut_out or cut_err,
        claimed_exception=data.get("claimed_exception"), signal=data.get("signal"),
        cpu_s=float(data.get("cpu_s", 0.0)), stdout_bytes=int(data["stdout_bytes"]),
        stderr_bytes=int(data["stderr_bytes"]),
        metrics={"inner_duration_s": data.get("duration_s"), "prepared": data.get("prepared"),
                 **({"channel": data["channel"]} if data.get("channel") is not None else {})},
    )


def retire_reason(data: dict[str, Any]) -> str | None:
    """Why the worker (or container) that produced the worker result ``data`` must not serve again:
    the machinery failed, the state after the call could not be verified clean, or the memory limit
    was hit (the OOM killer may have hit the machinery too). ``None``: it may be reused."""
    if "error" in data:
        return "the sandbox machinery failed"
    if data.get("clean") is False:
        return f"not verified clean after the call: {data.get('unclean')}"
    if data.get("killed_reason") == "memory":
        return "the memory limit was hit"
    return None


def worker_request(code: str, language: str, timeout_s: float, limits: SandboxLimits, *,
                   memory_rlimit: bool, nproc_rlimit: bool) -> dict[str, Any]:
    """The JSON request the worker program understands, for one execution."""
    mb = 1 << 20
    return {
        "code": code, "language": language, "timeout_s": timeout_s, "cpu_s": limits.cpu_s,
        "max_output_bytes": limits.max_output_bytes, "max_file_bytes": limits.max_file_mb * mb,
        "max_open_files": limits.max_open_files, "tmp_bytes": limits.tmp_mb * mb,
        "tmp_inodes": tmpfs_files(limits.tmp_mb * mb),
        "address_space_bytes": limits.memory_mb * mb if memory_rlimit else 0,
        "max_processes": limits.max_processes if nproc_rlimit else 0,
    }
