"""The default sandbox: a warm pool of bubblewrap-isolated workers that fork once per execution.

Each worker is ``/usr/bin/python3 -I -S worker.py`` inside ``bwrap --unshare-all``: its own user,
PID, network (loopback only), IPC, UTS and cgroup namespaces, an empty environment, the host's
``/usr`` read-only and nothing else of the host (no project, home, ``/etc`` or ``/root``). When the
host process is root it first drops to uid/gid 65534 with ``setpriv`` and, where cgroups are
usable, puts itself into a per-worker cgroup (memory, pids, CPU bandwidth) before exec'ing bwrap.

Per execution the worker forks a child that becomes PID 1 of a new PID namespace (nothing inside can
see or signal the worker, and every process the program starts dies with it), mounts a fresh
size-capped tmpfs on ``/tmp`` and its own ``/proc``, drops all capabilities and forks the program's
process, which sets rlimits (CPU time, file size, open files, and address space / process count
where cgroups are missing) and runs the code unmodified as ``<cell>``.

Example::

    async with BwrapSandbox(SandboxLimits(timeout_s=5), pool_size=4) as sandbox:
        result = await sandbox.run("print(6 * 7)")
        assert result.stdout == "42\\n"
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from typing import Any

from agentrl.tools.sandbox.base import (
    EXTRA_PIDS,
    WORKER_MEMORY_OVERHEAD_MB,
    WORKER_SOURCE,
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxLimits,
    SandboxUnavailableError,
    default_pool_size,
    result_from_worker,
    worker_request,
)
from agentrl.tools.sandbox.cgroups import CgroupSet, CgroupSupport, detect_cgroups
from agentrl.tools.sandbox.pool import WorkerError, WorkerLaunch, WorkerPool, process_tree_memory

__all__ = ["BwrapSandbox"]

log = logging.getLogger(__name__)

WORKER_IN_SANDBOX = "/opt/agentrl/worker.py"
NOBODY = 65534
INSTALL_HINT = "install it with `apt-get install bubblewrap` (the project's scripts/setup.sh does this)"


class BwrapSandbox(Sandbox):
    """Bubblewrap warm-pool backend. ``pool_size`` workers, at most ``max_concurrency`` executions
    at a time (default: the pool size). ``use_cgroups=False`` forces rlimit-only limits."""

    backend = "bwrap"

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        pool_size: int | None = None,
        max_concurrency: int | None = None,
        python: str = "/usr/bin/python3",
        use_cgroups: bool = True,
        recycle_after: int = 1000,
        bwrap: str | None = None,
    ) -> None:
        super().__init__(limits or SandboxLimits())
        found = bwrap or shutil.which("bwrap")
        if found is None or not os.access(found, os.X_OK):
            raise SandboxUnavailableError(f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}")
        if not python.startswith("/usr/") or not os.access(python, os.X_OK):
            raise SandboxUnavailableError(
                f"BwrapSandbox(python=...): expected an executable interpreter under /usr (only /usr is "
                f"visible in the sandbox), got {python!r}; install Debian's python3 (`apt-get install python3`)")
        self._bwrap = found
        self._bwrap_version = _bwrap_version(found)
        _bwrap_help(found)  # cached now, not on the event loop later
        self._python = python
        self._root = os.geteuid() == 0
        self._setpriv = shutil.which("setpriv") if self._root else None
        if self._root and self._setpriv is None:
            raise SandboxUnavailableError("running as root needs setpriv (util-linux) to drop to uid 65534")
        support = detect_cgroups() if use_cgroups else CgroupSupport(None, frozenset(), reason="disabled")
        self._cgroup_support = support
        _warn_missing_controllers(support, use_cgroups)
        self._cgroups: CgroupSet | None = None  # created with the first worker, removed by close()
        size = pool_size or default_pool_size()
        self._pool = WorkerPool(self._launch, size=size, max_concurrency=max_concurrency or size,
                                recycle_after=recycle_after, on_release=self._release_cgroup)

    @property
    def pool_size(self) -> int:
        return self._pool.size

    def _has(self, ctrl: str) -> bool:
        return ctrl in self._cgroup_support.controllers

    def bwrap_argv(self) -> list[str]:
        """The bwrap command line of one worker (without the cgroup/uid prefix)."""
        # --disable-userns (bubblewrap >= 0.8): the program cannot create nested user namespaces.
        nested = ["--unshare-user", "--disable-userns"] if "--disable-userns" in _bwrap_help(self._bwrap) else []
        argv = [self._bwrap, "--unshare-all", *nested, "--die-with-parent", "--new-session",
                "--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP",
                "--ro-bind", "/usr", "/usr"]
        for name in ("lib", "lib64", "lib32", "bin", "sbin"):
            if os.path.islink(f"/{name}") or os.path.isdir(f"/usr/{name}"):
                argv += ["--symlink", f"usr/{name}", f"/{name}"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                 "--ro-bind", str(WORKER_SOURCE), WORKER_IN_SANDBOX,
                 "--hostname", "sandbox", "--clearenv",
                 "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
                 "--setenv", "LANG", "C.UTF-8", "--chdir", "/tmp",
                 self._python, "-I", "-S", WORKER_IN_SANDBOX, "--sweep"]
        return argv

    def _launch(self, index: int) -> WorkerLaunch:
        argv = self.bwrap_argv()
        if self._setpriv is not None:
            argv = [self._setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
        cgroup = None
        if self._cgroups is None and self._cgroup_support.version is not None:
            self._cgroups = CgroupSet(self._cgroup_support)
        if self._cgroups is not None:
            lim = self.limits
            cgroup = self._cgroups.worker(index, (lim.memory_mb + WORKER_MEMORY_OVERHEAD_MB) << 20,
                                          lim.max_processes + EXTRA_PIDS, lim.cpu_cores)
            moves = " && ".join(f"echo $$ > {shlex.quote(str(p))}" for p in cgroup.procs_files())
            argv = ["/bin/sh", "-c", f'{moves} && exec "$@"', "sh", *argv]
        return WorkerLaunch(argv, cgroup, hint=self._hint())

    def _hint(self) -> str:
        return ("bubblewrap could not create its namespaces; it needs unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; on Ubuntu also "
                "kernel.apparmor_restrict_unprivileged_userns=0) or "
                f"{INSTALL_HINT}")

    def _release_cgroup(self, launch: WorkerLaunch) -> None:
        if launch.cgroup is not None and self._cgroups is not None:
            self._cgroups.release(launch.cgroup)

    async def start(self) -> None:
        await self._pool.start()

    async def run(self, code: str, *, language: str = "python", timeout_s: float | None = None) -> ExecResult:
        timeout = self._check_request(code, language, timeout_s)
        request = worker_request(code, language, timeout, self.limits, memory_rlimit=not self._has("memory"),
                                 nproc_rlimit=not self._has("pids"))
        started = time.monotonic()

        async def oom_before(launch: WorkerLaunch) -> tuple[WorkerLaunch, int]:
            return launch, launch.cgroup.oom_kills() if launch.cgroup is not None else 0

        try:
            data, (launch, oom_start) = await self._pool.execute(request, timeout, before=oom_before)
        except WorkerError as exc:
            return ExecResult.sandbox_error(str(exc), time.monotonic() - started)
        result = result_from_worker(data, time.monotonic() - started)
        if (result.signal == signal.SIGKILL and result.killed_reason == "signal" and launch.cgroup is not None
                and launch.cgroup.oom_kills() > oom_start):
            result.killed_reason = "memory"  # the cgroup OOM killer (the child's oom_score_adj is 1000)
        return result

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._pool.close()
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.close)
            self._cgroups = None

    def memory_usage(self) -> dict[str, int]:
        """RSS/PSS of the whole warm pool (every worker's process tree), in bytes."""
        return process_tree_memory(self._pool.pids())

    def worker_pids(self) -> list[int]:
        return self._pool.pids()

    def cgroup_dirs(self) -> list[str]:
        """The parent cgroup directories this sandbox created (empty once closed)."""
        return [str(p) for p in self._cgroups.parents()] if self._cgroups is not None else []

    def capabilities(self) -> Capabilities:
        cg = self._cgroup_support
        info = self._pool.first_info
        per_exec_ns = bool(info.get("namespaces", True))
        cg_name = f"cgroup v{cg.version}" if cg.version else ""
        enforced = {
            "network": "bwrap --unshare-net: own network namespace, loopback only",
            "filesystem": "host /usr read-only; no /etc, /root, /home or project; private tmpfs /tmp "
                          + ("per execution" if per_exec_ns else "per worker"),
            "environment": "bwrap --clearenv (PATH, HOME, LANG only)",
            "processes_visible": "PID namespace per execution" if per_exec_ns else "PID namespace per worker",
            "user": f"host uid {NOBODY} via setpriv, user namespace" if self._setpriv else
                    f"host uid {os.geteuid()} (unprivileged), user namespace",
            "capabilities": "all dropped before user code; no_new_privs",
            "nested_user_namespaces": "blocked (bwrap --disable-userns)" if "--disable-userns" in
                                      _bwrap_help(self._bwrap) else "allowed (bubblewrap < 0.8)",
            "wall_time": "worker deadline, SIGKILL of the execution's PID namespace",
            "cpu_time": "RLIMIT_CPU",
            "output": "captured by the worker, capped at max_output_bytes per stream",
            "file_size": "RLIMIT_FSIZE",
            "tmp_size": "tmpfs size= on /tmp" if per_exec_ns else "RLIMIT_FSIZE only",
            "memory": f"{cg_name} memory limit per worker" if self._has("memory") else "RLIMIT_AS",
            "processes": f"{cg_name} pids.max per worker" if self._has("pids") else
                         "RLIMIT_NPROC (per user namespace)",
        }
        not_enforced: dict[str, str] = {}
        if self._has("cpu"):
            enforced["cpu_share"] = f"{cg_name} CPU bandwidth ({self.limits.cpu_cores} cores per worker)"
        else:
            not_enforced["cpu_share"] = f"no usable cpu cgroup controller ({cg.reason or 'disabled'})"
        details: dict[str, Any] = {
            "cgroup_version": cg.version, "cgroup_layout": cg.layout, "cgroup_controllers": sorted(cg.controllers),
            "cgroup_v2_delegation": cg.v2_delegation, "cgroup_note": cg.reason,
            "pool_size": self._pool.size, "python": self._python, "worker": info,
            "bwrap_version": self._bwrap_version,
        }
        return Capabilities("bwrap", enforced, not_enforced, details)


@functools.lru_cache(maxsize=4)
def _warn_missing_controllers(support: CgroupSupport, use_cgroups: bool) -> None:
    """Says once per process which limits fall back to rlimits or are not enforced at all."""
    missing = sorted({"memory", "pids", "cpu"} - set(support.controllers))
    if missing:
        log.warning("bwrap sandbox: no cgroup for %s (%s); memory falls back to RLIMIT_AS, processes to "
                    "RLIMIT_NPROC, and the per-worker CPU share is not enforced. See sandbox.capabilities().",
                    ", ".join(missing), support.reason if use_cgroups else "cgroups disabled by use_cgroups=False")


@functools.lru_cache(maxsize=8)
def _bwrap_help(path: str) -> str:
    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=5, check=False)
        return out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.lru_cache(maxsize=8)
def _bwrap_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5, check=False)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
