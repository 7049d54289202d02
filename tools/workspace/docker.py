"""Workspaces on Docker: one container per episode, its ``/work`` a size-capped tmpfs.

Docker on ext4 has no per-container disk quota, so ``/work`` is a tmpfs (``size_mb``, RAM, counted in
the container's memory limit), which also means a fork is a *copy*, not copy-on-write: *prepare*
runs a container once (the base folder and the task's files streamed in as a tar, then the setup
commands), keeps the resulting ``/work`` as a tar in memory, and removes that container; each
*fork* is a new container with that tar unpacked into its ``/work``. Containers run as the stateless
sandbox's do (``--network none``, read-only root, uid 65534, all capabilities dropped,
``no-new-privileges``, Docker's seccomp profile plus the project's filter per command, memory, pids
and CPU limits), from ``WorkspaceSpec.image`` or the sandbox image.

Commands and file operations are ``docker exec`` of the sandbox worker program (``once`` mode, in
``/work``, a process group of their own that is killed when the call ends); unlike the stateless
backend the container is not swept between calls, since its ``/work``, ``/tmp`` and kernel are the
episode's. The kernel is a long-lived ``docker exec`` attached to a socket; its memory cap is
``RLIMIT_AS``. Every container is registered with the reaper (removed if the owning process dies)
and removed with its workspace.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import socket
import struct
import tarfile
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
    worker_binds,
    worker_request,
)
from agentrl.tools.sandbox.docker import DEFAULT_IMAGE, IMAGE_HINT
from agentrl.tools.sandbox.seccomp import SeccompUnsupported, filter_b64
from agentrl.tools.workspace.base import (
    ROOT,
    CellResult,
    Prepared,
    Workspace,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceSpec,
)
from agentrl.tools.workspace.kernel import Kernel, KernelDied
from agentrl.tools.workspace.programs import IN_SANDBOX, fsops_code, fsops_result, program_binds

__all__ = ["DockerWorkspaces"]

NOBODY = "65534:65534"
ARG_CHUNK = 64 * 1024
GRACE_S = 10.0
PATH_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


class _DockerChannel:
    """A kernel's attached ``docker exec`` socket (``KernelChannel``): stdin raw, stdout multiplexed."""

    def __init__(self, backend: DockerWorkspaces, container: Any, sock: Any) -> None:
        self.backend, self.container, self.sock = backend, container, sock
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
                stream = head[0]
                if stream != 1:  # stderr is not attached; anything else is skipped
                    self._recv_exact(self._frame_left)
                    self._frame_left = 0
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
        if self.pid is not None:  # the kernel leads its own process group: its leftovers go with it
            try:
                await self.backend.exec_simple(self.container, ["/bin/sh", "-c", f"kill -9 -{self.pid} {self.pid}"])
            except Exception:
                pass
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
        result = await self.backend.run_worker(self.container, self.spec, fsops_code(op, arguments), "python",
                                               None, ROOT, {})
        return fsops_result(result)

    async def _start_kernel(self) -> _DockerChannel:
        spec, backend = self.spec, self.backend
        argv = ["python3", "-I", "-S", f"{IN_SANDBOX}/kernel.py", f"--cwd={ROOT}", f"--memory={spec.kernel_memory_mb << 20}",
                f"--max-files={spec.limits.max_open_files}", *([f"--seccomp={backend.seccomp}"] if backend.seccomp else [])]

        def start() -> Any:
            api = backend.client.api
            exec_id = api.exec_create(self.container.id, argv, stdin=True, stdout=True, stderr=False, user=NOBODY,
                                      workdir=ROOT, environment={**PATH_ENV, **dict(spec.env)})["Id"]
            sock = api.exec_start(exec_id, socket=True)
            return getattr(sock, "_sock", sock)

        return _DockerChannel(backend, self.container, await backend.call(start))

    async def python(self, code: str, *, timeout_s: float | None = None) -> CellResult:
        self._check()
        try:
            return await self.kernel.run(code, timeout_s)
        except KernelDied as exc:
            return CellResult("", "", exception="KernelDied", restarted=str(exc))

    async def digest(self, ignore: tuple[str, ...] = ()) -> str:
        self._check()
        code = _DIGEST_CODE.replace("IGNORE", repr(list(ignore)))
        result = await self.backend.run_worker(self.container, self.spec, code, "python", None, ROOT, {})
        if not result.ok:
            raise WorkspaceError(f"workspace digest failed: {result.stderr.strip()[-500:]}")
        return result.stdout.strip()

    async def snapshot(self) -> bytes:
        self._check()
        return await self.backend.get_tar(self.container)

    async def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        await self.kernel.close()
        await self.backend.remove_container(self.container)
        self.backend.live.discard(self)


