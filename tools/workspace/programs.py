"""The programs that run next to a workspace (holder, kernel, file tools) and how they are called.

They use the standard library only and are bound read-only into each sandbox at ``/opt/agentrl``
(next to the sandbox worker's files), or run by the holder's interpreter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.tools.sandbox.base import ExecResult

__all__ = ["IN_SANDBOX", "LAYER_IN_SANDBOX", "PRELOAD", "PROGRAM_DIR", "fsops_code", "fsops_result", "layer_code",
           "program_binds", "snapshot_cap"]

PROGRAM_DIR = Path(__file__).resolve().parent
IN_SANDBOX = "/opt/agentrl"
LAYER_IN_SANDBOX = f"{IN_SANDBOX}/layer"
"""Where a bwrap workspace's sandbox sees its own writable layer (read-only), which it hashes."""


PRELOAD: tuple[str, ...] = tuple(f"{IN_SANDBOX}/{name}.py" for name in ("_resolve", "_fsops", "_layer"))
"""The programs a workspace's sandbox worker imports once (each file operation and hash then runs
without compiling them): ``_resolve`` first, which the others use."""


def program_binds() -> list[tuple[str, str]]:
    """``(host path, sandbox path)`` of the kernel, the file tools' and the layer's programs."""
    return [(str(PROGRAM_DIR / "_kernel.py"), f"{IN_SANDBOX}/kernel.py"),
            *((str(PROGRAM_DIR / f"{name}.py"), f"{IN_SANDBOX}/{name}.py") for name in ("_fsops", "_resolve", "_layer"))]


def _program_code(module: str, op: str, arguments: dict[str, Any]) -> str:
    request = json.dumps({"op": op, **arguments})
    return (f"import sys\nsys.path.insert(0, {IN_SANDBOX!r})\nimport {module}\n"
            f"{module}.main(__import__('json').loads({request!r}))\n")


FSOPS_PROGRAM = (f"import sys\nsys.path.insert(0, {IN_SANDBOX!r})\nimport _fsops\n"
                 "_fsops.main(__import__('json').loads(sys.stdin.buffer.read()))\n")


def fsops_code(op: str, arguments: dict[str, Any]) -> tuple[str, bytes]:
    """The Python program of one file operation (``_fsops.main``) and its request, which the program
    reads on stdin (any size: a file's content is never part of the code)."""
    return FSOPS_PROGRAM, json.dumps({"op": op, **arguments}).encode()


def layer_code(op: str, arguments: dict[str, Any]) -> str:
    """The Python program of one operation of ``_layer.main`` (the per-step hash)."""
    return _program_code("_layer", op, arguments)


def snapshot_cap(size_mb: int, file_cap: int) -> int:
    """The most bytes a snapshot of a workspace of ``size_mb`` and ``file_cap`` files may take: what
    the layer can hold, an eighth more for the data extents' bookkeeping, 512 bytes of header per
    file and 1 MiB."""
    return (size_mb << 20) * 9 // 8 + file_cap * 512 + (1 << 20)


def fsops_result(result: ExecResult) -> dict[str, Any]:
    """The JSON result of one file operation's execution, or ``{"error", "sandbox_error"}`` when the
    execution itself failed."""
    if result.ok:
        try:
            data = json.loads(result.stdout)
            if isinstance(data, dict):
                return data
        except ValueError:
            pass
    why = "timed out" if result.timed_out else (result.killed_reason or f"exit status {result.exit_code}")
    return {"error": f"the file operation failed ({why}): {result.stderr.strip()[-500:]}", "sandbox_error": True}
