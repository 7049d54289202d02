"""The runnable example of the environment guide runs, passes its own check and earns its reward."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_custom_environment_example_runs() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_environment.py")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "SecondsEnv: 3 rows, 12 episodes, 0 violation(s) — OK" in out.stdout
    assert "status=completed stop_reason=no_tool_calls reward=1.0" in out.stdout
    assert "\\boxed{12600}" in out.stdout  # 3.5 hours, as computed by the tool and copied by the policy
