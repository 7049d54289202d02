"""A regular (non-editable) install ships agentrl.tools, agentrl.environments and the templates."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_regular_install_imports_mapped_packages(tmp_path: Path) -> None:
    # Build from a copy of the sources: building in the checkout would write build/ and *.egg-info
    # there, and a stale build/lib could then ship modules the sources no longer have.
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".hypothesis", "runs"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, cwd=tmp_path)
    probe = (
        "import importlib.resources, agentrl, agentrl.tools, agentrl.environments\n"
        "print(agentrl.__file__); print(agentrl.tools.__file__); print(agentrl.environments.__file__)\n"
        "print(sorted(p.name for p in importlib.resources.files('agentrl.templates').iterdir()))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}).stdout.splitlines()
    assert all(line.startswith(str(target)) for line in out[:3]), out
    assert out[1].endswith("tools/__init__.py") and out[2].endswith("environments/__init__.py")
    assert "qwen3.jinja" in out[3] and "qwen3_5.jinja" in out[3] and "qwen3_coder.jinja" in out[3]
