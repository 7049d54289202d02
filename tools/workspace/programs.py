"""The programs that run next to a workspace (holder, kernel, file tools) and how they are called.

They use the standard library only and are bound read-only into each sandbox at ``/opt/agentrl``
(next to the sandbox worker's files), or run by the holder's interpreter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.tools.sandbox.base import ExecResult

__all__ = ["IN_SANDBOX", "PROGRAM_DIR", "fsops_code", "fsops_result", "program_binds", "snapshot_bytes"]

PROGRAM_DIR = Path(__file__).resolve().parent
IN_SANDBOX = "/opt/agentrl"


def program_binds() -> list[tuple[str, str]]:
    """``(host path, sandbox path)`` of the kernel and the file tools' program."""
    return [(str(PROGRAM_DIR / "_kernel.py"), f"{IN_SANDBOX}/kernel.py"),
            (str(PROGRAM_DIR / "_fsops.py"), f"{IN_SANDBOX}/_fsops.py"),
            (str(PROGRAM_DIR / "_resolve.py"), f"{IN_SANDBOX}/_resolve.py")]


def fsops_code(op: str, arguments: dict[str, Any]) -> str:
    """The Python program of one file operation (``_fsops.main``), its arguments as a literal."""
    request = json.dumps({"op": op, **arguments})
    return (f"import sys\nsys.path.insert(0, {IN_SANDBOX!r})\nimport _fsops\n"
            f"_fsops.main(__import__('json').loads({request!r}))\n")


def snapshot_bytes(entries: list[dict[str, Any]]) -> bytes:
    return json.dumps({"format": "agentrl-bwrap-layer-1", "entries": entries}).encode()


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
