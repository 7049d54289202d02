"""SGLang engine launcher and control plane: start or attach, health, pause, cache, weight updates.

:meth:`SGLangEngine.launch` starts ``python -m sglang.launch_server`` as a subprocess (on GPU, or with
the CPU recipe on a machine without one: ``SGLANG_USE_CPU_ENGINE=1`` and the import-only shims of
``scripts/setup/sglang-cpu-shims`` on the subprocess's ``PYTHONPATH`` only), waits until
``/health_generate`` answers 200 (failing fast with the log tail if the process exits), and returns.
:meth:`SGLangEngine.attach` adopts an already running engine after checking its ``/server_info``
against the expected configuration; a mismatch is refused rather than producing wrong rollouts.
:meth:`SGLangEngine.stop` stops exactly the process tree the launcher started (never an attached one).

Registration with the router is the engine group's job (:mod:`agentrl.rollout.health`): register after
healthy, deregister before stop.

Weight updates: ``update_weights_from_disk`` works everywhere; ``update_weights_from_tensor`` (same host:
shared memory on CPU, CUDA IPC on GPU) and ``update_weights_from_distributed`` (a broadcast: gloo on
CPU, NCCL on GPU) run inside the session SGLang 0.5.23 requires (:meth:`SGLangEngine.begin_weight_update`
… :meth:`SGLangEngine.end_weight_update`); :mod:`agentrl.runner.weights` drives them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from agentrl.model_folder import Need, check_model_folder
from agentrl.rollout.process import (
    PORT_DRAWS,
    ManagedProcess,
    default_log_dir,
    free_port,
    request_json,
    wait_ready,
)

__all__ = [
    "EngineConfig", "EngineError", "EngineLora", "EnginePortTaken", "EngineProcess", "EngineStarter", "SGLangEngine", "default_shim_dir",
    "detect_device",
    "engine_environment",
]

log = logging.getLogger(__name__)


PauseMode = Literal["abort", "retract", "in_place"]
# server_info fields compared on attach when the expected configuration sets them.
ATTACH_CHECKED_FIELDS = ("model_path", "tp_size", "dp_size", "pp_size", "context_length", "dtype", "device",
                         "served_model_name", "attention_backend", "max_total_tokens", "enable_memory_saver")


class EngineError(RuntimeError):
    """An engine did not start, refused a control call, or does not match its expected configuration."""


class EnginePortTaken(EngineError):
    """The engine could not bind its port: another process had taken it."""


class EngineProcess(Protocol):
    """What an engine holds of the server process it started: a local
    :class:`~agentrl.rollout.process.ManagedProcess`, or a handle on one that another process started
    (e.g. a host actor on the engine's own node)."""

    @property
    def pid(self) -> int: ...

    def alive(self) -> bool: ...

    def returncode(self) -> int | None: ...

    def stop(self) -> None: ...


class EngineStarter(Protocol):
    """Starts an engine's server from ``config`` (on ``port``; ``None``: a free one) and waits until it
    is healthy; returns its URL and process. The default starts it as a local subprocess; a run on
    Ray starts each engine on its node, with its devices, through its host actor."""

    async def start(self, config: EngineConfig, port: int | None) -> tuple[str, EngineProcess]: ...


def detect_device() -> str:
    """``"cuda"`` when ``nvidia-smi`` lists a GPU, else ``"cpu"`` (no torch import needed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    return "cuda" if out.lstrip().startswith("GPU") else "cpu"


CPU_MODEL_PACKAGE = "agentrl_sglang_models"  # in the shim folder; see scripts/setup/sglang-cpu-shims/README.md


def default_shim_dir() -> Path:
    """Where ``scripts/setup.sh`` puts the CPU shims: ``$AGENTRL_SGLANG_SHIM_DIR`` or
    ``<venv>/share/agentrl/sglang-cpu-shims``."""
    env = os.environ.get("AGENTRL_SGLANG_SHIM_DIR")
    return Path(env) if env else Path(sys.prefix) / "share" / "agentrl" / "sglang-cpu-shims"


DEVICES = ("auto", "cpu", "cuda", "npu")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # sglang.launch_server --dtype choices
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"EngineConfig.{name}={value!r}: expected one of {', '.join(map(repr, allowed))}")


def _at_least(name: str, value: float | None, low: float, *, above: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (above and value == low):
        raise ValueError(f"EngineConfig.{name}={value!r}: expected a number {'>' if above else '>='} {low:g}")


@dataclass(frozen=True)
class EngineLora:
    """LoRA serving (``--enable-lora``): adapters of rank up to ``max_rank`` on ``target_modules``,
    loaded and unloaded while the engine serves; ``backend`` SGLang's ``--lora-backend`` (``None``: its
    default; ``torch_native`` is the one that runs without an accelerator); ``max_loras_per_batch``:
    adapters one batch may mix (a sync briefly serves the old and the new version side by side)."""

    max_rank: int
    target_modules: tuple[str, ...]
    backend: str | None = None
    max_loras_per_batch: int = 4

    def __post_init__(self) -> None:
        for name in ("max_rank", "max_loras_per_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineLora.{name}={value!r}: expected an int >= 1")
        if isinstance(self.target_modules, str) or not self.target_modules:
            raise ValueError(f"EngineLora.target_modules={self.target_modules!r}: expected module names")
        object.__setattr__(self, "target_modules", tuple(self.target_modules))

    def args(self) -> list[str]:
        out = ["--enable-lora", "--max-lora-rank", str(self.max_rank), "--lora-target-modules",
               *self.target_modules, "--max-loras-per-batch", str(self.max_loras_per_batch)]
        return out + (["--lora-backend", self.backend] if self.backend is not None else [])


@dataclass(frozen=True)
class EngineConfig:
    """How to start one SGLang server. ``None`` leaves SGLang's default; ``port=None`` picks a free port.

    ``device="auto"`` resolves to ``cuda`` or ``cpu`` at launch. ``extra_args`` are appended to the
    command line verbatim; ``env`` is added to the subprocess environment. Path fields accept ``str``
    or any path-like (``model_path`` is kept as ``str``, the folders as :class:`~pathlib.Path`).
    Values are checked at construction; the model folder itself is checked at launch (it may not
    exist on the machine that builds the config).

    ``return_routed_experts``: a mixture-of-experts engine captures the experts of every position and
    returns them to requests that ask (``--enable-return-routed-experts``; :mod:`agentrl.rollout.routing`).

    ``log_level_http`` is the level of the engine's HTTP server (uvicorn) log, ``error`` by default:
    sglang-router 0.3.2 probes every worker it registers for gRPC as well as HTTP, at once, and the
    gRPC probe's HTTP/2 preface reaches the engine's HTTP port, which logs each one as a warning,
    "Invalid HTTP request received." (two per registration; the router has no option to skip the
    probe). ``None`` uses ``log_level``.
    """

    model_path: str | os.PathLike[str]
    host: str = "127.0.0.1"
    port: int | None = None
    device: Literal["auto", "cpu", "cuda", "npu"] = "auto"
    dtype: str = "bfloat16"
    tp_size: int = 1
    dp_size: int = 1
    base_gpu_id: int | None = None
    gpu_id_step: int | None = None
    context_length: int | None = None
    max_total_tokens: int | None = None
    mem_fraction_static: float | None = None
    attention_backend: str | None = None
    served_model_name: str | None = None
    weight_version: str | None = None
    random_seed: int | None = None
    enable_memory_saver: bool = False
    log_level: str = "warning"
    log_level_http: str | None = "error"
    startup_timeout_s: float = 600.0
    health_poll_s: float = 1.0
    shim_dir: str | os.PathLike[str] | None = None
    log_dir: str | os.PathLike[str] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    lora: EngineLora | None = None
    return_routed_experts: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model_path, (str, os.PathLike)) or not os.fspath(self.model_path):
            raise ValueError(f"EngineConfig.model_path={self.model_path!r}: expected a model folder (str or Path)")
        object.__setattr__(self, "model_path", os.fspath(self.model_path))
        for name in ("shim_dir", "log_dir"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, (str, os.PathLike)):
                    raise ValueError(f"EngineConfig.{name}={value!r}: expected a folder (str or Path) or None")
                object.__setattr__(self, name, Path(value))
        _one_of("device", self.device, DEVICES)
        _one_of("dtype", self.dtype, DTYPES)
        _one_of("log_level", self.log_level, LOG_LEVELS)
        if self.log_level_http is not None:
            _one_of("log_level_http", self.log_level_http, LOG_LEVELS)
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 1 <= self.port <= 65535):
            raise ValueError(f"EngineConfig.port={self.port!r}: expected None (a free port) or an int in [1, 65535]")
        for name in ("base_gpu_id",):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"EngineConfig.{name}={value!r}: expected None or an int >= 0")
        for name in ("tp_size", "dp_size", "context_length", "max_total_tokens", "gpu_id_step"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"EngineConfig.{name}={value!r}: expected an int >= 1")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static <= 1:
            raise ValueError(f"EngineConfig.mem_fraction_static={self.mem_fraction_static!r}: expected a value in (0, 1]")
        _at_least("startup_timeout_s", self.startup_timeout_s, 0, above=True)
        _at_least("health_poll_s", self.health_poll_s, 0, above=True)
        if isinstance(self.extra_args, str) or not all(isinstance(a, str) for a in self.extra_args):
            raise ValueError(f"EngineConfig.extra_args={self.extra_args!r}: expected a tuple of strings, one per "
                             "command-line word")
        object.__setattr__(self, "extra_args", tuple(self.extra_args))
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in dict(self.env).items()):
            raise ValueError(f"EngineConfig.env={dict(self.env)!r:.200}: expected str keys and str values")

    @property
    def folder_needs(self) -> tuple[Need, ...]:
        """What the model folder must hold: weights and config, and a tokenizer unless another is named."""
        own_tokenizer = not any(a in ("--tokenizer-path", "--skip-tokenizer-init") or a.startswith("--tokenizer-path=")
                                for a in self.extra_args)
        return ("config", "weights", "tokenizer") if own_tokenizer else ("config", "weights")

    def command(self, port: int, device: str) -> list[str]:
        """The ``sglang.launch_server`` command line for ``port`` on ``device``."""
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", os.fspath(self.model_path),
               "--host", self.host, "--port", str(port), "--dtype", self.dtype, "--device", device,
               "--tp-size", str(self.tp_size), "--dp-size", str(self.dp_size), "--log-level", self.log_level]
        optional: list[tuple[str, Any]] = [
            ("--context-length", self.context_length), ("--max-total-tokens", self.max_total_tokens),
            ("--mem-fraction-static", self.mem_fraction_static), ("--attention-backend", self.attention_backend),
            ("--served-model-name", self.served_model_name), ("--weight-version", self.weight_version),
            ("--random-seed", self.random_seed), ("--log-level-http", self.log_level_http),
            ("--base-gpu-id", self.base_gpu_id), ("--gpu-id-step", self.gpu_id_step),
        ]
        for flag, value in optional:
            if value is not None:
                cmd += [flag, str(value)]
        if self.enable_memory_saver:
            cmd.append("--enable-memory-saver")
        if self.return_routed_experts:
            cmd.append("--enable-return-routed-experts")
        if self.lora is not None:
            cmd += self.lora.args()
        return [*cmd, *self.extra_args]

    def expected_server_info(self) -> dict[str, Any]:
        """The ``/server_info`` fields an engine started from this config must report."""
        out: dict[str, Any] = {"model_path": self.model_path, "tp_size": self.tp_size, "dp_size": self.dp_size,
                               "dtype": self.dtype}
        if self.device != "auto":
            out["device"] = self.device
        for name in ("context_length", "max_total_tokens", "served_model_name", "attention_backend"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def _path_or_none(value: str | os.PathLike[str] | None) -> Path | None:
    return None if value is None else Path(value)


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def engine_environment(device: str, *, extra: Mapping[str, str] | None = None,
                       shim_dir: Path | None = None) -> dict[str, str]:
    """The environment of an SGLang server subprocess on ``device``.

    On CPU: ``SGLANG_USE_CPU_ENGINE=1``, the shim folder in front of ``PYTHONPATH`` (the shims
    exist for that subprocess only) and, unless set already, ``SGLANG_EXTERNAL_MODEL_PACKAGE`` naming
    the shims' model package (SGLang registers its Qwen2/Qwen3/Llama classes up front and imports its other
    model files only for another architecture). The shims make the engine fork its scheduler and
    detokenizer rather than spawn them (no CUDA context to protect; ~14 of a tiny engine's ~27 CPU-s of
    start-up were those two processes importing torch, transformers and SGLang again);
    ``AGENTRL_SGLANG_START_METHOD=spawn`` restores SGLang's own. Raises :class:`EngineError` if the shims
    are missing or that variable names no start method.
    """
    env = dict(os.environ)
    env.update(extra or {})
    if device == "cpu":
        shims = shim_dir or default_shim_dir()
        if not (shims / "sgl_kernel" / "__init__.py").exists():
            raise EngineError(f"CPU SGLang shims not found in {shims}: run scripts/setup.sh (stage extra-sglang) "
                              "or set EngineConfig.shim_dir / AGENTRL_SGLANG_SHIM_DIR")
        method = env.get("AGENTRL_SGLANG_START_METHOD", "fork")  # read by the shims' sitecustomize
        if method not in ("fork", "spawn", "forkserver"):
            raise EngineError(f"AGENTRL_SGLANG_START_METHOD={method!r}: expected fork (the default on CPU), "
                              "spawn (SGLang's own) or forkserver")
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shims), env.get("PYTHONPATH", "")) if p)
        if (shims / CPU_MODEL_PACKAGE / "__init__.py").exists():  # the scheduler skips importing every model file
            env.setdefault("SGLANG_EXTERNAL_MODEL_PACKAGE", CPU_MODEL_PACKAGE)
    return env


class SGLangEngine:
    """One SGLang server: launched (owns its process tree) or attached (owns nothing).

    Control methods raise :class:`EngineError` on an HTTP error status or when the engine cannot be
    reached, naming the endpoint and the reason.
    """

    def __init__(self, url: str, config: EngineConfig | None, process: EngineProcess | None,
                 starter: EngineStarter | None = None) -> None:
        self.url = url.rstrip("/")
        self.config = config
        self.process = process
        self.starter = starter
        self.restarts = 0

    # ----- lifecycle -------------------------------------------------------------------------------

    @classmethod
    async def launch(cls, config: EngineConfig, starter: EngineStarter | None = None) -> SGLangEngine:
        """Starts the server and waits until it is healthy; on failure stops it and raises.
        ``starter``: who starts the process (``None``: a subprocess of this one).

        The model folder is checked first (:class:`~agentrl.model_folder.ModelFolderError`
        in one line, before any process starts) when the engine starts here."""
        if starter is None:
            check_model_folder(config.model_path, needs=config.folder_needs, what="EngineConfig.model_path")
        engine = cls(url="http://unset", config=config, process=None, starter=starter)
        await engine._start(config.port)
        return engine

    async def _start(self, port: int | None) -> None:
        config = self.config
        assert config is not None
        if self.starter is not None:
            self.url, self.process = await self.starter.start(config, port)
            self.url = self.url.rstrip("/")
            return
        device = await asyncio.to_thread(detect_device) if config.device == "auto" else config.device
        env = engine_environment(device, extra=config.env, shim_dir=_path_or_none(config.shim_dir))
        log_dir = _path_or_none(config.log_dir) or default_log_dir()
        # a port drawn here can still be taken before the server binds it: draw again, a few times
        tries = 1 if port else PORT_DRAWS
        for attempt in range(1, tries + 1):
            use = port or free_port(config.host)
            self.url = f"http://{config.host}:{use}"
            try:
                self.process = await ManagedProcess.start(
                    config.command(use, device), env=env, log_path=log_dir / f"sglang-{use}.log",
                    name=f"sglang:{use}", ready=lambda process: self._wait_healthy(process, config.startup_timeout_s),
                    # SGLang's server takes its scheduler's SIGTERM exit for a crash and sleeps 5 s before exiting
                    kill_root_first=True)
                return
            except EnginePortTaken:
                if attempt == tries:
                    raise
                log.warning("SGLang server: port %d was taken before it bound it; starting on another", use)

    async def wait_healthy(self, timeout_s: float) -> None:
        """Polls ``/health_generate`` until 200; raises if the process exits or time runs out."""
        await self._wait_healthy(self.process if isinstance(self.process, ManagedProcess) else None, timeout_s)

    async def _wait_healthy(self, process: ManagedProcess | None, timeout_s: float) -> None:
        poll = self.config.health_poll_s if self.config else 1.0
        await wait_ready(lambda: self.healthy(timeout_s=max(5.0, poll)), what=f"SGLang server {self.url}",
                         timeout_s=timeout_s, poll_s=poll, error_cls=EngineError, process=process,
                         port=urlsplit(self.url).port if process is not None else None, port_taken_cls=EnginePortTaken)

    @classmethod
    async def attach(cls, url: str, expected: EngineConfig | Mapping[str, Any] | None = None) -> SGLangEngine:
        """Adopts a running engine; every expected ``/server_info`` field must match exactly."""
        engine = cls(url, expected if isinstance(expected, EngineConfig) else None, process=None)
        info = await engine.server_info()
        want = expected.expected_server_info() if isinstance(expected, EngineConfig) else dict(expected or {})
        mismatches = {k: (info.get(k, "<missing>"), v) for k, v in want.items() if info.get(k, "<missing>") != v}
        if mismatches:
            detail = ", ".join(f"{k}: engine has {got!r}, expected {exp!r}" for k, (got, exp) in mismatches.items())
            raise EngineError(f"refusing to attach to {url}: server_info differs from the configuration ({detail})")
        return engine

    @property
    def local(self) -> bool:
        """Whether the engine runs on this machine (launched here, or on a loopback address), so that a
        folder path means the same to it as to this process."""
        return isinstance(self.process, ManagedProcess) or _is_loopback(self.url)

    def alive(self) -> bool:
        """For a launched engine: its process runs. For an attached engine: always True (use healthy)."""
        return self.process.alive() if self.process is not None else True

    async def healthy(self, timeout_s: float = 5.0, *, generate: bool = True) -> bool:
        """Whether ``/health_generate`` (a one-token generation when the engine is idle; ``generate=False``:
        ``/health``, the HTTP server alone) answers 200 within ``timeout_s``."""
        try:
            await self._call("GET", "/health_generate" if generate else "/health", timeout_s=timeout_s)
            return True
        except EngineError:
            return False

    def stop(self) -> None:
        """Stops the process tree this launcher started; a no-op for attached engines. Blocks up to
        about 20 s: in async code run it with ``await asyncio.to_thread(engine.stop)``."""
        if self.process is not None:
            self.process.stop()

    async def restart(self) -> None:
        """Stops (if still running) and starts the engine again on the same port (through the same
        starter), waiting until healthy."""
        if self.config is None:
            raise EngineError(f"cannot restart attached engine {self.url}: it was not launched by agentrl")
        port = int(self.url.rsplit(":", 1)[1])
        await asyncio.to_thread(self.stop)
        self.restarts += 1
        await self._start(port)

    # ----- HTTP ------------------------------------------------------------------------------------

    async def _call(self, method: str, path: str, body: Any = None, timeout_s: float = 600.0) -> Any:
        return await request_json(method, self.url + path, body, timeout_s=timeout_s, error_cls=EngineError,
                                  text_fallback=True)

    async def _checked(self, path: str, body: Mapping[str, Any], timeout_s: float = 600.0) -> dict[str, Any]:
        reply = await self._call("POST", path, dict(body), timeout_s=timeout_s)
        if isinstance(reply, dict) and reply.get("success") is False:
            raise EngineError(f"POST {self.url}{path} failed: {reply.get('message', reply)}")
        return reply if isinstance(reply, dict) else {"reply": reply}

    async def server_info(self) -> dict[str, Any]:
        info = await self._call("GET", "/server_info", timeout_s=30.0)
        if not isinstance(info, dict):
            raise EngineError(f"GET {self.url}/server_info: expected a JSON object, got {info!r:.200}")
        return info

    async def model_info(self) -> dict[str, Any]:
        info = await self._call("GET", "/model_info", timeout_s=30.0)
        return info if isinstance(info, dict) else {}

    async def weight_version(self) -> str:
        return str((await self.model_info()).get("weight_version"))

    async def loads(self) -> Any:
        return await self._call("GET", "/v1/loads?include=core", timeout_s=30.0)

    async def active_requests(self) -> int:
        """Running plus waiting requests over all DP ranks (``/v1/loads``)."""
        body = await self.loads()
        loads = body.get("loads") if isinstance(body, dict) else None
        if not isinstance(loads, list):
            raise EngineError(f"GET {self.url}/v1/loads: expected an object with a 'loads' list, got {body!r:.200}")
        return sum(int(x.get("num_running_reqs", 0)) + int(x.get("num_waiting_reqs", 0)) for x in loads)

    async def wait_idle(self, timeout_s: float = 60.0, poll_s: float = 0.2) -> None:
        """Waits until no request runs or waits; raises :class:`EngineError` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (active := await self.active_requests()) > 0:
            if time.monotonic() > deadline:
                raise EngineError(f"{self.url} still has {active} active requests after {timeout_s} s")
            await asyncio.sleep(poll_s)

    # ----- generation control ----------------------------------------------------------------------

    async def abort_all(self) -> None:
        await self._call("POST", "/abort_request", {"abort_all": True}, timeout_s=30.0)

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """``abort`` returns running requests as aborted, ``retract`` requeues them, ``in_place`` keeps KV."""
        await self._call("POST", "/pause_generation", {"mode": mode}, timeout_s=60.0)

    async def continue_generation(self) -> None:
        await self._call("POST", "/continue_generation", {}, timeout_s=60.0)

    async def flush_cache(self, timeout_s: float = 30.0) -> None:
        """Clears the radix cache, letting the scheduler wait up to ``timeout_s`` for running requests."""
        await self._call("POST", f"/flush_cache?timeout={timeout_s}", None, timeout_s=timeout_s + 30.0)

    # ----- weight updates --------------------------------------------------------------------------

    async def update_weights_from_disk(self, model_path: str | os.PathLike[str], weight_version: str, *,
                                       flush_cache: bool = True, abort_all_requests: bool = False,
                                       load_format: str | None = None) -> dict[str, Any]:
        """Loads weights from ``model_path``; later results echo ``weight_version``.

        For an engine on this machine (launched, or attached on a loopback address) the folder is
        checked first, so a wrong path fails in one line instead of the engine looking it up on a hub."""
        if self.local:
            check_model_folder(model_path, needs=("config", "weights"), what="update_weights_from_disk: model_path")
        body: dict[str, Any] = {"model_path": os.fspath(model_path), "weight_version": str(weight_version),
                                "flush_cache": flush_cache, "abort_all_requests": abort_all_requests}
        if load_format is not None:
            body["load_format"] = load_format
        return await self._checked("/update_weights_from_disk", body)

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False) -> None:
        await self._checked("/update_weight_version",
                            {"new_version": str(new_version), "abort_all_requests": abort_all_requests})

    async def begin_weight_update(self) -> dict[str, Any]:
        """Opens SGLang's weight-update session: tensor and distributed updates are refused outside one
        (SGLang 0.5.23: HTTP 400 "must run between begin_weight_update() and end_weight_update()")."""
        return await self._checked("/begin_weight_update", {"selector": "all"}, timeout_s=120.0)

    async def end_weight_update(self) -> dict[str, Any]:
        """Closes the session (SGLang post-processes the loaded weights)."""
        return await self._checked("/end_weight_update", {}, timeout_s=600.0)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str, backend: str = "nccl") -> dict[str, Any]:
        """Joins the trainer's process group ``group_name`` (the engine's TP rank *r* as
        ``rank_offset + r``); blocks until the trainer joins too, so call it concurrently with that."""
        return await self._checked("/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], group_name: str,
                                              weight_version: str, *, flush_cache: bool = True,
                                              load_format: str | None = None) -> dict[str, Any]:
        """Receives one bucket the trainer broadcasts in ``group_name`` (``load_format
        "flattened_bucket"``: one flat ``uint8`` buffer of the weights back to back); returns once
        the engine loaded it, so call it concurrently with the broadcast. Inside a session."""
        body: dict[str, Any] = {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                                "group_name": group_name, "weight_version": str(weight_version),
                                "flush_cache": flush_cache}
        if load_format is not None:
            body["load_format"] = load_format
        return await self._checked("/update_weights_from_distributed", body)

    async def destroy_weights_update_group(self, group_name: str) -> dict[str, Any]:
        return await self._checked("/destroy_weights_update_group", {"group_name": group_name})

    async def update_weights_from_tensor(self, serialized_named_tensors: Sequence[str], weight_version: str, *,
                                         load_format: str | None = None, flush_cache: bool = True) -> dict[str, Any]:
        """Same host: one serialized payload per TP rank (shared-memory tensors on CPU, CUDA IPC
        handles on GPU; each rank loads full tensors and shards them itself). Inside a session."""
        body: dict[str, Any] = {"serialized_named_tensors": list(serialized_named_tensors),
                                "weight_version": str(weight_version), "flush_cache": flush_cache}
        if load_format is not None:
            body["load_format"] = load_format
        return await self._checked("/update_weights_from_tensor", body)

    async def load_lora_adapter(self, name: str, path: str | os.PathLike[str], *, pinned: bool = False) -> dict[str, Any]:
        """Loads a PEFT adapter folder under ``name`` (SGLang refuses a name already loaded)."""
        return await self._checked("/load_lora_adapter", {"lora_name": name, "lora_path": os.fspath(path),
                                                          "pinned": pinned}, timeout_s=300.0)

    async def load_lora_adapter_from_tensors(self, name: str, config: Mapping[str, Any],
                                             serialized_named_tensors: Sequence[str], *,
                                             load_format: str | None = None) -> dict[str, Any]:
        """Loads an adapter from tensors (one serialized payload per TP rank; same host) under ``name``,
        with ``config`` its PEFT ``adapter_config``."""
        body: dict[str, Any] = {"lora_name": name, "config_dict": dict(config),
                                "serialized_named_tensors": list(serialized_named_tensors)}
        if load_format is not None:
            body["load_format"] = load_format
        return await self._checked("/load_lora_adapter_from_tensors", body, timeout_s=300.0)

    async def lora_adapters(self) -> list[str]:
        """The names of the adapters loaded now (``/v1/models``: the served model, then each adapter)."""
        reply = await self._call("GET", "/v1/models", timeout_s=30.0)
        cards = reply.get("data", []) if isinstance(reply, dict) else []
        return [str(c["id"]) for c in cards if isinstance(c, dict) and c.get("parent")]

    async def unload_lora_adapter(self, name: str) -> dict[str, Any]:
        """Unloads ``name`` (SGLang waits for the requests that use it)."""
        return await self._checked("/unload_lora_adapter", {"lora_name": name}, timeout_s=300.0)

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """GPU (needs ``enable_memory_saver``): frees weights / KV cache / CUDA graphs."""
        await self._call("POST", "/release_memory_occupation", {"tags": list(tags)} if tags else {})

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        await self._call("POST", "/resume_memory_occupation", {"tags": list(tags)} if tags else {})
