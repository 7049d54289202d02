"""Workspaces on Docker: one container per episode, its ``/work`` a size-capped tmpfs.

Docker on ext4 has no per-container disk quota, so ``/work`` is a tmpfs (``size_mb`` and
``file_cap`` files, RAM, counted in the container's memory limit), which also means a fork is a
*copy*, not copy-on-write: *prepare* runs a container once (the base folder and the task's files
streamed in as a tar, then the setup commands), keeps the resulting ``/work`` as a tar in memory
(sparse files stored as their data, at most what the workspace can hold), and removes that
container; each *fork* is a new container with that tar unpacked into its ``/work``. Containers
run as the stateless sandbox's do (``--network none``, read-only root, uid 65534, all capabilities
dropped, ``no-new-privileges``, Docker's seccomp profile plus the project's filter per command,
memory, pids and CPU limits), from ``WorkspaceSpec.image`` or the sandbox image.

Commands and file operations are ``docker exec`` of the sandbox worker program (``once`` mode, in
``/work``, a process group of their own that is killed when the call ends), their request sent on
the exec's stdin (no process of the container can read it from a command line); unlike the stateless
backend the container is not swept between calls, since its ``/work``, ``/tmp`` and kernel are the
episode's. The kernel is a long-lived ``docker exec`` attached to a socket, run with a group of its
own (:data:`KERNEL_GID`) so that a restart kills everything its cells started; its memory cap is
``RLIMIT_AS``. A reward's :meth:`DockerWorkspace.grade` first kills every process of the container,
then runs in a *new* container holding a copy of ``/work`` and the grader's files (a read-only bind
mount). A container that died (out of memory) makes every later call a typed failure. Every container
is registered with the reaper (removed if the owning process dies) and removed with its workspace.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentrl._reaper import reap_container_with_this_process, unreap_container
from agentrl.tools.sandbox.base import (
    EXTRA_PIDS,
    WORKER_MEMORY_OVERHEAD_MB,
    ExecResult,
    SandboxUnavailableError,
    result_from_worker,
    tmpfs_files,
    worker_binds,
    worker_request,
)
from agentrl.tools.sandbox.docker import DEFAULT_IMAGE, IMAGE_HINT
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
from agentrl.tools.workspace.docker_calls import (
    KILL_ALL,
    KILL_GROUP,
    death,
    exec_io,
    tar_files,
    tar_folder,
)
from agentrl.tools.workspace.kernel import Kernel, KernelDied, frame_cap
from agentrl.tools.workspace.programs import (
    IN_SANDBOX,
    fsops_code,
    fsops_result,
    layer_code,
    program_binds,
    snapshot_cap,
)

__all__ = ["KERNEL_GID", "DockerWorkspaces"]

NOBODY = "65534:65534"
KERNEL_GID = 65533
"""The kernel runs as uid 65534 with this group: a process cannot change its group without
capabilities, so whatever a cell started (even in a new session) is found by it and killed when the
kernel is restarted."""
GRACE_S = 10.0
PATH_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


class _DockerChannel:
    """A kernel's attached ``docker exec`` socket (``KernelChannel``): stdin raw, stdout multiplexed."""

    def __init__(self, owner: DockerWorkspace, sock: Any) -> None:
        self.owner, self.backend, self.container, self.sock = owner, owner.backend, owner.container, sock
        self.pid: int | None = None  # the kernel's PID inside the container (from its ready frame)
        self._buffer = b""
        self._frame_left = 0

    async def send(self, data: bytes) -> None:
        await self.backend.call(self.sock.sendall, data)

    def _read_some(self) -> bytes:
        while True:
            if self._frame_left == 0:
                head = self._recv_exact(8)
                self._frame_left = struct.unpack(">I", head[4:])[0]
                if head[0] != 1:  # stderr is not attached; anything else is skipped
                    while self._frame_left:
                        self._frame_left -= len(self._recv_exact(min(self._frame_left, 1 << 16)))
                continue
            chunk = bytes(self.sock.recv(min(self._frame_left, 1 << 16)))
            if not chunk:
                raise KernelDied("the kernel's socket closed")
            self._frame_left -= len(chunk)
            return chunk

    def _recv_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise KernelDied("the kernel's socket closed")
            data += chunk
        return data

    async def read_exact(self, n: int) -> bytes:
        while len(self._buffer) < n:
            self._buffer += bytes(await self.backend.call(self._read_some))
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    async def kill(self) -> str:
        if not self.owner.removed:  # (a removed workspace's container goes, and everything in it)
            # every process of the kernel's group: a cell's daemons in their own sessions included
            await self.backend.sweep(self.container, KILL_GROUP.replace("GID", repr(str(KERNEL_GID))))
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        return "killed"


