"""examples/sandboxed_tools.py runs as documented on the default (bwrap) backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "sandboxed_tools.py"


def test_example_runs() -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, check=True)
    assert "'math.comb(10, 3)' -> ok\n120\n" in out.stdout
    assert "'1 / 0' -> tool_error\npartial\n[stderr]" in out.stdout
    assert "'time.sleep(10)' -> tool_timeout" in out.stdout
    assert "Network is unreachable" in out.stdout
    assert "missing_required_argument" in out.stdout and "ZeroDivisionError" in out.stdout
