"""The default sandbox: a warm pool of bubblewrap-isolated workers, a fresh sandbox per execution.

Each worker is ``/usr/bin/python3 -I -S worker.py`` inside ``bwrap --unshare-all``: its own user,
PID, network, IPC, UTS and cgroup namespaces, an empty environment, a read-only root (bwrap's
tmpfs, remounted read-only) holding the host's ``/usr`` (and the symlinks of ``/etc/alternatives``)
read-only, a read-only ``/dev`` and nothing else of the host (no project, home, other ``/etc`` or
``/root``). When the host process is root
it first drops to uid/gid 65534 with ``setpriv`` and, where cgroups are usable, puts itself into a
per-worker cgroup (memory, pids, CPU bandwidth) before exec'ing bwrap.

Per execution the worker forks a child (prepared while the previous execution runs) that gets
fresh mount, IPC, UTS and PID namespaces: its only writable mounts are its own size-capped tmpfs
``/tmp`` and ``/dev/shm``, its ``/proc`` and ``/dev/pts``; SysV IPC and message queues are its
own; the network namespace (loopback only) is the worker's, and a worker that still lists a TCP
socket after a call (``TIME_WAIT``) is replaced; it drops every capability and stays PID 1 while the program's
process sets rlimits, installs the seccomp filter (:mod:`agentrl.tools.sandbox.seccomp`) and runs
the code unmodified as ``<cell>``. When the execution ends its namespaces die with it: nothing it
wrote or created is there for the next one. ``capabilities().scopes`` lists what lives how long.

Example::

    async with BwrapSandbox(SandboxLimits(timeout_s=5), pool_size=4) as sandbox:
        result = await sandbox.run("print(6 * 7)")
        assert result.stdout == "42\\n"
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
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
    worker_binds,
    worker_request,
)
from agentrl.tools.sandbox.cgroups import CgroupSet, CgroupSupport, WorkerCgroup, detect_cgroups
from agentrl.tools.sandbox.pool import WorkerError, WorkerLaunch, WorkerPool, process_tree_memory
from agentrl.tools.sandbox.seccomp import BLOCKED, SeccompUnsupported, filter_b64

__all__ = ["BwrapSandbox"]

log = logging.getLogger(__name__)

WORKER_DIR = "/opt/agentrl"
WORKER_IN_SANDBOX = f"{WORKER_DIR}/worker.py"
NOBODY = 65534
INSTALL_HINT = "install it with `apt-get install bubblewrap` (the project's scripts/setup.sh does this)"


class BwrapSandbox(Sandbox):
    """Bubblewrap warm-pool backend. ``pool_size`` workers, at most ``max_concurrency`` executions
    at a time (default: the pool size). ``use_cgroups=False`` forces rlimit-only limits;
    ``seccomp=False`` leaves the system-call filter out (reported by :meth:`capabilities`)."""

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
        seccomp: bool = True,
        enter: Sequence[str] = (),
        binds: Sequence[tuple[str, str]] = (),
        ro_binds: Sequence[tuple[str, str]] = (),
        register_cgroup: Callable[[str], None] | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        super().__init__(limits or SandboxLimits())
        # A workspace's sandbox (agentrl.tools.workspace): ``enter`` is the command that puts bwrap into
        # the namespaces holding the workspace's mounts (nsenter; it also sets the user), ``binds`` are
        # the writable places it keeps across calls, ``ro_binds`` extra read-only files, ``preload``
        # programs (paths inside the sandbox) the worker imports once, so that each execution that
        # runs them finds them loaded (a workspace's file tools and per-step hash).
        self._enter = list(enter)
        self._binds = list(binds)
        self._ro_binds = list(ro_binds)
        self._preload = list(preload)
        self._register_cgroup = register_cgroup  # each cgroup folder, before it is made (the reaper's list)
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
        self._setpriv = shutil.which("setpriv") if self._root and not self._enter else None
        if self._root and self._setpriv is None and not self._enter:
            raise SandboxUnavailableError("running as root needs setpriv (util-linux) to drop to uid 65534")
        support = detect_cgroups() if use_cgroups else CgroupSupport(None, frozenset(), reason="disabled")
        self._cgroup_support = support
        _warn_missing_controllers(support, use_cgroups)
        self._cgroups: CgroupSet | None = None  # created with the first worker, removed by close()
        self._seccomp, self._seccomp_note = None, "disabled by seccomp=False"
        if seccomp:
            try:
                self._seccomp = filter_b64()
            except SeccompUnsupported as exc:
                self._seccomp_note = str(exc)
                log.warning("bwrap sandbox: no seccomp filter: %s", exc)
        size = pool_size or default_pool_size()
        self._pool = WorkerPool(self._launch, size=size, max_concurrency=max_concurrency or size,
                                recycle_after=recycle_after, on_release=self._release_cgroup)

    @property
    def pool_size(self) -> int:
        return self._pool.size

    def _has(self, ctrl: str) -> bool:
        return ctrl in self._cgroup_support.controllers

    def bwrap_argv(self, program: Sequence[str] | None = None, *, capabilities: bool = True,
                   tmp_dir: str | None = None, env: dict[str, str] | None = None) -> list[str]:
        """The bwrap command line of one worker (without the cgroup/uid prefix). ``program`` replaces
        the worker program (a workspace's kernel: ``capabilities=False``, ``tmp_dir`` bound at
        ``/tmp``: a tmpfs its holder capped in size and files, ``env`` added to its environment)."""
        # --disable-userns (bubblewrap >= 0.8): the program cannot create nested user namespaces.
        nested = ["--unshare-user", "--disable-userns"] if "--disable-userns" in _bwrap_help(self._bwrap) else []
        if self._enter:  # inside a workspace's user namespace the user is its root: run as 65534 as elsewhere
            nested = ["--unshare-user", *nested[1:], "--uid", str(NOBODY), "--gid", str(NOBODY)]
        # The worker keeps CAP_SYS_ADMIN (in its own user namespace only) to build each execution's
        # namespaces; every execution drops all capabilities before its code.
        caps = ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"] if capabilities else []
        argv = [self._bwrap, "--unshare-all", *nested, "--die-with-parent", "--new-session", *caps,
                "--ro-bind", "/usr", "/usr"]
        for name in ("lib", "lib64", "lib32", "bin", "sbin"):
            if os.path.islink(f"/{name}") or os.path.isdir(f"/usr/{name}"):
                argv += ["--symlink", f"usr/{name}", f"/{name}"]
        # /etc/alternatives holds only symlinks (Debian's choice of e.g. libblas.so.3, which numpy loads)
        tmp = ["--bind", tmp_dir, "/tmp"] if tmp_dir else ["--dir", "/tmp"]
        argv += ["--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
                 "--proc", "/proc", "--dev", "/dev", *tmp]
        for host, inside in [*worker_binds(WORKER_DIR), *self._ro_binds]:
            argv += ["--ro-bind", host, inside]
        for host, inside in self._binds:
            argv += ["--bind", host, inside]
        # Last: the root and /dev read-only (each execution mounts its own /tmp, /dev/shm, /proc, /dev/pts).
        argv += ["--remount-ro", "/", "--remount-ro", "/dev",
                 "--hostname", "sandbox", "--clearenv",
                 "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
                 "--setenv", "LANG", "C.UTF-8", "--chdir", self._binds[0][1] if self._binds else "/tmp",
                 *(arg for k, v in (env or {}).items() for arg in ("--setenv", k, v))]
        if program is not None:
            return [*argv, *program]
        argv += [self._python, "-I", "-S", WORKER_IN_SANDBOX, "--sweep",
                 *(f"--writable={inside}" for _, inside in self._binds), *(f"--preload={p}" for p in self._preload)]
        if self._seccomp is not None:
            argv.append(f"--seccomp={self._seccomp}")
        return argv

    def launch_argv(self, argv: list[str], cgroup: WorkerCgroup | None) -> list[str]:
        """``argv`` (a bwrap command line) behind the uid switch, the namespace entry and the cgroup move."""
        if self._setpriv is not None:
            argv = [self._setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
        argv = [*self._enter, *argv]
        if cgroup is not None:
            moves = " && ".join(f"echo $$ > {shlex.quote(str(p))}" for p in cgroup.procs_files())
            argv = ["/bin/sh", "-c", f'{moves} && exec "$@"', "sh", *argv]
        return argv

    def _launch(self, index: int) -> WorkerLaunch:
        cgroup = None
        if self._cgroups is None and self._cgroup_support.version is not None:
            self._cgroups = CgroupSet(self._cgroup_support, register=self._register_cgroup)
        if self._cgroups is not None:
            lim = self.limits
            cgroup = self._cgroups.worker(index, (lim.memory_mb + WORKER_MEMORY_OVERHEAD_MB) << 20,
                                          lim.max_processes + EXTRA_PIDS, lim.cpu_cores)
        return WorkerLaunch(self.launch_argv(self.bwrap_argv(), cgroup), cgroup, hint=self._hint())

    def _hint(self) -> str:
        return ("bubblewrap could not create its namespaces; it needs unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; on Ubuntu also "
                "kernel.apparmor_restrict_unprivileged_userns=0) or "
                f"{INSTALL_HINT}")

    def _release_cgroup(self, launch: WorkerLaunch) -> None:
        if launch.cgroup is not None and self._cgroups is not None:
            self._cgroups.release(launch.cgroup)

    async def run(self, code: str, *, language: str = "python", timeout_s: float | None = None) -> ExecResult:
        return await self.execute(code, language=language, timeout_s=timeout_s)

    async def execute(self, code: str, *, language: str = "python", timeout_s: float | None = None,
                      workdir: str | None = None, env: dict[str, str] | None = None,
                      stdin: bytes | None = None) -> ExecResult:
        """:meth:`run` in ``workdir`` (default ``/tmp``) with ``env`` added to a bash program's
        environment (a workspace's commands) and ``stdin`` as the program's input (default: empty;
        not counted in ``max_code_bytes``: a workspace's file tools send their data there)."""
        timeout = self._check_request(code, language, timeout_s)
        request = worker_request(code, language, timeout, self.limits, memory_rlimit=not self._has("memory"),
                                 nproc_rlimit=not self._has("pids"))
        if workdir is not None:
            request["workdir"] = workdir
        if env:
            request["env"] = dict(env)
        if stdin is not None:
            request["stdin"] = base64.b64encode(stdin).decode("ascii")
        started = time.monotonic()
        try:
            data = await self._pool.execute(request, timeout, observe=_observe_oom)
        except WorkerError as exc:
            return ExecResult.sandbox_error(str(exc), time.monotonic() - started)
        return result_from_worker(data, time.monotonic() - started)

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
        cg_name = f"cgroup v{cg.version}" if cg.version else ""
        enforced = {
            "network": "own network namespace per worker, loopback only",
            "filesystem": "read-only root with the host's /usr and /etc/alternatives (symlinks) read-only; no other "
                          "/etc, no /root, /home or project; "
                          "writable only the execution's own /tmp and /dev/shm (tmpfs, tmp_mb each)",
            "environment": "bwrap --clearenv (PATH, HOME, LANG only)",
            "processes_visible": "PID namespace per execution",
            "user": f"host uid {NOBODY} via setpriv, user namespace" if self._setpriv else
                    f"host uid {os.geteuid()} (unprivileged), user namespace",
            "capabilities": "all dropped before user code; no_new_privs",
            "nested_user_namespaces": "blocked (bwrap --disable-userns)" if "--disable-userns" in
                                      _bwrap_help(self._bwrap) else "allowed (bubblewrap < 0.8)",
            "wall_time": "worker deadline, SIGKILL of the execution's PID namespace",
            "cpu_time": "RLIMIT_CPU",
            "output": "captured by the worker, capped at max_output_bytes per stream",
            "file_size": "RLIMIT_FSIZE",
            "tmp_size": f"tmpfs size= on /tmp and /dev/shm ({self.limits.tmp_mb} MiB each)",
            "memory": f"{cg_name} memory limit per worker" if self._has("memory") else "RLIMIT_AS",
            "processes": f"{cg_name} pids.max per worker" if self._has("pids") else
                         "RLIMIT_NPROC (per user namespace)",
        }
        not_enforced: dict[str, str] = {}
        if self._has("cpu"):
            enforced["cpu_share"] = f"{cg_name} CPU bandwidth ({self.limits.cpu_cores} cores per worker)"
        else:
            not_enforced["cpu_share"] = f"no usable cpu cgroup controller ({cg.reason or 'disabled'})"
        if self._seccomp is not None:
            enforced["seccomp"] = f"filter per execution: EPERM for {', '.join(BLOCKED)}"
        else:
            not_enforced["seccomp"] = f"no system-call filter ({self._seccomp_note})"
        details: dict[str, Any] = {
            "cgroup_version": cg.version, "cgroup_layout": cg.layout, "cgroup_controllers": sorted(cg.controllers),
            "cgroup_v2_delegation": cg.v2_delegation, "cgroup_note": cg.reason,
            "pool_size": self._pool.size, "python": self._python, "worker": info,
            "bwrap_version": self._bwrap_version,
        }
        return Capabilities("bwrap", enforced, not_enforced, details, self._scopes())

    def _scopes(self) -> dict[str, str]:
        tmp = f"{self.limits.tmp_mb} MiB"
        memory = "the worker's cgroup" if self._has("memory") else "RLIMIT_AS per execution"
        keyrings = ("execution: unreachable (keyctl, add_key and request_key fail with EPERM under the seccomp filter)"
                    if self._seccomp is not None else
                    "worker: the user keyring of uid 65534 in the worker's user namespace (no seccomp filter)")
        return {
            "tmp": f"execution: a fresh tmpfs /tmp ({tmp}), gone with the execution",
            "dev_shm": f"execution: a fresh tmpfs /dev/shm ({tmp}), gone with the execution",
            "mounts": "execution: a fresh mount namespace; every mount read-only except /tmp, /dev/shm, /proc, "
                      "/dev/pts (the worker's layout is checked when it starts)",
            "proc": "execution: procfs of the execution's PID namespace",
            "dev_pts": "execution: a new devpts instance",
            "processes": "execution: a fresh PID namespace; its PID 1 exits with the program, killing the rest",
            "ipc": "execution: a fresh IPC namespace (SysV shared memory, semaphores, message queues; POSIX "
                   "message queues)",
            "network": "worker: the worker's network namespace, loopback only; sockets close with the "
                       "execution's processes, and a worker still listing TCP state after a call (TIME_WAIT) "
                       "is replaced",
            "hostname": "execution: a fresh UTS namespace",
            "keyrings": keyrings,
            "seccomp": "execution: installed before the code runs" if self._seccomp is not None else
                       "host: no filter (the kernel's full system-call surface)",
            "interpreter": "execution: a forked copy of the worker process, which itself never runs user code",
            "root_filesystem": "worker: bwrap's tmpfs root, read-only (--remount-ro), with /dev read-only; "
                               "no program can write to it",
            "user_namespace": "worker: uid 65534 (or the host user) in the worker's user namespace",
            "cgroup": f"worker: memory, pids and CPU limits of the worker's own group, which serves one execution "
                      f"at a time; the execution's tmpfs pages are charged there and freed with it "
                      f"(memory limit: {memory})",
            "worker_program": "pool: the same read-only worker program in every worker",
            "usr": "host: the host's /usr and /etc/alternatives, bound read-only",
            "kernel": "host: the host's kernel" + (", narrowed by the seccomp filter" if self._seccomp else ""),
        }

    async def start(self) -> None:
        await self._pool.start()
        layout_error = self._pool.first_info.get("layout_error")
        if layout_error:
            await self.close()
            raise SandboxUnavailableError(f"the bwrap worker's filesystem is not read-only: {layout_error}")
        if not self._pool.first_info.get("namespaces", False):
            await self.close()
            raise SandboxUnavailableError(
                "the bwrap worker cannot create per-execution namespaces (it lacks CAP_SYS_ADMIN in its user "
                "namespace), so executions would share state; " + self._hint())


def _observe_oom(launch: WorkerLaunch) -> Callable[[dict[str, Any]], str | None]:
    """The pool's check for one call: a SIGKILL while the worker's cgroup counted a new OOM kill is
    the memory limit (the program's processes have oom_score_adj 1000), which retires the worker."""
    before = launch.cgroup.oom_kills() if launch.cgroup is not None else 0

    def check(data: dict[str, Any]) -> str | None:
        if (data.get("signal") == signal.SIGKILL and data.get("killed_reason") == "signal"
                and launch.cgroup is not None and launch.cgroup.oom_kills() > before):
            data["killed_reason"] = "memory"
        return retire_reason(data)

    return check


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