class DockerWorkspace(Workspace):
    """One episode's container (see the module doc)."""

    def __init__(self, spec: WorkspaceSpec, name: str, container: Any, backend: DockerWorkspaces) -> None:
        super().__init__(spec, name)
        self.container, self.backend = container, backend
        self.calls = 0
        self.kernel = Kernel(self._start_kernel, timeout_s=spec.cell_timeout_s,
                             max_output_bytes=spec.limits.max_output_bytes, memory_mb=spec.kernel_memory_mb)

    async def run(self, command: str, *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
                  workdir: str = ROOT) -> ExecResult:
        self._check()
        self.calls += 1  # a script file of its own: calls of one episode may run at the same time (one /tmp)
        return await self.backend.run_worker(self.container, self.spec, command, "bash", timeout_s, workdir,
                                             {**dict(self.spec.env), **dict(env or {})}, f".cell-{self.calls}.sh")

    async def file_op(self, op: str, **arguments: Any) -> dict[str, Any]:
        self._check()
        code, payload = fsops_code(op, arguments)
        result = await self.backend.run_worker(self.container, self.spec, code, "python", None, ROOT, {}, stdin=payload)
        return fsops_result(result)

    async def _start_kernel(self) -> _DockerChannel:
        spec, backend = self.spec, self.backend
        argv = ["python3", "-I", "-S", f"{IN_SANDBOX}/kernel.py", f"--cwd={ROOT}", f"--memory={spec.kernel_memory_mb << 20}",
                f"--max-files={spec.limits.max_open_files}", *([f"--seccomp={backend.seccomp}"] if backend.seccomp else [])]

        def start() -> Any:
            api = backend.client.api
            exec_id = api.exec_create(self.container.id, argv, stdin=True, stdout=True, stderr=False,
                                      user=f"65534:{KERNEL_GID}", workdir=ROOT,
                                      environment={**PATH_ENV, **dict(spec.env)})["Id"]
            sock = api.exec_start(exec_id, socket=True)
            return getattr(sock, "_sock", sock)

        try:
            return _DockerChannel(self, await backend.call(start))
        except Exception as exc:  # the Docker SDK's errors: the container is gone or stopped
            raise KernelDied(await backend.unavailable(self.container, exc)) from exc

    async def python(self, code: str, *, timeout_s: float | None = None) -> CellResult:
        self._check()
        try:
            return await self.kernel.run(code, timeout_s)
        except KernelDied as exc:
            return CellResult("", "", exception="KernelDied", restarted=str(exc))

    async def digest(self, ignore: tuple[str, ...] = ()) -> str:
        self._check()
        code = layer_code("digest", {"top": ROOT, "ignore": list(ignore)})
        data = fsops_result(await self.backend.run_worker(self.container, self.spec, code, "python", None, ROOT, {}))
        if "error" in data or not isinstance(data.get("digest"), str):
            raise WorkspaceError(f"workspace digest failed: {data.get('error', data)}")
        return str(data["digest"])

    async def snapshot(self) -> bytes:
        self._check()
        return await self.backend.get_tar(self.container, snapshot_cap(self.spec.size_mb, self.spec.file_cap))

    async def grade(self, command: str, *, files: Mapping[str, str | bytes] | None = None,
                    timeout_s: float | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        self._check()
        started = time.monotonic()
        await self.kernel.close()
        try:
            await self.backend.sweep(self.container, KILL_ALL, strict=True)
            state = await self.snapshot()
            with grader_folder(files or {}) as folder:
                container = await self.backend.call(self.backend.create, self.spec, [(folder, GRADER_DIR)])
                try:
                    await self.backend.put_tar(container, state)
                    del state
                    return await self.backend.run_worker(container, self.spec, command, "bash", timeout_s, ROOT,
                                                         {**dict(self.spec.env), **dict(env or {})})
                finally:
                    await self.backend.remove_container(container)
        except Exception as exc:  # WorkspaceError, the Docker SDK's: the machinery, never the model's verdict
            return ExecResult.sandbox_error(f"the grader could not run: {type(exc).__name__}: {exc}",
                                            time.monotonic() - started)

    async def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        await self.kernel.close()
        await self.backend.remove_container(self.container)
        self.backend.live.discard(self)


class DockerWorkspaces(WorkspaceBackend):
    """The Docker backend (see the module doc). ``docker_host`` defaults to ``DOCKER_HOST``."""

    name = "docker"

    def __init__(self, *, docker_host: str | None = None, image: str = DEFAULT_IMAGE, threads: int = 8) -> None:
        try:
            import docker  # noqa: F401
        except ImportError as exc:
            raise SandboxUnavailableError("the docker Python SDK is missing: pip install 'docker>=7'") from exc
        self.docker_host = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self.image = image
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="agentrl-ws-docker")
        self._client: Any = None
        self.label = f"agentrl-workspace-{uuid.uuid4().hex[:10]}"
        self.live: set[DockerWorkspace] = set()
        self._count = 0
        self._closed = False
        try:
            self.seccomp: str | None = filter_b64()
        except SeccompUnsupported:
            self.seccomp = None

    async def call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker
            from docker.errors import DockerException

            try:
                client = docker.DockerClient(base_url=self.docker_host, version="auto", timeout=120)
                client.ping()
            except DockerException as exc:
                raise SandboxUnavailableError(f"no Docker daemon reachable at {self.docker_host} ({exc}); start one "
                                              "and set DOCKER_HOST") from exc
            self._client = client
        return self._client

    async def unavailable(self, container: Any, exc: BaseException) -> str:
        """What to tell the model when a call to ``container`` failed with ``exc``."""
        why = await self.call(death, container)
        if why is None:
            return f"docker exec failed: {type(exc).__name__}: {exc}"
        return f"the workspace's container is not running ({why}); its files and processes are gone"

    # -- containers -------------------------------------------------------------------------------
    def create(self, spec: WorkspaceSpec, extra_binds: list[tuple[str, str]] | None = None) -> Any:
        """A started workspace container for ``spec`` (``extra_binds``: more read-only bind mounts)."""
        from docker.errors import ImageNotFound

        lim = spec.limits
        image = spec.image or self.image
        mem = f"{lim.memory_mb + spec.kernel_memory_mb + spec.size_mb + lim.tmp_mb + WORKER_MEMORY_OVERHEAD_MB}m"
        binds = [*worker_binds(IN_SANDBOX), *program_binds(), *(extra_binds or [])]
        tmp_files = tmpfs_files(lim.tmp_mb << 20)
        try:
            container = self.client.containers.run(
                image, ["python3", "-I", "-S", f"{IN_SANDBOX}/worker.py", "reaper"], detach=True, network_mode="none",
                read_only=True, user=NOBODY, cap_drop=["ALL"], ipc_mode="private", shm_size=lim.tmp_mb << 20,
                tmpfs={"/tmp": f"size={lim.tmp_mb}m,nr_inodes={tmp_files},mode=1777,nosuid,nodev",
                       ROOT: f"size={spec.size_mb}m,nr_inodes={spec.file_cap},mode=0755,uid=65534,gid=65534,nosuid,nodev"},
                security_opt=["no-new-privileges"], mem_limit=mem, memswap_limit=mem,
                pids_limit=lim.max_processes * 2 + EXTRA_PIDS, nano_cpus=int(lim.cpu_cores * 1e9), environment={},
                volumes={host: {"bind": inside, "mode": "ro"} for host, inside in binds}, hostname="workspace",
                labels={"agentrl.workspace": self.label}, working_dir=ROOT)
        except ImageNotFound as exc:
            raise SandboxUnavailableError(f"workspace image {image!r} not found: {IMAGE_HINT}") from exc
        reap_container_with_this_process(container.id, self.docker_host)
        return container

    async def remove_container(self, container: Any) -> None:
        from docker.errors import DockerException

        def remove() -> None:
            try:
                container.remove(force=True)
            except DockerException:
                pass

        await self.call(remove)
        unreap_container(container.id)

    async def sweep(self, container: Any, program: str, *, strict: bool = False) -> None:
        """Runs a kill program (``docker_calls.KILL_*``) in ``container``; ``strict``: a
        :class:`WorkspaceError` unless it verified that nothing is left."""
        def run() -> int | None:
            return exec_io(self.client.api, container.id, ["python3", "-I", "-S", "-c", program], user=NOBODY,
                           limit=1 << 16, timeout_s=30.0)[1]

        try:
            code = await self.call(run)
        except Exception as exc:
            if strict:
                raise WorkspaceError(await self.unavailable(container, exc)) from exc
            return
        if strict and code != 0:
            raise WorkspaceError("the episode's processes could not all be killed")

    async def run_worker(self, container: Any, spec: WorkspaceSpec, code: str, language: str, timeout_s: float | None,
                         workdir: str, env: Mapping[str, str], script: str | None = None,
                         stdin: bytes | None = None) -> ExecResult:
        """One execution of the worker program in ``once`` mode (its own process group, killed after);
        the request goes on the exec's stdin, ``stdin`` is the program's input."""
        timeout = float(timeout_s or spec.limits.timeout_s)
        request = worker_request(code, language, timeout, spec.limits, memory_rlimit=False, nproc_rlimit=False)
        request.update(workdir=workdir, env=dict(env), **({"script": script} if script else {}))
        if stdin is not None:
            request["stdin"] = base64.b64encode(stdin).decode("ascii")
        argv = ["python3", "-I", "-S", f"{IN_SANDBOX}/worker.py", "once",
                *([f"--seccomp={self.seccomp}"] if self.seccomp else []), "-"]

        def run() -> bytes:
            return exec_io(self.client.api, container.id, argv, user=NOBODY, workdir=workdir, environment=PATH_ENV,
                           stdin=json.dumps(request).encode(), limit=frame_cap(spec.limits.max_output_bytes) * 2,
                           timeout_s=timeout + GRACE_S)[0]

        started = time.monotonic()
        try:
            data = json.loads(await asyncio.wait_for(self.call(run), timeout + GRACE_S))
            if not isinstance(data, dict):
                raise ValueError(f"the worker answered {type(data).__name__}")
        except (asyncio.TimeoutError, ValueError, OSError, WorkspaceError) as exc:
            return ExecResult.sandbox_error(f"docker exec failed: {exc!r}", time.monotonic() - started)
        except Exception as exc:  # the Docker SDK's errors (the container is gone, the daemon failed)
            return ExecResult.sandbox_error(await self.unavailable(container, exc), time.monotonic() - started)
        return result_from_worker(data, time.monotonic() - started)

    async def put_tar(self, container: Any, data: bytes) -> None:
        def put() -> None:
            out, code = exec_io(self.client.api, container.id, ["tar", "-x", "-C", ROOT], user=NOBODY, stdin=data,
                                limit=1 << 16)
            if code != 0:
                raise WorkspaceError(f"unpacking into {ROOT} failed: {out[-500:]!r}")

        try:
            await self.call(put)
        except WorkspaceError:
            raise
        except Exception as exc:
            raise WorkspaceError(await self.unavailable(container, exc)) from exc

    async def get_tar(self, container: Any, limit: int) -> bytes:
        """``/work`` as a tar (sparse files as their data: ``--sparse``); a :class:`WorkspaceError`
        past ``limit`` bytes."""
        def get() -> bytes:
            out, code = exec_io(self.client.api, container.id, ["tar", "-c", "--sparse", "-C", ROOT, "."], user=NOBODY,
                                limit=limit)
            if code != 0:
                raise WorkspaceError(f"archiving {ROOT} failed")
            return out

        try:
            return bytes(await self.call(get))
        except WorkspaceError:
            raise
        except Exception as exc:
            raise WorkspaceError(await self.unavailable(container, exc)) from exc

    # -- prepare and fork -------------------------------------------------------------------------
    async def prepare(self, spec: WorkspaceSpec, files: Mapping[str, bytes], key: str) -> Prepared:
        if self._closed:
            raise WorkspaceError("DockerWorkspaces: the backend is closed")
        started = time.perf_counter()
        container = await self.call(self.create, spec)
        try:
            if spec.base:
                await self.put_tar(container, await asyncio.to_thread(tar_folder, spec.base))
            if files:
                await self.put_tar(container, tar_files(files))
            for i, command in enumerate(spec.setup):
                result = await self.run_worker(container, spec, command, "bash", spec.setup_timeout_s, ROOT,
                                               dict(spec.env))
                if not result.ok:
                    why = "timed out" if result.timed_out else (result.killed_reason or f"exit status {result.exit_code}")
                    raise WorkspaceError(f"WorkspaceSpec.setup[{i}] {command!r} failed ({why}): "
                                         f"{(result.stderr or result.stdout).strip()[-1500:]}")
            state = await self.get_tar(container, snapshot_cap(spec.size_mb, spec.file_cap))
        finally:
            await self.remove_container(container)
        return Prepared(key, spec, state, setup_s=time.perf_counter() - started)

    async def fork(self, prepared: Prepared) -> DockerWorkspace:
        return await self.restore(prepared, prepared.handle)

    async def restore(self, prepared: Prepared, snapshot: bytes) -> DockerWorkspace:
        if self._closed:
            raise WorkspaceError("DockerWorkspaces: the backend is closed")
        container = await self.call(self.create, prepared.spec)
        try:
            await self.put_tar(container, snapshot)
        except BaseException:
            await self.remove_container(container)
            raise
        self._count += 1
        prepared.forks += 1
        ws = DockerWorkspace(prepared.spec, f"d{self._count}", container, self)
        self.live.add(ws)
        return ws

    async def release(self, prepared: Prepared) -> None:
        prepared.handle = b""

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ws in list(self.live):
            await ws.remove()
        if self._client is not None:
            await self.call(self._client.close)
        self._threads.shutdown(wait=False)

    def leftovers(self) -> dict[str, int]:
        if self._client is None:
            return {"containers": 0}
        found = self._client.containers.list(all=True, filters={"label": f"agentrl.workspace={self.label}"})
        return {"containers": len(found)}
