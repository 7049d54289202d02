"""``agentrl doctor``: what is installed and usable for rollouts on this machine.

Checks the pinned core libraries, Ray, megatron-core (optional), the accelerators (CUDA GPUs,
Ascend NPUs), SGLang and sglang-router, the CPU shims SGLang's
CPU path needs, the code sandboxes (bubblewrap runs a program; a Docker daemon answers), and (with ``--engine``) starts the tiny model on a real SGLang server behind the real
router and generates a few tokens through them. Each check is a :class:`Check` with a status
(``ok``, ``warn``, ``fail``) and a one-line detail; ``--strict`` exits 1 if any check failed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

import typer

__all__ = ["Check", "accelerator_checks", "collect_checks", "doctor"]

Status = Literal["ok", "warn", "fail"]
PINS = {"torch": "2.13.0", "transformers": "5.19.0", "tokenizers": "0.23.2", "sglang": "0.5.23",
        "sglang-router": "0.3.2"}
RAY_PIN = "2.60.0"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


def _installed(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _pin_check(dist: str, pin: str) -> Check:
    got = _installed(dist)
    if got is None:
        return Check(dist, "fail", f"not installed (expected {pin}; run scripts/setup.sh)")
    if got.split("+")[0] != pin:
        return Check(dist, "warn", f"{got} installed, project pins {pin}")
    return Check(dist, "ok", got)


def _engine_import_check(device: str) -> Check:
    """Imports SGLang's server module in a subprocess with the engine's environment."""
    from agentrl.rollout.engine import EngineError, engine_environment

    code = "import sglang.srt.entrypoints.http_server"
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=engine_environment(device),
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError, EngineError) as err:
        return Check("sglang server import", "fail", str(err))
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return Check("sglang server import", "fail", f"{device}: {last}")
    return Check("sglang server import", "ok", f"{device} engine environment, {time.monotonic() - t0:.1f} s")


def _engine_check() -> Check:
    """Starts the tiny model behind the router and generates 8 tokens."""
    from agentrl.rollout import EngineConfig, EngineGroup, SamplingParams
    from agentrl.testing import build_tiny_model

    async def run() -> str:
        config = EngineConfig(model_path=str(build_tiny_model()), context_length=512, max_total_tokens=4096)
        t0 = time.monotonic()
        group = await EngineGroup.launch([config])
        start_s = time.monotonic() - t0
        try:
            async with group.client() as client:
                res = await client.generate([101, 102, 103], SamplingParams(max_new_tokens=8))
            return (f"started in {start_s:.1f} s; {len(res.output_ids)} tokens via {group.router.url}, "
                    f"finish {res.finish_reason.kind.value}")
        finally:
            await group.shutdown()

    try:
        detail = asyncio.run(run())
    except Exception as err:  # a doctor reports every failure instead of crashing
        return Check("tiny model engine", "fail", f"{type(err).__name__}: {str(err)[:300]}")
    return Check("tiny model engine", "ok", detail)


def _weight_sync_check() -> Check:
    """Syncs the tiny model's weights into a tiny engine by every method (disk, tensor, distributed)
    and checks the version each time: which methods this engine accepts, and how long each took."""
    from agentrl.rollout import EngineConfig, SGLangEngine
    from agentrl.testing import build_tiny_model

    async def run() -> str:
        import torch

        from agentrl.runner.weight_push import PushTarget, WeightPusher
        from agentrl.runner.weight_transports import PushLoad
        from agentrl.runner.weights import WeightSync, WeightSyncConfig
        from agentrl.train import TorchTrainBackend
        from agentrl.train.config import TorchBackendConfig

        class Local:
            def __init__(self, pusher: WeightPusher) -> None:
                self.pusher = pusher

            async def push(self, version: int, targets: list[PushTarget], *, flush: bool, exact: bool) -> dict[str, Any]:
                return (await asyncio.to_thread(self.pusher.push, version, targets, flush=flush)).to_dict()

        model = str(build_tiny_model())
        engine = await SGLangEngine.launch(EngineConfig(model_path=model, dtype="float32", context_length=512,
                                                        max_total_tokens=4096))
        backend = TorchTrainBackend.from_pretrained(model, TorchBackendConfig(device="cpu", dtype="float32"))
        results = []
        try:
            with tempfile.TemporaryDirectory(prefix="agentrl-doctor-") as tmp:
                for version, method in enumerate(("disk", "tensor", "distributed"), start=1):
                    def target(e: SGLangEngine, m: str = method) -> PushTarget:
                        return PushTarget(url=e.url, group=f"doctor-{m}")

                    transport = None if method == "disk" else PushLoad(method, Local(WeightPusher(
                        backend.named_weights, method=method, dtype=torch.float32, bucket_bytes=64 << 20,
                        device=torch.device("cpu"))), target)
                    sync = WeightSync([engine], tmp, WeightSyncConfig(retries=0), transport=transport)
                    try:
                        report = await sync.sync(version, backend.export_hf if method == "disk" else None)
                        results.append(f"{method} ok ({report.total_s:.2f} s)")
                    except Exception as err:  # each method is reported on its own
                        results.append(f"{method} FAILED ({type(err).__name__}: {str(err)[:120]})")
        finally:
            await asyncio.to_thread(engine.stop)
        return "; ".join(results)

    try:
        detail = asyncio.run(run())
    except Exception as err:  # a doctor reports every failure instead of crashing
        return Check("weight sync methods", "fail", f"{type(err).__name__}: {str(err)[:300]}")
    return Check("weight sync methods", "warn" if "FAILED" in detail else "ok", detail)


def _ray_check() -> Check:
    got = _installed("ray")
    if got is None:
        return Check("ray", "fail", "not installed (the runner needs it; run scripts/setup.sh)")
    return Check("ray", "ok" if got == RAY_PIN else "warn", got if got == RAY_PIN else f"{got} installed, "
                 f"project pins {RAY_PIN}")


def _megatron_check() -> Check:
    got = _installed("megatron-core")
    if got is None:
        return Check("megatron-core", "warn", "not installed (only train.backend='megatron' needs it)")
    return Check("megatron-core", "ok", got)


def accelerator_checks() -> list[Check]:
    """CUDA GPUs (through torch) and Ascend NPUs (through torch-npu), each found or not."""
    checks = []
    try:
        import torch
    except ImportError:
        return [Check("accelerators", "fail", "torch is not installed")]
    if torch.cuda.is_available():
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        checks.append(Check("cuda", "ok", f"{torch.cuda.device_count()} GPU(s): {', '.join(names)}; "
                            f"CUDA {torch.version.cuda}"))
    else:
        checks.append(Check("cuda", "warn", f"no CUDA GPU visible (torch {torch.__version__}; CPU engines and "
                            "training only)"))
    if _installed("torch-npu") is None:
        checks.append(Check("ascend npu", "warn", "torch-npu not installed (pip install 'agentrl[npu]' on Ascend)"))
    else:
        try:
            import torch_npu  # noqa: F401

            count = torch.npu.device_count()  # type: ignore[attr-defined]  # added by torch_npu
            checks.append(Check("ascend npu", "ok" if count else "warn", f"{count} NPU(s) visible"))
        except Exception as err:  # a doctor reports every failure instead of crashing
            checks.append(Check("ascend npu", "fail", f"torch-npu does not load: {type(err).__name__}: {err}"[:300]))
    return checks


def _bwrap_check() -> Check:
    """Runs ``print(1)`` in the default bubblewrap sandbox and reports what it enforces here."""
    from agentrl.tools.sandbox import SandboxUnavailableError, create_sandbox

    async def run() -> str:
        async with create_sandbox("bwrap", pool_size=1, timeout_s=20) as sandbox:
            result = await sandbox.run("print(1)")
            if result.exit_code != 0 or result.stdout.strip() != "1":
                raise RuntimeError(f"print(1) gave exit {result.exit_code}, stdout {result.stdout!r:.80}, "
                                   f"stderr {result.stderr!r:.200}")
            caps = sandbox.capabilities()
        missing = f"; not enforced: {', '.join(sorted(caps.not_enforced))}" if caps.not_enforced else ""
        return f"{len(caps.enforced)} limits enforced{missing}"

    try:
        detail = asyncio.run(run())
    except SandboxUnavailableError as err:
        return Check("sandbox: bwrap", "fail", str(err)[:300])
    except Exception as err:  # a doctor reports every failure instead of crashing
        return Check("sandbox: bwrap", "fail", f"{type(err).__name__}: {str(err)[:300]}")
    return Check("sandbox: bwrap", "ok" if "not enforced" not in detail else "warn", detail)


def _docker_check() -> Check:
    import os

    from agentrl.tools.sandbox.dockerd import daemon_unavailable_reason, ping

    for host in (os.environ.get("DOCKER_HOST"), "unix:///var/run/docker.sock"):
        if host and ping(host):
            return Check("sandbox: docker", "ok", f"daemon answers at {host}")
    reason = daemon_unavailable_reason()
    if reason is not None:
        return Check("sandbox: docker", "warn", f"no daemon, and none can be started here: {reason}")
    return Check("sandbox: docker", "warn", "no daemon running (start dockerd to use the docker backend; "
                                            "the tests start a private one)")


def collect_checks(*, import_sglang: bool = True, engine: bool = False, sandbox: bool = True) -> list[Check]:
    """Runs the checks; ``import_sglang`` imports the SGLang server (seconds), ``engine`` starts one (~30 s)."""
    from agentrl.rollout.engine import default_shim_dir, detect_device

    checks = [Check("python", "ok", sys.version.split()[0])]
    checks += [_pin_check(dist, pin) for dist, pin in PINS.items()]
    checks += [_ray_check(), _megatron_check()]
    device = detect_device()
    checks.append(Check("device", "ok", device))
    checks += accelerator_checks()
    if device == "cpu":
        shims = default_shim_dir()
        ok = (shims / "sgl_kernel" / "__init__.py").exists() and (shims / "torchvision" / "__init__.py").exists()
        checks.append(Check("sglang cpu shims", "ok" if ok else "fail",
                            str(shims) if ok else f"missing in {shims} (run scripts/setup.sh)"))
    router_ok = importlib.util.find_spec("sglang_router") is not None
    checks.append(Check("sglang-router binary", "ok" if router_ok else "fail",
                        "sglang_router importable" if router_ok else "sglang_router not importable"))
    checks.append(Check("orjson (client codec)", "ok" if _installed("orjson") else "warn",
                        _installed("orjson") or "missing: the client falls back to the slower json module"))
    if sandbox:
        checks += [_bwrap_check(), _docker_check()]
    if import_sglang and _installed("sglang"):
        checks.append(_engine_import_check(device))
    if engine:
        checks.append(_engine_check())
        checks.append(_weight_sync_check())
    return checks


def doctor(
    engine: bool = typer.Option(False, "--engine", help="also start the tiny model on SGLang behind the router, "
                                "and sync weights into one by each method (disk, tensor, distributed)"),
    quick: bool = typer.Option(False, "--quick", help="skip importing the SGLang server (a few seconds)"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 when any check failed"),
) -> None:
    """Report what is installed and usable: pinned libraries, Ray, megatron-core, accelerators (CUDA,
    Ascend NPU), SGLang, router, CPU shims, sandboxes; with --engine, the engine's start time and
    which weight-sync methods it accepts.

    Examples:

      agentrl doctor --quick

      agentrl doctor --engine --strict
    """
    from rich.console import Console
    from rich.table import Table

    checks = collect_checks(import_sglang=not quick, engine=engine)
    table = Table(title="agentrl doctor")
    for col in ("check", "status", "detail"):
        table.add_column(col)
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}
    for c in checks:
        table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", c.detail)
    Console().print(table)
    if strict and any(c.status == "fail" for c in checks):
        raise typer.Exit(1)
