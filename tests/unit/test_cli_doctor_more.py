"""`agentrl doctor`'s Ray, megatron-core and accelerator checks, against what this machine really has."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from importlib.metadata import version

import torch

from agentrl.cli.doctor import accelerator_checks, collect_checks


def test_doctor_reports_ray_and_megatron_core() -> None:
    checks = {c.name: c for c in collect_checks(import_sglang=False, sandbox=False)}
    assert checks["ray"].status == "ok" and checks["ray"].detail == version("ray")
    megatron = checks["megatron-core"]
    if importlib.util.find_spec("megatron") is None:
        assert megatron.status == "warn" and "not installed" in megatron.detail
    else:
        assert megatron.status == "ok" and megatron.detail == version("megatron-core")


def test_doctor_reports_the_accelerators_this_machine_has() -> None:
    checks = {c.name: c for c in accelerator_checks()}
    assert set(checks) == {"cuda", "ascend npu"}
    if torch.cuda.is_available():
        assert checks["cuda"].status == "ok" and f"{torch.cuda.device_count()} GPU(s)" in checks["cuda"].detail
    else:
        assert checks["cuda"].status == "warn" and "no CUDA GPU" in checks["cuda"].detail
    if importlib.util.find_spec("torch_npu") is None:
        assert checks["ascend npu"].status == "warn" and "torch-npu not installed" in checks["ascend npu"].detail


def test_doctor_command_lists_the_new_checks() -> None:
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli.main", "doctor", "--quick"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    for name in ("ray", "megatron-core", "cuda", "ascend npu"):
        assert name in proc.stdout, proc.stdout
