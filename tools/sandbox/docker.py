"""The Docker backend: a pool of warm containers, one ``docker exec`` per execution.

Each container runs the worker program's ``reaper`` as PID 1 (it reaps killed leftovers) from the
sandbox image (see ``tools/image``) with ``--network none``, a private IPC namespace, a read-only
root, size-capped tmpfs ``/tmp`` and ``/dev/shm``, uid/gid 65534, every capability dropped,
``no-new-privileges``, Docker's default seccomp profile and cgroup limits on memory (no swap),
processes and CPU. The sandbox's worker program is bind-mounted read-only and runs each request in
``once`` mode: it forks the code with rlimits, the project's own seccomp filter and a deadline,
captures both streams with a cap, and afterwards resets the container: it kills every process left,
empties ``/tmp`` and ``/dev/shm`` whatever permissions the program set, removes every SysV IPC
object and POSIX message queue, and verifies all of it. A container is replaced, never reused,
when that verification fails, when the call hit the memory limit, or when the exec misbehaved; a
container cannot get fresh namespaces per call, so this reset is what keeps calls apart.

The Docker SDK is synchronous; every call runs on this sandbox's own thread pool, so the event loop
never blocks. Requires a reachable daemon (``docker_host`` or ``DOCKER_HOST``) and the image.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrl.tools.sandbox.base import (
    EXTRA_PIDS,
    WORKER_MEMORY_OVERHEAD_MB,
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailableError,
    default_pool_size,
    result_from_worker,
    retire_reason,
    tmpfs_files,
    worker_binds,
    worker_request,
)
from agentrl.tools.sandbox.cgroups import memory_cgroup_of, read_oom_kills
from agentrl.tools.sandbox.seccomp import BLOCKED, SeccompUnsupported, filter_b64

__all__ = ["DEFAULT_IMAGE", "DockerSandbox"]

DEFAULT_IMAGE = "agentrl/sandbox:bookworm"
WORKER_DIR = "/opt/agentrl"
WORKER_IN_CONTAINER = f"{WORKER_DIR}/worker.py"
NOBODY = "65534:65534"
ARG_CHUNK = 64 * 1024  # below the kernel's 128 KiB limit on one argument
GRACE_S = 10.0
IMAGE_HINT = ("build it with `tools/image/build_offline.sh` (no registry needed) or "
              "`docker build -t agentrl/sandbox:bookworm tools/image`")


class DockerSandbox(Sandbox):
    """Warm container pool. ``docker_host`` defaults to ``DOCKER_HOST`` or the local socket."""

    backend = "docker"

    def __init__(self, limits: SandboxLimits | None = None, *, pool_size: int | None = None,
                 max_concurrency: int | None = None, image: str = DEFAULT_IMAGE,
                 docker_host: str | None = None) -> None:
        super().__init__(limits or SandboxLimits())
        try:
            import docker  # noqa: F401
        except ImportError as exc:
            raise SandboxUnavailableError("the docker Python SDK is missing: pip install 'docker>=7'") from exc
        self.image = image
        self.docker_host = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self.pool_size = pool_size or default_pool_size()
        self._sem = asyncio.Semaphore(min(self.pool_size, max_concurrency or self.pool_size))
        self._threads = ThreadPoolExecutor(max_workers=self.pool_size + 2, thread_name_prefix="agentrl-docker")
        self._client: Any = None
        self._idle: list[Any] = []
        self._all: dict[str, Any] = {}
        self._memory_cgroups: dict[str, tuple[Path, int] | None] = {}
        self._label = f"agentrl-sandbox-{uuid.uuid4().hex[:10]}"
        self._start_lock = asyncio.Lock()
        self._started = False
        self._removals: set[asyncio.Future[Any]] = set()
        self.replaced = 0
        self.retired: dict[str, int] = {}
        try:
            self._seccomp: str | None = filter_b64()
            self._seccomp_note = ""
        except SeccompUnsupported as exc:
            self._seccomp, self._seccomp_note = None, str(exc)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, lambda: fn(*args, **kwargs))

    def _connect(self) -> Any:
        import docker
        from docker.errors import DockerException, ImageNotFound

        try:
            client = docker.DockerClient(base_url=self.docker_host, version="auto", timeout=60)
            client.ping()
        except DockerException as exc:
            raise SandboxUnavailableError(
                f"no Docker daemon reachable at {self.docker_host} ({exc}); start one (`dockerd`, or the test "
                f"helper agentrl.tools.sandbox.dockerd.PrivateDockerDaemon) and set DOCKER_HOST") from exc
        try:
            client.images.get(self.image)
        except ImageNotFound as exc:
            client.close()
            raise SandboxUnavailableError(f"sandbox image {self.image!r} not found: {IMAGE_HINT}") from exc
        return client

    def _create_container(self) -> Any:
        lim = self.limits
        mem = f"{lim.memory_mb + WORKER_MEMORY_OVERHEAD_MB}m"
        container = self._client.containers.run(
            self.image, ["python3", "-I", "-S", WORKER_IN_CONTAINER, "reaper"], detach=True, network_mode="none", read_only=True,
            tmpfs={"/tmp": f"size={lim.tmp_mb}m,nr_inodes={tmpfs_files(lim.tmp_mb << 20)},mode=1777,nosuid,nodev"},
            user=NOBODY, cap_drop=["ALL"],
            ipc_mode="private", shm_size=lim.tmp_mb << 20,
            security_opt=["no-new-privileges"], mem_limit=mem, memswap_limit=mem,
            pids_limit=lim.max_processes + EXTRA_PIDS, nano_cpus=int(lim.cpu_cores * 1e9), environment={},
            volumes={host: {"bind": inside, "mode": "ro"} for host, inside in worker_binds(WORKER_DIR)},
            hostname="sandbox", labels={"agentrl.sandbox": self._label}, working_dir="/tmp",
        )
        self._memory_cgroups[container.id] = self._find_memory_cgroup(container)
        return container

    @staticmethod
    def _find_memory_cgroup(container: Any) -> tuple[Path, int] | None:
        """The container's memory cgroup on this host (cgroupfs or systemd driver, v1 or v2), found
        from its init process; ``None`` when the daemon's processes are not visible from here."""
        from docker.errors import DockerException

        try:
            container.reload()  # the attributes from create() predate start(): no PID yet
            pid = int(container.attrs["State"]["Pid"])
        except (DockerException, KeyError, TypeError, ValueError):
            return None
        found = memory_cgroup_of(pid) if pid > 0 else None
        # the PID is the daemon's; another PID namespace may show an unrelated process under it
        return found if found is not None and container.id in str(found[0]) else None

    async def start(self) -> None:
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise RuntimeError("DockerSandbox.start: the sandbox is closed")
            self._client = await self._call(self._connect)
            created = await asyncio.gather(*(self._call(self._create_container) for _ in range(self.pool_size)),
                                           return_exceptions=True)
            containers = [c for c in created if not isinstance(c, BaseException)]
            errors = [c for c in created if isinstance(c, BaseException)]
            if errors:
                await asyncio.gather(*(self._call(self._remove, c) for c in containers))
                raise SandboxUnavailableError(f"cannot start sandbox containers from {self.image!r}: {errors[0]!r}")
            for c in containers:
                self._all[c.id] = c
            self._idle.extend(containers)
            self._started = True

    def _exec(self, container: Any, request: dict[str, Any]) -> tuple[bytes, bytes]:
        payload = base64.b64encode(json.dumps(request).encode()).decode("ascii")
        chunks = [payload[i:i + ARG_CHUNK] for i in range(0, len(payload), ARG_CHUNK)] or [""]
        api = self._client.api
        flags = ["--sweep"] + ([f"--seccomp={self._seccomp}"] if self._seccomp else [])
        exec_id = api.exec_create(container.id, ["python3", "-I", "-S", WORKER_IN_CONTAINER, "once", *flags,
                                                 *chunks], user=NOBODY, workdir="/tmp",
                                  environment={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"})["Id"]
        out, err = api.exec_start(exec_id, demux=True)
        return out or b"", err or b""

    def _oom_kills(self, container: Any) -> int:
        """OOM kills in the container's memory cgroup so far; -1 when it cannot be read from here."""
        where = self._memory_cgroups.get(container.id)
        kills = read_oom_kills(*where) if where is not None else None
        return -1 if kills is None else kills

    async def run(self, code: str, *, language: str = "python", timeout_s: float | None = None) -> ExecResult:
        timeout = self._check_request(code, language, timeout_s)
        request = worker_request(code, language, timeout, self.limits, memory_rlimit=False, nproc_rlimit=False)
        await self.start()
        async with self._sem:
            container = self._idle.pop(0) if self._idle else await self._fresh_container()
            started = time.monotonic()
            oom_start = self._oom_kills(container)
            try:
                out, err = await asyncio.wait_for(self._call(self._exec, container, request), timeout + GRACE_S)
                data = json.loads(out)
                if not isinstance(data, dict):
                    raise ValueError(f"expected a JSON object from the runner, got {out[:200]!r}")
            except BaseException as exc:
                self.replaced += 1
                await asyncio.shield(self._replace(container))
                if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
                    raise
                detail = err.decode("utf-8", "replace")[-2000:] if "err" in locals() else ""
                return ExecResult.sandbox_error(f"docker exec failed: {exc!r} {detail}".strip(),
                                                time.monotonic() - started)
            if (data.get("signal") == signal.SIGKILL and data.get("killed_reason") == "signal"
                    and self._oom_kills(container) > oom_start >= 0):
                data["killed_reason"] = "memory"
            reason = retire_reason(data)
            if reason is None:
                self._idle.append(container)
            else:  # removed in the background; run() creates a fresh container when the pool runs dry
                self.replaced += 1
                self.retired[reason] = self.retired.get(reason, 0) + 1
                removal = asyncio.ensure_future(self._replace(container))
                self._removals.add(removal)
                removal.add_done_callback(self._removals.discard)
        return result_from_worker(data, time.monotonic() - started)

    async def _fresh_container(self) -> Any:
        fresh = await self._call(self._create_container)
        self._all[fresh.id] = fresh
        return fresh

    async def _replace(self, container: Any) -> None:
        """Removes a container that misbehaved; its replacement is created on demand by ``run``."""
        self._all.pop(container.id, None)
        self._memory_cgroups.pop(container.id, None)
        await self._call(self._remove, container)

    @staticmethod
    def _remove(container: Any) -> None:
        from docker.errors import DockerException

        try:
            container.remove(force=True)
        except DockerException:
            pass

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._removals:
            await asyncio.gather(*self._removals, return_exceptions=True)
        containers = list(self._all.values())
        self._all.clear()
        self._memory_cgroups.clear()
        self._idle.clear()
        if containers:
            await asyncio.gather(*(self._call(self._remove, c) for c in containers))
        if self._client is not None:
            await self._call(self._client.close)
        self._threads.shutdown(wait=False)

    def container_ids(self) -> list[str]:
        return list(self._all)

    async def container_processes(self) -> dict[str, list[str]]:
        """The command lines of the processes running in each pool container (``docker top``)."""

        def top() -> dict[str, list[str]]:
            out: dict[str, list[str]] = {}
            for cid in list(self._all):
                titles_procs = self._client.api.top(cid)
                out[cid] = [row[-1] for row in titles_procs.get("Processes") or []]
            return out

        return await self._call(top) if self._client is not None else {}

    def capabilities(self) -> Capabilities:
        lim = self.limits
        enforced = {
            "network": "--network none (loopback only)",
            "filesystem": f"read-only image root; tmpfs /tmp and /dev/shm ({lim.tmp_mb} MiB each), emptied and "
                          "verified empty after every execution; no host paths except the read-only worker program",
            "environment": "empty container environment; exec gets PATH and LANG only",
            "user": "uid/gid 65534, --cap-drop ALL, no-new-privileges",
            "processes_visible": "container PID namespace; leftovers killed after each execution",
            "ipc": "--ipc private; SysV objects and POSIX message queues removed after each execution",
            "wall_time": "runner deadline, SIGKILL of the process group",
            "cpu_time": "RLIMIT_CPU",
            "memory": f"container cgroup memory limit ({lim.memory_mb + WORKER_MEMORY_OVERHEAD_MB} MiB, no swap)",
            "processes": f"--pids-limit {lim.max_processes + EXTRA_PIDS}",
            "cpu_share": f"--cpus {lim.cpu_cores}",
            "output": "captured by the runner, capped at max_output_bytes per stream",
            "file_size": "RLIMIT_FSIZE",
            "tmp_size": "tmpfs size= (/tmp), --shm-size (/dev/shm)",
        }
        not_enforced: dict[str, str] = {}
        if self._seccomp is not None:
            enforced["seccomp"] = f"Docker's default profile, plus per execution EPERM for {', '.join(BLOCKED)}"
        else:
            enforced["seccomp"] = f"Docker's default profile only ({self._seccomp_note})"
        reset = "emptied after every execution and verified; the container is replaced when it cannot be"
        scopes = {
            "tmp": f"worker: the container's tmpfs /tmp, {reset}",
            "dev_shm": f"worker: the container's /dev/shm, {reset}",
            "ipc": "worker: the container's private IPC namespace; SysV objects and POSIX message queues removed "
                   "after every execution and verified, else the container is replaced",
            "processes": "worker: the container's PID namespace; every leftover process killed after each execution",
            "network": "worker: the container's network namespace, loopback only",
            "hostname": "worker: the container's UTS namespace (cannot be changed without capabilities)",
            "keyrings": "execution: unreachable (keyctl, add_key and request_key blocked by Docker's seccomp profile)",
            "seccomp": "execution: Docker's profile for the container, the project's filter per execution"
                       if self._seccomp else "worker: Docker's default profile",
            "interpreter": "execution: a process forked by the exec'd runner",
            "root_filesystem": "worker: the image's root, read-only",
            "user_namespace": "host: uid 65534 of the host's user namespace (no user-namespace remapping)",
            "cgroup": "worker: the container's memory, pids and CPU limits; a call that hits the memory limit "
                      "retires the container",
            "image": "pool: every container starts from the same image",
            "worker_program": "pool: the same read-only worker program in every container",
            "kernel": "host: the host's kernel, narrowed by the seccomp filters",
        }
        return Capabilities("docker", enforced, not_enforced,
                            {"image": self.image, "docker_host": self.docker_host, "pool_size": self.pool_size},
                            scopes)
