"""A reward that holds a real ``agentrl train`` run after step 1 until its test opens the gate.

A fault test that kills something "after step 1, while the run goes on" must not depend on how long
steps take: with the tiny model a step can take half a second (every group's advantages zero, nothing
to sync), so a test polling the run folder could find the run already finished. This reward lets the
first ``AGENTRL_TEST_GATE_FREE`` calls through (step 1's episodes), then holds every later call while
the file ``closed`` exists in the folder ``AGENTRL_TEST_GATE``: the run stays inside step 2, its engine
serving, until the test removes the file. Calls are counted across processes (the reward pool's
workers) by appending one byte per call to ``calls`` in that folder.

    agentrl train CONFIG --reward _gate:gated_reward     # with this folder on PYTHONPATH

The reward itself is the response length's parity: not uniform within a group, so steps train and
sync weights (the weight versions a restarted engine must be brought up to).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

GATE, FREE = "AGENTRL_TEST_GATE", "AGENTRL_TEST_GATE_FREE"


def close(folder: Path, free_calls: int) -> dict[str, str]:
    """Closes the gate in ``folder``; returns the environment the run needs."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "closed").touch()
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return {GATE: str(folder), FREE: str(free_calls), "PYTHONPATH": path}


def open_gate(folder: Path) -> None:
    (folder / "closed").unlink(missing_ok=True)


def held(folder: Path, free_calls: int) -> int:
    """How many calls have reached the gate beyond the free ones (0 while step 1 runs)."""
    calls = folder / "calls"
    return max(0, (calls.stat().st_size if calls.exists() else 0) - free_calls)


def gated_reward(trajectory: Any, task: Any) -> float:
    folder = Path(os.environ[GATE])
    with open(folder / "calls", "ab") as f:  # O_APPEND: one byte per call, whichever process makes it
        f.write(b".")
    if (folder / "calls").stat().st_size > int(os.environ[FREE]):
        while (folder / "closed").exists():
            time.sleep(0.05)
    return float(trajectory.response_length % 2)
