"""The ``local`` backend: the same worker pool as bwrap, without any isolation.

Model-written code run here can read the project, the home directory and the network, and can
signal the trainer. It exists for debugging on machines without bubblewrap and is only built when
``backend="local"`` is requested explicitly; constructing it emits an :class:`UnsafeSandboxWarning`
and an error-level log line. Per-execution rlimits (CPU time, address space, file size) and the
wall-time deadline still apply; background processes a program leaves in its own process group are
killed, those that escape with ``setsid`` are not.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings

from agentrl.tools.sandbox.base import (
    WORKER_SOURCE,
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxLimits,
    default_pool_size,
    result_from_worker,
    worker_request,
)
from agentrl.tools.sandbox.pool import WorkerError, WorkerLaunch, WorkerPool, process_tree_memory

__all__ = ["LocalSandbox", "UnsafeSandboxWarning"]

log = logging.getLogger(__name__)


class UnsafeSandboxWarning(UserWarning):
    """Code runs without isolation (the ``local`` sandbox backend)."""


class LocalSandbox(Sandbox):
    """Unisolated worker pool. Never use it for model-generated code outside a debugging session."""

    backend = "local"

    def __init__(self, limits: SandboxLimits | None = None, *, pool_size: int | None = None,
                 max_concurrency: int | None = None, python: str | None = None) -> None:
        super().__init__(limits or SandboxLimits())
        message = ("agentrl sandbox backend 'local' runs code WITHOUT ISOLATION: no network, filesystem or "
                   "environment confinement. Use backend='bwrap' (default) or 'docker' for model-written code.")
        warnings.warn(message, UnsafeSandboxWarning, stacklevel=3)
        log.error(message)
        self._python = python or ("/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable)
        size = pool_size or default_pool_size()
        self._pool = WorkerPool(self._launch, size=size, max_concurrency=max_concurrency or size)

    def _launch(self, index: int) -> WorkerLaunch:
        return WorkerLaunch([self._python, "-I", "-S", str(WORKER_SOURCE)], None, hint="")

    async def start(self) -> None:
        await self._pool.start()

    async def run(self, code: str, *, language: str = "python", timeout_s: float | None = None) -> ExecResult:
        timeout = self._check_request(code, language, timeout_s)
        request = worker_request(code, language, timeout, self.limits, memory_rlimit=True, nproc_rlimit=False)
        request["workdir"] = "/tmp"
        started = time.monotonic()
        try:
            data = await self._pool.execute(request, timeout)
        except WorkerError as exc:
            return ExecResult.sandbox_error(str(exc), time.monotonic() - started)
        return result_from_worker(data, time.monotonic() - started)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._pool.close()

    def memory_usage(self) -> dict[str, int]:
        return process_tree_memory(self._pool.pids())

    def capabilities(self) -> Capabilities:
        none = "not isolated (local backend)"
        return Capabilities(
            "local",
            enforced={"wall_time": "worker deadline, SIGKILL of the process group", "cpu_time": "RLIMIT_CPU",
                      "memory": "RLIMIT_AS", "file_size": "RLIMIT_FSIZE",
                      "environment": "workers start with an empty environment",
                      "output": "captured by the worker, capped at max_output_bytes per stream"},
            not_enforced={k: none for k in ("network", "filesystem", "processes",
                                            "processes_visible", "user", "cpu_share", "tmp_size")},
            details={"python": self._python, "worker": self._pool.first_info},
            scopes={"filesystem": "host: the host's, writable as this user", "processes": "host: the host's",
                    "ipc": "host: the host's", "network": "host: the host's",
                    "interpreter": "execution: a forked copy of the worker process"},
        )
