"""What readers of a run folder share with its writer (:mod:`agentrl.runner.rundir`), without
importing the runner (torch, Ray): the trajectory file names and the ``metrics.jsonl`` parser."""

from __future__ import annotations

import re
from typing import Any

import orjson

__all__ = ["TRAJECTORY_FILE_RE", "parse_metrics_lines"]

TRAJECTORY_FILE_RE = re.compile(r"step_(\d{6,})\.jsonl\.gz")


def parse_metrics_lines(data: bytes, where: str, error: type[Exception]) -> list[dict[str, Any]]:
    """Every ``{"step": int, ...}`` line of ``data`` in order. A torn last line (no newline after
    it: the writer died mid-line) is skipped; any other bad line raises ``error`` naming
    ``where`` and the line number."""
    lines = data.split(b"\n")
    out: list[dict[str, Any]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if lineno == len(lines):
                break
            raise error(f"{where}:{lineno}: not JSON ({exc})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise error(f"{where}:{lineno}: expected an object with an int 'step', got {line[:120]!r}")
        out.append(record)
    return out
