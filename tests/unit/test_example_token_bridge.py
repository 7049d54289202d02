"""examples/token_bridge.py runs and its trajectory equals a full render of its messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_token_bridge_example_runs() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "token_bridge.py")], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "BridgeOutcome.APPEND True" in out
    assert "trajectory equals a full render: True" in out
