"""Sandboxed code execution: ``create_sandbox(backend=...)`` and the :class:`Sandbox` contract.

Backends: ``"bwrap"`` (default; a warm pool of bubblewrap-isolated workers), ``"docker"`` (a pool
of warm containers driven through the Docker SDK) and ``"local"`` (no isolation, loud warning).

Example::

    from agentrl.tools.sandbox import create_sandbox

    async with create_sandbox("bwrap", timeout_s=5, memory_mb=256) as sandbox:
        result = await sandbox.run("x = 6 * 7\\nx")
        print(result.stdout)          # "42\\n": a final bare expression is printed, as in a notebook
        print(sandbox.capabilities()) # which limits this machine enforces, and how
"""

from __future__ import annotations

import inspect
from typing import Any

from agentrl.tools.sandbox.base import (
    Capabilities,
    ExecResult,
    KilledReason,
    Sandbox,
    SandboxClosedError,
    SandboxLimits,
    SandboxUnavailableError,
)

__all__ = [
    "BACKENDS",
    "Capabilities",
    "ExecResult",
    "KilledReason",
    "Sandbox",
    "SandboxClosedError",
    "SandboxLimits",
    "SandboxUnavailableError",
    "create_sandbox",
]

BACKENDS: tuple[str, ...] = ("bwrap", "docker", "local")


def _backend_class(backend: str) -> type[Sandbox]:
    if backend == "bwrap":
        from agentrl.tools.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox
    if backend == "docker":
        from agentrl.tools.sandbox.docker import DockerSandbox

        return DockerSandbox
    if backend == "local":
        from agentrl.tools.sandbox.local import LocalSandbox

        return LocalSandbox
    raise ValueError(f"create_sandbox(backend=...): expected one of {BACKENDS}, got {backend!r}")


def create_sandbox(backend: str = "bwrap", **options: Any) -> Sandbox:
    """Builds a sandbox. ``options`` are :class:`SandboxLimits` fields (``timeout_s``, ``cpu_s``,
    ``memory_mb``, ``max_processes``, ``max_output_bytes``, ...) and the backend's own keyword
    arguments (``pool_size``, ``max_concurrency``; ``image``/``docker_host`` for docker), or
    ``limits=SandboxLimits(...)``. Unknown names raise ``TypeError`` listing the valid ones.
    Raises :class:`SandboxUnavailableError` (naming the fix) when the backend cannot run here.

    While a sandbox fleet is installed in this process (:func:`agentrl.tools.fleet.use_fleet`), every
    backend but ``local`` is the fleet's: the sandbox runs on its executors (their pools' size is the
    fleet's ``concurrency``, so ``pool_size`` and ``max_concurrency`` are theirs)."""
    from agentrl.tools.fleet.placement import current_fleet

    cls = _backend_class(backend)
    fleet = current_fleet() if backend != "local" else None
    limit_names = SandboxLimits.field_names()
    limit_kwargs = {k: v for k, v in options.items() if k in limit_names}
    rest = {k: v for k, v in options.items() if k not in limit_names}
    limits = rest.pop("limits", None)
    if limits is not None and limit_kwargs:
        raise TypeError(f"create_sandbox: pass either limits= or the limit fields {sorted(limit_kwargs)}, not both")
    if limits is None:
        limits = SandboxLimits(**limit_kwargs)
    elif not isinstance(limits, SandboxLimits):
        raise TypeError(f"create_sandbox(limits=...): expected SandboxLimits, got {type(limits).__name__}")
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "limits")]
    unknown = sorted(set(rest) - set(accepted))
    if unknown:
        raise TypeError(f"create_sandbox(backend={backend!r}): unknown option(s) {unknown}; "
                        f"expected limit fields {list(limit_names)} or backend options {accepted}")
    if fleet is not None:
        return fleet.sandbox(backend, limits, **rest)  # type: ignore[no-any-return]
    return cls(limits, **rest)
