"""The workspace contract: a spec in, one episode's stateful sandbox out.

A :class:`Workspace` is the place one episode works in: a folder ``/work`` that keeps its files from
one tool call to the next, a shell to run commands there, and a Python kernel whose variables
persist. It starts from a *prepared* state (:class:`WorkspaceSpec`: a base folder or image, the
task's files, setup commands), which a :class:`WorkspaceBackend` builds once and *forks* for every
episode that needs it (a GRPO group's members). Isolation stays the sandbox's job: every command,
cell and file operation runs inside the backend's sandbox, which sees ``/work`` and nothing of the
host or of another workspace.

Contract of a workspace: single-owner (one episode), used from one event loop; ``remove()`` stops
every process it started and frees every resource, is idempotent, and afterwards every method but
``removed`` raises :class:`WorkspaceRemovedError`. A backend's ``close()`` removes every workspace
it created. A crash of the owning process is covered by the reaper (:mod:`agentrl._reaper`):
processes, containers and folders a workspace registered are removed when its owner dies.

What a reward may trust: :meth:`Workspace.grade` runs a command after every process the episode
started is gone, where nothing of the model runs, with files the model never could write (at
:data:`GRADER_DIR`, read-only); its result is what that command did. ``run``, ``python`` and the file
operations run next to the model's processes, and a cell runs in the model's own interpreter (which
it can patch): their output is the model's claim, never a verdict.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools.sandbox.base import ExecResult, SandboxLimits, tmpfs_files

__all__ = [
    "BACKENDS",
    "GRADER_DIR",
    "TOOL_NAMES",
    "CellResult",
    "Prepared",
    "Workspace",
    "WorkspaceBackend",
    "WorkspaceError",
    "WorkspaceRemovedError",
    "WorkspaceSpec",
    "files_key",
    "grader_folder",
]

BACKENDS: tuple[str, ...] = ("bwrap", "docker")
TOOL_NAMES: tuple[str, ...] = ("bash", "python", "read_file", "write_file", "edit_file", "list_dir")
ROOT = "/work"
GRADER_DIR = "/grader"
"""Where :meth:`Workspace.grade` puts its files, read-only."""


class WorkspaceError(RuntimeError):
    """A workspace could not be created, prepared or used (the message says why)."""


class WorkspaceRemovedError(WorkspaceError):
    """A removed workspace was used."""


def _positive(name: str, value: Any, kind: type = int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value <= 0:
        raise ValueError(f"WorkspaceSpec.{name}: expected a positive {'number' if kind is float else 'integer'}, "
                         f"got {value!r}")


@dataclass(frozen=True)
class WorkspaceSpec:
    """What an episode's workspace starts from, and its limits.

    - ``base``: a host folder the workspace starts from (bwrap: the read-only lower layer, never
      written; Docker: copied into the container's ``/work``); ``None``: an empty workspace;
    - ``image``: the Docker image (default: the sandbox image); bwrap runs the host's ``/usr``;
    - ``setup``: bash commands run once per prepared workspace, in ``/work``, after the task's files
      were written (each within ``setup_timeout_s``; a failure fails every episode that needs it);
    - ``size_mb``: the cap of what an episode may write (a tmpfs: **RAM**, charged while the episode
      runs); on Docker the base's copy counts too;
    - ``max_files``: the cap of files (inodes) there, which cost kernel memory no size counts
      (``None``: one per 4 KiB of ``size_mb``, at least 1024: :attr:`file_cap`);
    - ``limits``: per command and file operation (the sandbox's ``SandboxLimits``);
    - ``kernel_memory_mb``, ``cell_timeout_s``: the Python kernel's memory (per kernel) and time
      (per cell);
    - ``env``: extra environment variables of commands and the kernel;
    - ``tools``: which of :data:`TOOL_NAMES` an environment declaring this spec gets;
    - ``verify_replay``: after each step that ran tools, hash the files written so far; a resumed
      episode's replay must rebuild the same (``ignore``: names left out of the hash, caches that
      differ between runs).
    """

    base: str | None = None
    image: str | None = None
    setup: tuple[str, ...] = ()
    backend: str = "bwrap"
    size_mb: int = 256
    max_files: int | None = None
    limits: SandboxLimits = field(default_factory=lambda: SandboxLimits(timeout_s=30.0, cpu_s=60, memory_mb=1024))
    kernel_memory_mb: int = 1024
    cell_timeout_s: float = 30.0
    setup_timeout_s: float = 300.0
    env: tuple[tuple[str, str], ...] = (("PYTHONDONTWRITEBYTECODE", "1"),)
    tools: tuple[str, ...] = TOOL_NAMES
    verify_replay: bool = True
    ignore: tuple[str, ...] = ("__pycache__", ".pytest_cache", "*.pyc")

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"WorkspaceSpec.backend: expected one of {BACKENDS}, got {self.backend!r}")
        if self.base is not None:
            if not isinstance(self.base, str | os.PathLike) or not os.path.isdir(self.base):
                raise ValueError(f"WorkspaceSpec.base: expected an existing folder, got {self.base!r}")
            object.__setattr__(self, "base", os.path.realpath(self.base))
        if self.image is not None and (not isinstance(self.image, str) or not self.image):
            raise ValueError(f"WorkspaceSpec.image: expected an image name, got {self.image!r}")
        if isinstance(self.setup, str) or not all(isinstance(c, str) and c.strip() for c in self.setup):
            raise ValueError(f"WorkspaceSpec.setup: expected a tuple of non-empty bash commands, got {self.setup!r}")
        object.__setattr__(self, "setup", tuple(self.setup))
        for name in ("size_mb", "kernel_memory_mb"):
            _positive(name, getattr(self, name))
        if self.max_files is not None:
            _positive("max_files", self.max_files)
        for name in ("cell_timeout_s", "setup_timeout_s"):
            _positive(name, getattr(self, name), float)
        if not isinstance(self.limits, SandboxLimits):
            raise ValueError(f"WorkspaceSpec.limits: expected SandboxLimits, got {type(self.limits).__name__}")
        env = tuple(self.env.items()) if isinstance(self.env, Mapping) else tuple(self.env)
        if not all(isinstance(k, str) and k.isidentifier() and isinstance(v, str) for k, v in env):
            raise ValueError(f"WorkspaceSpec.env: expected NAME=value string pairs, got {self.env!r}")
        object.__setattr__(self, "env", env)
        unknown = sorted(set(self.tools) - set(TOOL_NAMES))
        if isinstance(self.tools, str) or unknown:
            raise ValueError(f"WorkspaceSpec.tools: expected names from {TOOL_NAMES}, got {self.tools!r}")
        object.__setattr__(self, "tools", tuple(self.tools))

    @property
    def file_cap(self) -> int:
        """How many files (inodes) the workspace's writable layer may hold: ``max_files``, or one per
        4 KiB of ``size_mb``."""
        return self.max_files if self.max_files is not None else tmpfs_files(self.size_mb << 20)

    def replace(self, **changes: Any) -> WorkspaceSpec:
        return dataclasses.replace(self, **changes)


def task_files(files: Mapping[str, str | bytes]) -> dict[str, bytes]:
    """Validated per-task files: relative paths (no ``..``, no absolute path) -> bytes."""
    out: dict[str, bytes] = {}
    if not isinstance(files, Mapping):
        raise ValueError(f"workspace files: expected a mapping of relative path -> content, got {type(files).__name__}")
    for path, content in files.items():
        parts = path.split("/") if isinstance(path, str) else []
        if not parts or path.startswith("/") or "\0" in path or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"workspace files: path {path!r}: expected a relative path without '.', '..' or "
                             "empty parts")
        if not isinstance(content, str | bytes):
            raise ValueError(f"workspace files: {path!r}: expected str or bytes content, got {type(content).__name__}")
        out[path] = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    return out


@contextlib.contextmanager
def grader_folder(files: Mapping[str, str | bytes]) -> Iterator[str]:
    """A fresh host folder holding ``files`` (validated like the task's), readable by the sandbox
    user, removed afterwards: what :meth:`Workspace.grade` binds read-only at :data:`GRADER_DIR`."""
    clean = task_files(files)
    folder = tempfile.mkdtemp(prefix="agentrl-grader-")
    try:
        os.chmod(folder, 0o755)
        for path, data in clean.items():
            target = os.path.join(folder, path)
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
            os.chmod(target, 0o644)
        for root, dirs, _ in os.walk(folder):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def files_key(spec: WorkspaceSpec, files: Mapping[str, bytes]) -> str:
    """What makes two prepared workspaces the same: the spec and the task's files."""
    h = hashlib.sha256(repr((spec.backend, spec.base, spec.image, spec.setup, spec.size_mb, spec.file_cap,
                             spec.env)).encode())
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()[:24]


@dataclass
class CellResult:
    """One kernel cell: its output (capped, like :class:`ExecResult`), the exception it raised (its
    class name), whether it ran past its time limit, and ``restarted``: why the kernel was restarted
    during or after this cell (it crashed, was killed at the hard deadline, hit its memory cap), in
    which case every variable is gone."""

    stdout: str
    stderr: str
    exception: str | None = None
    timed_out: bool = False
    restarted: str | None = None
    duration_s: float = 0.0
    truncated: bool = False


@dataclass
class Prepared:
    """A prepared workspace state that forks share (backend-specific ``handle``)."""

    key: str
    spec: WorkspaceSpec
    handle: Any
    setup_s: float = 0.0
    forks: int = 0


class Workspace(abc.ABC):
    """One episode's workspace; see the module doc for the contract."""

    def __init__(self, spec: WorkspaceSpec, name: str) -> None:
        self.spec = spec
        self.name = name
        self._removed = False
        self.timings: dict[str, float] = {}

    @property
    def removed(self) -> bool:
        return self._removed

    def _check(self) -> None:
        if self._removed:
            raise WorkspaceRemovedError(f"workspace {self.name}: already removed")

    @abc.abstractmethod
    async def run(self, command: str, *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
                  workdir: str = ROOT) -> ExecResult:
        """Runs a bash program in ``workdir`` (its stdout/stderr, exit status; what it wrote on fd 3 is
        ``ExecResult.metrics["channel"]``)."""

    @abc.abstractmethod
    async def python(self, code: str, *, timeout_s: float | None = None) -> CellResult:
        """Runs a cell in the workspace's kernel (started at the first cell, restarted after a crash)."""

    @abc.abstractmethod
    async def file_op(self, op: str, **arguments: Any) -> dict[str, Any]:
        """A file tool's operation (``read``, ``write``, ``edit``, ``list``) inside the sandbox."""

    @abc.abstractmethod
    async def digest(self, ignore: tuple[str, ...] = ()) -> str:
        """A hash of every file the episode wrote, deleted or changed (not of times)."""

    @abc.abstractmethod
    async def snapshot(self) -> bytes:
        """The workspace's writable state, for :meth:`WorkspaceBackend.restore` on the same backend."""

    async def grade(self, command: str, *, files: Mapping[str, str | bytes] | None = None,
                    timeout_s: float | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        """Runs a reward's bash ``command`` where nothing the model started can see or change it.

        First every process of the episode is ended (the kernel and whatever any cell or command
        left running); then ``command`` runs in ``/work`` (the files as the model left them: data to
        judge, never code to trust) in a fresh sandbox of its own (bwrap: a new sandbox on the
        workspace's layer; Docker: a new container holding a copy of ``/work``), with its own
        ``/tmp`` and ``files`` (relative path -> content) read-only at :data:`GRADER_DIR`, written
        by the host where the model never could. A failure of the machinery is an
        :class:`ExecResult` with ``killed_reason="sandbox_error"``, never an exception. A later
        ``python`` call starts a fresh kernel. A backend that cannot isolate a grader does not have
        this method: it raises :class:`WorkspaceError`."""
        raise WorkspaceError(f"{type(self).__name__} cannot run a grader apart from the model's processes")

    @abc.abstractmethod
    async def remove(self) -> None:
        """Stops everything the workspace started and frees it. Idempotent."""

    def processes(self) -> list[int]:
        """Host PIDs of the workspace's processes (for leftover checks)."""
        return []


class WorkspaceBackend(abc.ABC):
    """Builds prepared states and forks them into workspaces (see the module doc)."""

    name: str = "abstract"

    @abc.abstractmethod
    async def prepare(self, spec: WorkspaceSpec, files: Mapping[str, bytes], key: str) -> Prepared:
        """Builds the state ``spec`` and ``files`` describe (setup commands run here, once)."""

    @abc.abstractmethod
    async def fork(self, prepared: Prepared) -> Workspace:
        """A new workspace starting from ``prepared`` (copy-on-write where the backend can)."""

    @abc.abstractmethod
    async def restore(self, prepared: Prepared, snapshot: bytes) -> Workspace:
        """A new workspace starting from ``prepared`` with a :meth:`Workspace.snapshot` applied."""

    @abc.abstractmethod
    async def release(self, prepared: Prepared) -> None:
        """Frees a prepared state no workspace needs any more (forks keep what they use)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Removes every workspace and prepared state of this backend. Idempotent."""

    def leftovers(self) -> dict[str, int]:
        """What of this backend still exists on the machine (processes, mounts, containers...)."""
        return {}
