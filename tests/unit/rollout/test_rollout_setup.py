"""The CPU shims (engine subprocess only), the engine environment and `agentrl doctor`."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli.doctor import PINS, collect_checks
from agentrl.cli.main import app
from agentrl.rollout import EngineConfig, EngineError
from agentrl.rollout.engine import detect_device, engine_environment

SHIMS = Path(__file__).resolve().parents[3] / "scripts" / "setup" / "sglang-cpu-shims"


def test_shims_are_not_on_the_sdk_path() -> None:
    assert importlib.util.find_spec("sgl_kernel") is None
    assert importlib.util.find_spec("torchvision") is None


def test_shims_behave_in_a_subprocess() -> None:
    code = """
import packaging.version, sgl_kernel, torchvision
from torchvision.transforms import functional as F
from torchvision.ops import nms
packaging.version.Version(sgl_kernel.__version__); packaging.version.Version(torchvision.__version__)
class Sub(torchvision.transforms.InterpolationMode): pass
for fn, name in ((lambda: sgl_kernel.rmsnorm(1), "rmsnorm"), (lambda: F.resize(1), "resize"), (lambda: nms(1), "nms"),
                 (lambda: Sub(), "")):
    try:
        fn()
    except NotImplementedError as err:
        assert name in str(err), err
    else:
        raise AssertionError(name)
try:
    sgl_kernel.__wrapped__
except AttributeError:
    print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(SHIMS), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _start_method_in_shimmed_python(**env: str) -> subprocess.CompletedProcess[str]:
    code = ("import multiprocessing as mp; mp.set_start_method('spawn', force=True); print(mp.get_start_method()); "
            "mp.set_start_method('forkserver', force=True); print(mp.get_start_method())")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(SHIMS), "PATH": "/usr/bin:/bin", **env})


def test_cpu_engine_forks_its_children_unless_told_otherwise() -> None:
    # SGLang forces "spawn" (for CUDA); the CPU engine's children fork instead, other choices pass through
    out = _start_method_in_shimmed_python()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fork", "forkserver"]
    out = _start_method_in_shimmed_python(AGENTRL_SGLANG_START_METHOD="spawn")
    assert out.stdout.split() == ["spawn", "forkserver"]
    out = _start_method_in_shimmed_python(AGENTRL_SGLANG_START_METHOD="clone")  # said, and SGLang's own kept
    assert out.stdout.split() == ["spawn", "forkserver"] and "AGENTRL_SGLANG_START_METHOD='clone'" in out.stderr
    with pytest.raises(EngineError, match=r"AGENTRL_SGLANG_START_METHOD='clone'.*fork"):  # the launcher refuses it
        engine_environment("cpu", extra={"AGENTRL_SGLANG_START_METHOD": "clone"}, shim_dir=SHIMS)


def test_engine_environment(tmp_path: Path) -> None:
    env = engine_environment("cpu", extra={"OMP_NUM_THREADS": "1"}, shim_dir=SHIMS)
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["PYTHONPATH"].split(":")[0] == str(SHIMS)
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "agentrl_sglang_models"  # the shims' model package
    assert (SHIMS / "agentrl_sglang_models" / "__init__.py").exists()
    mine = engine_environment("cpu", extra={"SGLANG_EXTERNAL_MODEL_PACKAGE": "mine"}, shim_dir=SHIMS)
    assert mine["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "mine"  # a user's own package wins
    assert "SGLANG_USE_CPU_ENGINE" not in engine_environment("cuda", shim_dir=tmp_path)
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in engine_environment("cuda", shim_dir=SHIMS)
    with pytest.raises(EngineError, match="shims not found"):
        engine_environment("cpu", shim_dir=tmp_path)


def test_engine_command_line() -> None:
    cfg = EngineConfig(model_path="/m", context_length=512, weight_version="3", extra_args=("--foo",))
    cmd = cfg.command(18000, "cpu")
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and cmd[-1] == "--foo"
    joined = " ".join(cmd)
    assert "--device cpu" in joined and "--port 18000" in joined and "--context-length 512" in joined
    assert "--weight-version 3" in joined and "--max-total-tokens" not in joined
    # the router's gRPC probe of each new worker would log "Invalid HTTP request received." at warning level
    assert "--log-level-http error" in joined
    assert "--log-level-http" not in " ".join(EngineConfig(model_path="/m", log_level_http=None).command(1, "cpu"))
    with pytest.raises(ValueError, match="device='tpu'"):
        EngineConfig(model_path="/m", device="tpu")  # type: ignore[arg-type]


def test_doctor_reports_installed_versions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    checks = {c.name: c for c in collect_checks(import_sglang=False)}
    for dist in PINS:
        assert checks[dist].status == "ok", checks[dist]
    assert checks["sglang-router binary"].status == "ok"
    if detect_device() != "cpu":
        return  # the shims are only checked (and needed) on CPU-only machines
    monkeypatch.setenv("AGENTRL_SGLANG_SHIM_DIR", str(tmp_path))
    checks = {c.name: c for c in collect_checks(import_sglang=False)}
    assert checks["sglang cpu shims"].status == "fail" and str(tmp_path) in checks["sglang cpu shims"].detail
    result = CliRunner().invoke(app, ["doctor", "--quick", "--strict"])
    assert result.exit_code == 1 and "sglang cpu shims" in result.output


def test_doctor_command_passes_here() -> None:
    result = CliRunner().invoke(app, ["doctor", "--quick", "--strict"])
    assert result.exit_code == 0, result.output
    assert "sglang-router" in result.output


def test_doctor_runs_the_bwrap_sandbox_and_names_the_fix_when_missing(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    checks = {c.name: c for c in collect_checks(import_sglang=False)}
    assert checks["sandbox: bwrap"].status == "ok", checks["sandbox: bwrap"]
    assert checks["sandbox: docker"].status in ("ok", "warn")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    checks = {c.name: c for c in collect_checks(import_sglang=False)}
    assert checks["sandbox: bwrap"].status == "fail"
    assert "bubblewrap" in checks["sandbox: bwrap"].detail
