"""Workspaces on bubblewrap: copy-on-write layers over a read-only base, mounted outside bwrap.

bubblewrap 0.8 has no ``--overlay``, so each prepared state lives in a *holder*
(``_holder.py``): a process in its own user and mount namespace (``unshare --user --map-root-user
--mount``, as uid 65534 when the host process is root, else as the host user) that mounts the
layers there, where nothing else sees them:

- the base folder is the read-only lower layer (never copied; staged once with the sandbox user's
  ownership when it has other owners, which an unprivileged overlay could not copy up);
- *prepare*: a writable layer over the base receives the task's files, then the setup commands run
  in a sandbox on it, then it is frozen (read-only);
- *fork*: one size-capped tmpfs and one overlay mount over (prepared layer, base): ~0.3 ms, whatever
  the base's size. The tmpfs is RAM: ``WorkspaceSpec.size_mb`` is memory the episode may fill.

A workspace's commands and file operations run in a :class:`~agentrl.tools.sandbox.bwrap.BwrapSandbox`
of one worker, started through ``nsenter`` into the holder's namespaces, that binds the workspace's
merged folder at ``/work`` (every other property of the stateless sandbox holds: each call's own
``/tmp``, PID namespace and seccomp filter; what a call leaves running is killed when it ends). The
kernel is a second bwrap process there, without capabilities, in a cgroup of its own (memory cap).

Nothing outlives its owner: a holder exits when its pipe from the host closes and the kernel then
removes its mounts; the sandboxes die with their parent (``--die-with-parent``); holders and kernels
are registered with the reaper (:mod:`agentrl._reaper`) too, and so are the staged bases.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import shutil
import signal
import struct
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl._reaper import reap_path_with_this_process, reap_with_this_process, unreap, unreap_path
from agentrl.tools.sandbox.base import ExecResult, SandboxUnavailableError, tmpfs_files
from agentrl.tools.sandbox.bwrap import NOBODY, BwrapSandbox
from agentrl.tools.sandbox.cgroups import CgroupSet, WorkerCgroup, detect_cgroups
from agentrl.tools.sandbox.seccomp import SeccompUnsupported, filter_b64
from agentrl.tools.workspace.base import (
    GRADER_DIR,
    ROOT,
    CellResult,
    Prepared,
    Workspace,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceSpec,
    grader_folder,
)
from agentrl.tools.workspace.kernel import Kernel, KernelDied
from agentrl.tools.workspace.programs import (
    LAYER_IN_SANDBOX,
    PRELOAD,
    PROGRAM_DIR,
    fsops_code,
    fsops_result,
    layer_code,
    program_binds,
    snapshot_cap,
)

__all__ = ["BwrapWorkspaces"]

HOLDER = PROGRAM_DIR / "_holder.py"
PYTHON = "/usr/bin/python3"
HOLDER_READY_S = 30.0
MOUNTPOINTS = ("/mnt", "/media", "/srv", "/opt", "/home")
FRAME_CAP = 1 << 20  # a holder's answer frame (JSON) or a raw chunk of a snapshot
STREAM_CHUNK = 1 << 20


class _Holder:
    """One holder process (see the module doc) and its request channel."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._lock = asyncio.Lock()

    @classmethod
    async def start(cls, base: str | None, mountpoint: str) -> _Holder:
        argv = ["unshare", "--user", "--map-root-user", "--mount", PYTHON, "-I", "-S", str(HOLDER), mountpoint,
                *([base] if base else [])]
        if os.geteuid() == 0:
            argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
        try:
            # env={}: no process of a workspace gets the trainer's environment (a sandbox could read a
            # holder's or a bwrap init's /proc/<pid>/environ); the sandbox sets what a setting names
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                        env={}, start_new_session=True)
        except OSError as exc:
            raise SandboxUnavailableError(f"cannot start a workspace holder ({exc}); needs util-linux's unshare "
                                          "and setpriv") from exc
        holder = cls(proc)
        reap_with_this_process(proc.pid)
        try:
            await asyncio.wait_for(holder._frame(), HOLDER_READY_S)
        except (WorkspaceError, asyncio.TimeoutError) as exc:
            err = await holder.close()
            raise SandboxUnavailableError(
                f"the workspace holder did not start ({exc}): {err.strip()[-1500:]}; it needs unprivileged user "
                "namespaces with overlayfs in them (Linux >= 5.11) and a base folder the sandbox user may read"
            ) from exc
        return holder

    async def _raw(self) -> bytes:
        assert self.proc.stdout is not None
        try:
            size = struct.unpack(">I", await self.proc.stdout.readexactly(4))[0]
            if size > FRAME_CAP:
                raise WorkspaceError(f"the workspace holder (pid {self.pid}) sent a frame of {size} bytes")
            return await self.proc.stdout.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            raise WorkspaceError(f"the workspace holder (pid {self.pid}) is gone") from exc

    async def _frame(self) -> dict[str, Any]:
        try:
            data = json.loads(await self._raw())
        except ValueError as exc:
            raise WorkspaceError(f"the workspace holder (pid {self.pid}) sent a frame that is not JSON") from exc
        if not isinstance(data, dict):
            raise WorkspaceError("the workspace holder sent something that is not an object")
        return data

    async def _send(self, op: str, payload: bytes | None, arguments: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        body = json.dumps({"op": op, **arguments, **({"payload": len(payload)} if payload is not None else {})})
        if self.proc.stdin.is_closing():
            raise WorkspaceError(f"the workspace holder (pid {self.pid}) is gone")
        try:
            self.proc.stdin.write(struct.pack(">I", len(body)) + body.encode())
            view = memoryview(payload or b"")
            for i in range(0, len(view), STREAM_CHUNK):  # a bounded buffer: never a second copy of a snapshot
                self.proc.stdin.write(view[i:i + STREAM_CHUNK])
                await self.proc.stdin.drain()
            await self.proc.stdin.drain()
        except (ConnectionError, BrokenPipeError, RuntimeError) as exc:
            # uvloop (a Ray actor's loop: a fleet executor's) raises RuntimeError("unable to perform
            # operation on <WriteUnixTransport closed=True ...>") where asyncio's own loop raises one of the others
            raise WorkspaceError(f"the workspace holder (pid {self.pid}) is gone") from exc

    async def request(self, op: str, *, payload: bytes | None = None, **arguments: Any) -> dict[str, Any]:
        """One operation of ``_holder.py`` (``payload``: raw bytes sent after the request); raises
        :class:`WorkspaceError` with its message if it failed."""
        async with self._lock:
            await self._send(op, payload, arguments)
            data = await self._frame()
        if "error" in data:
            raise WorkspaceError(f"workspace {op} failed: {data['error']}")
        return data

    async def stream(self, op: str, limit: int, **arguments: Any) -> bytes:
        """An operation that answers with raw bytes (``snapshot``): at most ``limit`` of them are kept;
        more is a :class:`WorkspaceError` (the rest is read and dropped, so the channel stays usable)."""
        async with self._lock:
            await self._send(op, None, arguments)
            first = await self._frame()
            out, over = io.BytesIO(), False
            if "error" not in first:
                while chunk := await self._raw():
                    over = over or out.tell() + len(chunk) > limit
                    if not over:
                        out.write(chunk)
                first = await self._frame()
        if "error" in first:
            raise WorkspaceError(f"workspace {op} failed: {first['error']}")
        if over:
            raise WorkspaceError(f"workspace {op}: more than its cap of {limit} bytes")
        return out.getvalue()  # (no copy: the buffer becomes the bytes)

    async def close(self) -> str:
        """Ends the holder (its mounts go with its namespace); returns what it wrote on stderr."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 5.0)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            await self.proc.wait()
        unreap(self.pid)
        err = b""
        if self.proc.stderr is not None:
            with contextlib.suppress(Exception):
                err = await asyncio.wait_for(self.proc.stderr.read(), 1.0)
        return err.decode("utf-8", "replace")


class _Group:
    """A holder with one prepared layer, shared by its forks; closed with the last of them."""

    def __init__(self, holder: _Holder, mountpoint: str) -> None:
        self.holder = holder
        self.mountpoint = mountpoint
        self.refs = 1  # the prepared state itself, until released
        self.count = 0

    def new_name(self) -> str:
        self.count += 1
        return f"w{self.count}"

    async def decref(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            await self.holder.close()


class _ProcessChannel:
    """A kernel's pipes (``KernelChannel``)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid: int | None = proc.pid

    async def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def read_exact(self, n: int) -> bytes:
        assert self.proc.stdout is not None
        try:
            return await self.proc.stdout.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise KernelDied("the kernel's channel closed") from exc

    async def kill(self) -> str:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        code = await self.proc.wait()
        unreap(self.proc.pid)
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


class BwrapWorkspace(Workspace):
    """One episode's workspace in a holder (see the module doc)."""

    def __init__(self, spec: WorkspaceSpec, name: str, group: _Group, layer: dict[str, Any],
                 backend: BwrapWorkspaces) -> None:
        super().__init__(spec, name)
        self.group, self.backend = group, backend
        self.merged, self.upper = str(layer["merged"]), str(layer["upper"])
        self._sandbox: BwrapSandbox | None = None
        self._sandbox_lock = asyncio.Lock()
        self.kernel = Kernel(self._start_kernel, timeout_s=spec.cell_timeout_s,
                             max_output_bytes=spec.limits.max_output_bytes, memory_mb=spec.kernel_memory_mb,
                             oom=self._kernel_oom)
        self._kernel_oom_base = 0
        # one group for the workspace's kernels, kept across restarts: what a killed kernel left
        # charged to it (its files in /work) stays the member's, and a restart is no fresh budget
        self._kernel_cgroup: WorkerCgroup | None = None
        self._kernel_tmp = f"{name}-tmp"

    async def sandbox(self) -> BwrapSandbox:
        """The workspace's sandbox (one worker, started at the first command or file operation)."""
        self._check()
        async with self._sandbox_lock:
            if self._sandbox is None:
                started = time.perf_counter()
                box = await _start_sandbox(self.spec, self.group.holder.pid, self.merged, self.backend.seccomp,
                                           [(self.upper, LAYER_IN_SANDBOX)])
                self._sandbox = box
                self.timings["sandbox_start_s"] = time.perf_counter() - started
            return self._sandbox

    async def _box(self) -> BwrapSandbox | ExecResult:
        try:
            return await self.sandbox()
        except SandboxUnavailableError as exc:
            return ExecResult.sandbox_error(f"the workspace's sandbox did not start: {exc}")

    async def run(self, command: str, *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
                  workdir: str = ROOT) -> ExecResult:
        box = await self._box()
        if isinstance(box, ExecResult):
            return box
        return await box.execute(command, language="bash", timeout_s=timeout_s, workdir=workdir,
                                 env={**dict(self.spec.env), **dict(env or {})})

    async def _program(self, code: str, stdin: bytes | None = None) -> ExecResult:
        box = await self._box()
        if isinstance(box, ExecResult):
            return box
        return await box.execute(code, workdir=ROOT, stdin=stdin)

    async def file_op(self, op: str, **arguments: Any) -> dict[str, Any]:
        self._check()
        code, payload = fsops_code(op, arguments)
        return fsops_result(await self._program(code, payload))

    async def _start_kernel(self) -> _ProcessChannel:
        box = await self.sandbox()
        spec = self.spec
        tmp = await self.group.holder.request("scratch", name=self._kernel_tmp, size=spec.limits.tmp_mb << 20,
                                              inodes=tmpfs_files(spec.limits.tmp_mb << 20))
        argv = box.bwrap_argv([PYTHON, "-I", "-S", "/opt/agentrl/kernel.py", f"--cwd={ROOT}",
                               *(f"--seccomp={self.backend.seccomp_b64}" for _ in [0] if self.backend.seccomp_b64),
                               f"--max-files={spec.limits.max_open_files}",
                               *([f"--memory={spec.kernel_memory_mb << 20}"] if not self.backend.cgroups else [])],
                              capabilities=False, tmp_dir=str(tmp["path"]), env=dict(spec.env))
        if self._kernel_cgroup is None:
            self._kernel_cgroup = self.backend.kernel_cgroup(spec)
        cgroup = self._kernel_cgroup
        self._kernel_oom_base = cgroup.oom_kills() if cgroup is not None else 0
        argv = box.launch_argv(argv, cgroup)
        # env={}: bwrap's own init (PID 1 of the kernel's namespace, whose /proc/1/environ a cell can
        # read) must not hold the trainer's environment; the kernel's comes from --setenv
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL, env={}, start_new_session=True)
        reap_with_this_process(proc.pid)
        return _ProcessChannel(proc)

    def _kernel_oom(self) -> bool:
        cgroup = self._kernel_cgroup
        return cgroup is not None and cgroup.oom_kills() > self._kernel_oom_base

    async def python(self, code: str, *, timeout_s: float | None = None) -> CellResult:
        self._check()
        try:
            return await self.kernel.run(code, timeout_s)
        except (KernelDied, WorkspaceError, SandboxUnavailableError) as exc:
            return CellResult("", "", exception="KernelDied", restarted=str(exc))

    async def digest(self, ignore: tuple[str, ...] = ()) -> str:
        """The hash of the writable layer, computed in the workspace's own sandbox (its time and memory
        are this member's, never its group's holder's)."""
        self._check()
        data = fsops_result(await self._program(layer_code("digest", {"top": LAYER_IN_SANDBOX,
                                                                     "ignore": list(ignore)})))
        if "error" in data or not isinstance(data.get("digest"), str):
            raise WorkspaceError(f"workspace digest failed: {data.get('error', data)}")
        return str(data["digest"])

    async def snapshot(self) -> bytes:
        self._check()
        cap = snapshot_cap(self.spec.size_mb, self.spec.file_cap)
        return await self.group.holder.stream("snapshot", cap, name=self.name, cap=cap)

    async def usage(self) -> dict[str, int]:
        self._check()
        return {k: int(v) for k, v in (await self.group.holder.request("usage", name=self.name)).items()}

    async def end_processes(self) -> None:
        """Ends every process the episode started: the kernel (and its PID namespace, so everything a
        cell started: waited for until its cgroup is empty) and the sandbox's worker (a call's
        processes die with the call anyway)."""
        await self.kernel.close()
        for _ in range(300):  # the namespace's processes die as its init does, a moment after the kill
            if self._kernel_cgroup is None or not self._kernel_cgroup.pids():
                break
            await asyncio.sleep(0.01)
        if self._sandbox is not None:
            box, self._sandbox = self._sandbox, None
            await _close_sandbox(box)

    async def grade(self, command: str, *, files: Mapping[str, str | bytes] | None = None,
                    timeout_s: float | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        self._check()
        await self.end_processes()
        started = time.monotonic()
        with grader_folder(files or {}) as folder:
            try:
                box = await _start_sandbox(self.spec, self.group.holder.pid, self.merged, self.backend.seccomp,
                                           [(folder, GRADER_DIR)])
            except (SandboxUnavailableError, OSError) as exc:
                return ExecResult.sandbox_error(f"the grader's sandbox did not start: {exc}",
                                                time.monotonic() - started)
            try:
                return await box.execute(command, language="bash", timeout_s=timeout_s, workdir=ROOT,
                                         env={**dict(self.spec.env), **dict(env or {})})
            finally:
                await _close_sandbox(box)

    def processes(self) -> list[int]:
        pids = list(self._sandbox.worker_pids()) if self._sandbox is not None else []
        return pids + ([self.kernel.pid] if self.kernel.pid is not None else [])

    async def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        await self.end_processes()
        self.backend.release_cgroup(self._kernel_cgroup)
        self._kernel_cgroup = None
        try:
            await self.group.holder.request("remove", name=self._kernel_tmp)
            await self.group.holder.request("remove", name=self.name)
        except WorkspaceError:
            pass  # the holder is gone: so are its mounts
        finally:
            self.backend.live.discard(self)
            await self.group.decref()


async def _start_sandbox(spec: WorkspaceSpec, holder_pid: int, merged: str, seccomp: bool,
                         ro_binds: list[tuple[str, str]] | None = None) -> BwrapSandbox:
    """A one-worker sandbox in the holder's namespaces with ``merged`` at /work (and ``ro_binds``);
    its cgroups are registered with the reaper (the worker itself dies with this process)."""
    box = BwrapSandbox(spec.limits, pool_size=1, enter=["nsenter", "-t", str(holder_pid), "-U", "-m", "--"],
                       binds=[(merged, ROOT)], ro_binds=[*program_binds(), *(ro_binds or [])], seccomp=seccomp,
                       register_cgroup=reap_path_with_this_process, preload=PRELOAD)
    try:
        await box.start()
    except BaseException:
        await _close_sandbox(box)
        raise
    return box


async def _close_sandbox(box: BwrapSandbox) -> None:
    paths = box.cgroup_dirs()
    await box.close()
    for path in paths:
        unreap_path(path)


class BwrapWorkspaces(WorkspaceBackend):
    """The bubblewrap backend (see the module doc). ``seccomp=False`` leaves the filter out;
    ``use_cgroups=False`` caps the kernel's memory with ``RLIMIT_AS`` instead of a cgroup."""

    name = "bwrap"

    def __init__(self, *, seccomp: bool = True, use_cgroups: bool = True) -> None:
        if shutil.which("bwrap") is None or shutil.which("unshare") is None or shutil.which("nsenter") is None:
            raise SandboxUnavailableError("bwrap workspaces need bubblewrap and util-linux (unshare, nsenter, "
                                          "setpriv): apt-get install bubblewrap util-linux")
        self.seccomp = seccomp
        try:
            self.seccomp_b64: str | None = filter_b64() if seccomp else None
        except SeccompUnsupported:
            self.seccomp_b64 = None
        support = detect_cgroups() if use_cgroups else None
        self.cgroups: CgroupSet | None = None
        self._support = support if support is not None and support.version is not None else None
        self._staged: dict[str, str] = {}
        self._stage_root: str | None = None
        self.live: set[BwrapWorkspace] = set()
        self._groups: list[_Group] = []
        self._kernels = 0
        self._closed = False

    # -- kernels' cgroups -------------------------------------------------------------------------
    def kernel_cgroup(self, spec: WorkspaceSpec) -> WorkerCgroup | None:
        if self._support is None:
            return None
        if self.cgroups is None:
            self.cgroups = CgroupSet(self._support, register=reap_path_with_this_process)
        self._kernels += 1
        return self.cgroups.worker(self._kernels, spec.kernel_memory_mb << 20, spec.limits.max_processes + 4,
                                   spec.limits.cpu_cores)

    def release_cgroup(self, cgroup: WorkerCgroup | None) -> None:
        if cgroup is not None and self.cgroups is not None:
            self.cgroups.release(cgroup)

    # -- the base ---------------------------------------------------------------------------------
    def _stage(self, base: str) -> str:
        """``base`` itself when the sandbox user owns all of it, else a copy it owns (made once)."""
        uid = NOBODY if os.geteuid() == 0 else os.geteuid()
        if all(os.lstat(p).st_uid == uid for p in _tree(base)):
            return base
        if base not in self._staged:
            if self._stage_root is None:
                self._stage_root = tempfile.mkdtemp(prefix="agentrl-ws-bases-")
                os.chmod(self._stage_root, 0o755)
                reap_path_with_this_process(self._stage_root)
            target = os.path.join(self._stage_root, str(len(self._staged)))
            shutil.copytree(base, target, symlinks=True)
            if os.geteuid() == 0:
                for path in _tree(target):
                    os.lchown(path, uid, uid)
            self._staged[base] = target
        return self._staged[base]

    def _mountpoint(self) -> str:
        avoid = [str(PROGRAM_DIR), str(Path(__file__).resolve().parent.parent / "sandbox")]
        for candidate in MOUNTPOINTS:
            if os.path.isdir(candidate) and not any(p == candidate or p.startswith(candidate + "/") for p in avoid):
                return candidate
        raise SandboxUnavailableError(f"no folder to mount a workspace holder's layers on among {MOUNTPOINTS}")

    # -- prepare and fork -------------------------------------------------------------------------
    async def prepare(self, spec: WorkspaceSpec, files: Mapping[str, bytes], key: str) -> Prepared:
        if self._closed:
            raise WorkspaceError("BwrapWorkspaces: the backend is closed")
        started = time.perf_counter()
        base = await asyncio.to_thread(self._stage, spec.base) if spec.base else None
        mountpoint = self._mountpoint()
        holder = await _Holder.start(base, mountpoint)
        group = _Group(holder, mountpoint)
        self._groups.append(group)
        try:
            prep = await holder.request("mount", name="prep", size=spec.size_mb << 20, lowers=["@base"],
                                        inodes=spec.file_cap)
            if files:
                await holder.request("write", name="prep", files={p: base64.b64encode(d).decode("ascii")
                                                                   for p, d in files.items()})
            if spec.setup:
                await self._setup(spec, holder, prep["merged"])
            await holder.request("freeze", name="prep")
        except BaseException:
            await group.decref()
            raise
        return Prepared(key, spec, group, setup_s=time.perf_counter() - started)

    async def _setup(self, spec: WorkspaceSpec, holder: _Holder, merged: str) -> None:
        box = await _start_sandbox(spec, holder.pid, merged, self.seccomp)
        try:
            for i, command in enumerate(spec.setup):
                result = await box.execute(command, language="bash", timeout_s=spec.setup_timeout_s, workdir=ROOT,
                                           env=dict(spec.env))
                if not result.ok:
                    why = "timed out" if result.timed_out else (result.killed_reason or f"exit status {result.exit_code}")
                    raise WorkspaceError(f"WorkspaceSpec.setup[{i}] {command!r} failed ({why}): "
                                         f"{(result.stderr or result.stdout).strip()[-1500:]}")
        finally:
            await _close_sandbox(box)

    async def fork(self, prepared: Prepared) -> BwrapWorkspace:
        ws = await self._new(prepared, "mount", None)
        prepared.forks += 1
        return ws

    async def restore(self, prepared: Prepared, snapshot: bytes) -> BwrapWorkspace:
        spec = prepared.spec
        if len(snapshot) > snapshot_cap(spec.size_mb, spec.file_cap):
            raise WorkspaceError(f"workspace restore: a snapshot of {len(snapshot)} bytes, more than a workspace of "
                                 f"size_mb={spec.size_mb} can hold")
        return await self._new(prepared, "restore", snapshot)

    async def _new(self, prepared: Prepared, op: str, snapshot: bytes | None) -> BwrapWorkspace:
        group: _Group = prepared.handle
        name = group.new_name()
        group.refs += 1
        try:
            layer = await group.holder.request(op, payload=snapshot, name=name, size=prepared.spec.size_mb << 20,
                                               lowers=["prep", "@base"], inodes=prepared.spec.file_cap)
        except BaseException:
            await group.decref()
            raise
        ws = BwrapWorkspace(prepared.spec, name, group, layer, self)
        self.live.add(ws)
        return ws

    async def release(self, prepared: Prepared) -> None:
        # the holder (and the prepared layer, which the forks' overlays use) ends with its last fork
        await prepared.handle.decref()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ws in list(self.live):
            await ws.remove()
        for group in self._groups:
            if group.refs > 0:
                group.refs = 1
                await group.decref()
        self._groups.clear()
        if self.cgroups is not None:
            parents = [str(p) for p in self.cgroups.parents()]
            await asyncio.to_thread(self.cgroups.close)
            for parent in parents:
                unreap_path(parent)
            self.cgroups = None
        if self._stage_root is not None:
            await asyncio.to_thread(shutil.rmtree, self._stage_root, True)
            unreap_path(self._stage_root)
            self._stage_root = None

    def leftovers(self) -> dict[str, int]:
        alive = [g for g in self._groups if g.holder.proc.returncode is None]
        return {"holders": len(alive), "workspaces": len(self.live)}


def _tree(top: str) -> list[str]:
    out = [top]
    for root, dirs, files in os.walk(top):
        out.extend(os.path.join(root, n) for n in dirs + files)
    return out