# A hash of /work (every path, type, mode, content, symlink target; not times), as _holder.digest.
_DIGEST_CODE = """import fnmatch, hashlib, os, stat
ignore = IGNORE
h = hashlib.sha256()
for root, dirs, files in os.walk('/work'):
    dirs[:] = sorted(d for d in dirs if not any(fnmatch.fnmatchcase(d, p) for p in ignore))
    for name in sorted(dirs + files):
        if any(fnmatch.fnmatchcase(name, p) for p in ignore):
            continue
        path = os.path.join(root, name)
        st = os.lstat(path)
        payload = b''
        if stat.S_ISLNK(st.st_mode):
            payload = os.fsencode(os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            with open(path, 'rb') as f:
                payload = f.read()
        h.update(f"{os.path.relpath(path, '/work')}\\0{stat.S_IFMT(st.st_mode)}\\0{st.st_mode & 0o7777:o}\\0".encode())
        h.update(hashlib.sha256(payload).digest())
print(h.hexdigest())
"""


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

    # -- containers -------------------------------------------------------------------------------
    def _create(self, spec: WorkspaceSpec) -> Any:
        from docker.errors import ImageNotFound

        lim = spec.limits
        image = spec.image or self.image
        mem = f"{lim.memory_mb + spec.kernel_memory_mb + spec.size_mb + lim.tmp_mb + WORKER_MEMORY_OVERHEAD_MB}m"
        binds = [*worker_binds(IN_SANDBOX), *program_binds()]
        try:
            container = self.client.containers.run(
                image, ["python3", "-I", "-S", f"{IN_SANDBOX}/worker.py", "reaper"], detach=True, network_mode="none",
                read_only=True, user=NOBODY, cap_drop=["ALL"], ipc_mode="private", shm_size=lim.tmp_mb << 20,
                tmpfs={"/tmp": f"size={lim.tmp_mb}m,mode=1777,nosuid,nodev",
                       ROOT: f"size={spec.size_mb}m,mode=0755,uid=65534,gid=65534,nosuid,nodev"},
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

    async def exec_simple(self, container: Any, argv: list[str]) -> int:
        def run() -> int:
            return int(container.exec_run(argv, user=NOBODY).exit_code)

        return int(await self.call(run))

    async def run_worker(self, container: Any, spec: WorkspaceSpec, code: str, language: str, timeout_s: float | None,
                         workdir: str, env: Mapping[str, str], script: str | None = None) -> ExecResult:
        """One execution of the worker program in ``once`` mode (its own process group, killed after)."""
        timeout = float(timeout_s or spec.limits.timeout_s)
        request = worker_request(code, language, timeout, spec.limits, memory_rlimit=False, nproc_rlimit=False)
        request.update(workdir=workdir, env=dict(env), **({"script": script} if script else {}))
        payload = base64.b64encode(json.dumps(request).encode()).decode("ascii")
        chunks = [payload[i:i + ARG_CHUNK] for i in range(0, len(payload), ARG_CHUNK)]
        argv = ["python3", "-I", "-S", f"{IN_SANDBOX}/worker.py", "once",
                *([f"--seccomp={self.seccomp}"] if self.seccomp else []), *chunks]

        def run() -> tuple[bytes, bytes]:
            api = self.client.api
            exec_id = api.exec_create(container.id, argv, user=NOBODY, workdir=workdir, environment=PATH_ENV)["Id"]
            out, err = api.exec_start(exec_id, demux=True)
            return out or b"", err or b""

        started = time.monotonic()
        try:
            out, _ = await asyncio.wait_for(self.call(run), timeout + GRACE_S)
            data = json.loads(out)
        except (asyncio.TimeoutError, ValueError, OSError) as exc:
            return ExecResult.sandbox_error(f"docker exec failed: {exc!r}", time.monotonic() - started)
        except Exception as exc:  # the Docker SDK's errors (the container is gone, the daemon failed)
            return ExecResult.sandbox_error(f"docker exec failed: {type(exc).__name__}: {exc}", time.monotonic() - started)
        return result_from_worker(data, time.monotonic() - started)

    async def put_tar(self, container: Any, data: bytes) -> None:
        def put() -> bytes:
            api = self.client.api
            exec_id = api.exec_create(container.id, ["tar", "-x", "-C", ROOT], stdin=True, stdout=True, stderr=True,
                                      user=NOBODY)["Id"]
            sock = api.exec_start(exec_id, socket=True)
            raw = getattr(sock, "_sock", sock)
            raw.sendall(data)
            raw.shutdown(socket.SHUT_WR)
            out = b""
            while chunk := raw.recv(1 << 16):
                out += chunk
            raw.close()
            if api.exec_inspect(exec_id).get("ExitCode") != 0:
                raise WorkspaceError(f"unpacking into {ROOT} failed: {out[-500:]!r}")
            return out

        await self.call(put)

    async def get_tar(self, container: Any) -> bytes:
        def get() -> bytes:
            api = self.client.api
            exec_id = api.exec_create(container.id, ["tar", "-c", "-C", ROOT, "."], user=NOBODY, stderr=False)["Id"]
            sock = api.exec_start(exec_id, socket=True)
            raw = getattr(sock, "_sock", sock)
            out = _demux_stdout(raw)  # (the SDK's demux joins frames one by one: quadratic for a big tar)
            raw.close()
            if api.exec_inspect(exec_id).get("ExitCode") != 0:
                raise WorkspaceError(f"archiving {ROOT} failed")
            return out

        return bytes(await self.call(get))

    # -- prepare and fork -------------------------------------------------------------------------
    async def prepare(self, spec: WorkspaceSpec, files: Mapping[str, bytes], key: str) -> Prepared:
        if self._closed:
            raise WorkspaceError("DockerWorkspaces: the backend is closed")
        started = time.perf_counter()
        container = await self.call(self._create, spec)
        try:
            if spec.base:
                await self.put_tar(container, await asyncio.to_thread(_tar_folder, spec.base))
            if files:
                await self.put_tar(container, _tar_files(files))
            for i, command in enumerate(spec.setup):
                result = await self.run_worker(container, spec, command, "bash", spec.setup_timeout_s, ROOT,
                                               dict(spec.env))
                if not result.ok:
                    why = "timed out" if result.timed_out else (result.killed_reason or f"exit status {result.exit_code}")
                    raise WorkspaceError(f"WorkspaceSpec.setup[{i}] {command!r} failed ({why}): "
                                         f"{(result.stderr or result.stdout).strip()[-1500:]}")
            state = await self.get_tar(container)
        finally:
            await self.remove_container(container)
        return Prepared(key, spec, state, setup_s=time.perf_counter() - started)

    async def fork(self, prepared: Prepared) -> DockerWorkspace:
        return await self.restore(prepared, prepared.handle)

    async def restore(self, prepared: Prepared, snapshot: bytes) -> DockerWorkspace:
        if self._closed:
            raise WorkspaceError("DockerWorkspaces: the backend is closed")
        container = await self.call(self._create, prepared.spec)
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


def _demux_stdout(sock: Any) -> bytes:
    """The stdout frames of an attached ``docker exec`` stream (8-byte headers), until it closes."""
    out, pending = bytearray(), bytearray()
    while chunk := sock.recv(1 << 20):
        pending += chunk
        while len(pending) >= 8:
            size = struct.unpack(">I", pending[4:8])[0]
            if len(pending) < 8 + size:
                break
            if pending[0] == 1:
                out += pending[8:8 + size]
            del pending[:8 + size]
    return bytes(out)


def _tar_folder(folder: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in sorted(os.listdir(folder)):
            tf.add(os.path.join(folder, name), arcname=name, filter=_owned)
    return buf.getvalue()


def _owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 65534
    info.uname = info.gname = ""
    return info


def _tar_files(files: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path, data in sorted(files.items()):
            info = _owned(tarfile.TarInfo(path))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
