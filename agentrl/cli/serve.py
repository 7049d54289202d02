"""``agentrl serve MODEL``: one SGLang engine for a model folder, rendering and parsing conversations
with agentrl's chat template, until Ctrl-C or SIGTERM.

    agentrl serve models/tiny-qwen3                          # this machine's GPU, else the CPU recipe
    agentrl serve models/qwen3-4b --port 30000 --template qwen3
    agentrl eval run.toml --endpoint http://127.0.0.1:30000/v1

The engine starts as a run's engines do (:class:`~agentrl.rollout.EngineConfig` and
:meth:`~agentrl.rollout.SGLangEngine.launch`; on a machine without a GPU the CPU recipe: the import
shims of ``scripts/setup.sh``, float32, a KV budget of :data:`CPU_MAX_TOTAL_TOKENS` tokens, every
core of this process), with ``--chat-template`` set to agentrl's template file and
``--tool-call-parser`` to SGLang's parser for that template's call format
(:data:`TOOL_CALL_PARSERS`: ``qwen25`` reads Qwen3's JSON calls, ``qwen3_coder`` the XML calls of
Qwen3.5 and Qwen3-Coder). Its OpenAI-compatible ``/v1`` endpoint therefore renders prompts and reads
calls the way training does.

``--adapter DIR`` serves a LoRA adapter (a peft folder: what a LoRA run or ``agentrl sft`` with
``train.lora`` writes) on top of MODEL, its base: LoRA serving is enabled with the adapter's rank and
target modules, and the adapter is loaded at start under its folder's name (``--adapter-name``). A
request selects it with ``"model": "MODEL:NAME"`` (``agentrl eval --endpoint URL/v1 --api-model
MODEL:NAME``); a request naming MODEL alone gets the base model.

The template is ``--template`` (a shipped name or a ``.jinja`` file), else chosen from the model
folder (:func:`template_for`): ``qwen3_5`` for a ``qwen3_5*`` model type, ``qwen3_coder`` when the
model's own chat template writes XML calls, ``qwen3`` otherwise; the command prints which and why.

Exit status: 0 after Ctrl-C/SIGTERM (the engine and everything it started are stopped), 1 when the
engine cannot start or dies, 2 for bad arguments (``error: ...`` on stderr, nothing started).
"""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentrl.cli._errors import fail

if TYPE_CHECKING:
    from agentrl.rollout.engine import EngineConfig

__all__ = ["CPU_MAX_TOTAL_TOKENS", "TOOL_CALL_PARSERS", "ServeError", "ServePlan", "plan_serve", "read_adapter",
           "serve", "template_for"]

TOOL_CALL_PARSERS: dict[str, str] = {"json": "qwen25", "xml": "qwen3_coder"}
"""SGLang's ``--tool-call-parser`` for each tool-call format of a chat template."""

CPU_MAX_TOTAL_TOKENS = 8192
"""The KV-cache budget (tokens) on CPU when ``--max-total-tokens`` is not given: SGLang cannot size
its cache there."""

_POLL_S = 1.0  # how often the wait checks that the engine is still alive


class ServeError(ValueError):
    """An argument of ``agentrl serve`` that cannot be used; the message names it, its value and what
    was expected."""


@dataclass(frozen=True)
class ServePlan:
    """What ``agentrl serve`` starts: the engine's config, the template (its name or file, and why it
    was chosen), SGLang's tool-call parser for it, and the LoRA adapter's name (``None``: none)."""

    config: EngineConfig
    template: str
    template_file: Path
    parser: str
    why: str
    adapter: str | None = None

    @property
    def adapter_model(self) -> str | None:
        """The ``model`` a request names to go through the adapter."""
        return f"{self.config.model_path}:{self.adapter}" if self.adapter is not None else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _own_template(model: Path) -> str:
    """The model folder's own chat template text ("" when it has none)."""
    jinja = model / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8", errors="replace")
    source = _read_json(model / "tokenizer_config.json").get("chat_template")
    if isinstance(source, list):  # several named templates: the default one
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), "")
    return source if isinstance(source, str) else ""


def _shipped_file(name: str) -> Path:
    file = Path(str(importlib.resources.files("agentrl.templates").joinpath(f"{name}.jinja")))
    if not file.is_file():
        raise ServeError(f"--template {name!r}: the shipped file {file} is not on disk (agentrl installed as a "
                         "zip?); pass the path of a .jinja file instead")
    return file


def template_for(model: Path, template: str | None) -> tuple[str, Path, str, str]:
    """``(template, its file, SGLang's tool-call parser, why it was chosen)`` for ``model``;
    ``template`` ``None`` chooses from the model folder (see the module doc)."""
    from agentrl.chat.template import TEMPLATE_NAMES, ChatTemplate, detect_tool_call_format

    def shipped(name: str, why: str) -> tuple[str, Path, str, str]:
        return name, _shipped_file(name), TOOL_CALL_PARSERS[ChatTemplate.from_name(name).tool_call_format], why

    if template is None:
        model_type = str(_read_json(model / "config.json").get("model_type", ""))
        if model_type.startswith("qwen3_5"):
            name, why = "qwen3_5", f"the model type is {model_type!r}"
        elif detect_tool_call_format(_own_template(model)) == "xml":
            name, why = "qwen3_coder", "the model's own chat template writes XML tool calls"
        else:
            name, why = "qwen3", "the default; --template chooses another"
        return shipped(name, why)
    if template in TEMPLATE_NAMES:
        return shipped(template, "--template")
    file = Path(template).expanduser()
    if file.suffix == ".jinja" and file.is_file():
        source = file.read_text(encoding="utf-8", errors="replace")
        return str(file), file.resolve(), TOOL_CALL_PARSERS[detect_tool_call_format(source)], "--template file"
    shown = ", ".join(repr(n) for n in TEMPLATE_NAMES)
    what = "no such .jinja file" if file.suffix == ".jinja" else "not a template name"
    raise ServeError(f"--template {template!r}: {what}; expected one of {shown} or the path of a .jinja file")


def read_adapter(folder: Path) -> tuple[int, tuple[str, ...]]:
    """``(rank, target modules)`` of the peft LoRA folder ``folder``; :class:`ServeError` naming what is
    missing or malformed."""
    config_file, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not folder.is_dir():
        raise ServeError(f"--adapter {str(folder)!r}: no such folder; expected a LoRA adapter folder (peft format)")
    missing = [f.name for f in (config_file, weights) if not f.is_file()]
    if missing:
        raise ServeError(f"--adapter {str(folder)!r}: {' and '.join(missing)} missing; expected a LoRA adapter "
                         "folder (peft format: adapter_config.json and adapter_model.safetensors)")
    data = _read_json(config_file)
    rank, targets = data.get("r"), data.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if data.get("peft_type", "LORA") != "LORA" or not isinstance(rank, int) or isinstance(rank, bool) or rank < 1 \
            or not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise ServeError(f"--adapter {str(folder)!r}: adapter_config.json has peft_type={data.get('peft_type')!r}, "
                         f"r={rank!r}, target_modules={targets!r}; expected a LORA adapter with an int r >= 1 and a "
                         "list of module names")
    return rank, tuple(sorted(targets))


def plan_serve(model: Path, *, host: str = "127.0.0.1", port: int | None = None, template: str | None = None,
               dtype: str | None = None, context_length: int | None = None, max_total_tokens: int | None = None,
               device: str = "auto", adapter: Path | None = None, adapter_name: str | None = None) -> ServePlan:
    """The engine ``agentrl serve`` starts for ``model`` (checked: a local model folder with config,
    weights and tokenizer); raises :class:`ServeError` naming the argument at fault. ``device="auto"``
    is resolved here (``nvidia-smi``), since the CPU recipe differs: float32, a KV budget, all cores.
    ``adapter``: a LoRA folder served on top of ``model`` under ``adapter_name`` (default: its folder's
    name)."""
    from agentrl.model_folder import ModelFolderError, check_model_folder
    from agentrl.rollout.engine import DEVICES, EngineConfig, EngineLora, detect_device
    from agentrl.runner.cpu import CpuPlan

    if device not in DEVICES:
        raise ServeError(f"--device {device!r}: expected one of {', '.join(DEVICES)}")
    try:
        folder = check_model_folder(model, what="MODEL")
    except ModelFolderError as exc:
        raise ServeError(str(exc)) from None
    template_name, file, parser, why = template_for(folder, template)
    resolved: Any = detect_device() if device == "auto" else device  # one of DEVICES (checked above)
    cpu = resolved == "cpu"
    env: dict[str, str] = {}
    if cpu:
        cores = tuple(sorted(os.sched_getaffinity(0)))
        env = CpuPlan(cores=cores, engine_cores=(cores,), trainer_cores=()).engine_env(0)
    lora: EngineLora | None = None
    lora_args: tuple[str, ...] = ()
    name: str | None = None
    if adapter is not None:
        rank, targets = read_adapter(adapter)
        name = adapter_name if adapter_name is not None else adapter.resolve().name
        if not name or any(c in name for c in "=:/ ") or name.startswith("{"):
            raise ServeError(f"--adapter-name {name!r}: expected a name without '=', ':', '/' or spaces")
        # torch_native: the LoRA kernels that run without an accelerator (SGLang's default needs one)
        lora = EngineLora(max_rank=rank, target_modules=targets, backend="torch_native" if cpu else None,
                          max_loras_per_batch=1)
        lora_args = ("--lora-paths", f"{name}={adapter.resolve()}")
    try:
        config = EngineConfig(
            model_path=str(folder.resolve()), host=host, port=port, device=resolved,
            dtype=dtype or ("float32" if cpu else "bfloat16"), context_length=context_length,
            max_total_tokens=max_total_tokens or (CPU_MAX_TOTAL_TOKENS if cpu else None), env=env,
            extra_args=("--chat-template", str(file), "--tool-call-parser", parser, *lora_args), lora=lora)
    except ValueError as exc:  # EngineConfig names its field: say which option that is
        flag = {"dtype": "--dtype", "device": "--device", "port": "--port", "context_length": "--context-length",
                "max_total_tokens": "--max-total-tokens"}
        text = str(exc)
        for field_name, option in flag.items():
            text = text.replace(f"EngineConfig.{field_name}=", f"{option} ")
        raise ServeError(text) from None
    return ServePlan(config=config, template=template_name, template_file=file, parser=parser, why=why, adapter=name)


async def _launch(config: EngineConfig) -> Any:
    from agentrl.rollout.engine import SGLangEngine

    return await SGLangEngine.launch(config)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the command the way Ctrl-C does: the engine is stopped


def _died(engine: Any) -> str:
    process = getattr(engine, "process", None)
    code = process.returncode() if process is not None else None
    log = getattr(process, "log_path", None)
    return f"the engine at {engine.url} exited (status {code})" + (f"; its log: {log}" if log is not None else "")


def _run(plan: ServePlan) -> int:
    """Starts the engine, prints where it answers, waits for Ctrl-C/SIGTERM or its death; always stops it.
    Returns the exit status."""
    from agentrl.model_folder import ModelFolderError
    from agentrl.rollout.engine import EngineError

    try:
        engine = asyncio.run(_launch(plan.config))
    except KeyboardInterrupt:
        typer.echo("interrupted before the engine was ready; it was stopped", err=True)
        return 130
    except (EngineError, ModelFolderError) as exc:
        typer.echo(f"error: the engine did not start: {exc}", err=True)
        return 1
    try:
        typer.echo(f"engine     {engine.url}\nopenai     {engine.url}/v1   (agentrl eval CONFIG --endpoint "
                   f"{engine.url}/v1)")
        if plan.adapter_model is not None:
            typer.echo(f"adapter    {plan.adapter}: requests naming model {plan.adapter_model!r} go through it "
                       f"(agentrl eval CONFIG --endpoint {engine.url}/v1 --api-model {plan.adapter_model})")
        typer.echo("Ctrl-C or SIGTERM stops it")
        while engine.alive():
            time.sleep(_POLL_S)
        typer.echo(f"error: {_died(engine)}", err=True)
        return 1
    except KeyboardInterrupt:
        typer.echo("stopping the engine")
        return 0
    finally:
        engine.stop()


def serve(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="A local Hugging Face model folder.")],
    port: Annotated[int | None, typer.Option("--port", help="Port to listen on (default: a free one).")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    template: Annotated[str | None, typer.Option("--template", help="qwen3, qwen3_5, qwen3_coder or a .jinja file "
                                                 "(default: chosen from the model folder).")] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="Serving dtype (default: float32 on CPU, else "
                                              "bfloat16).")] = None,
    context_length: Annotated[int | None, typer.Option("--context-length", min=1,
                                                       help="Longest sequence (default: the model's).")] = None,
    max_total_tokens: Annotated[int | None, typer.Option("--max-total-tokens", min=1, help="KV-cache budget in "
                                                         f"tokens (default on CPU: {CPU_MAX_TOTAL_TOKENS}).")] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or npu.")] = "auto",
    adapter: Annotated[Path | None, typer.Option("--adapter", help="A LoRA adapter folder (peft format) to serve on "
                                                 "top of MODEL.")] = None,
    adapter_name: Annotated[str | None, typer.Option("--adapter-name", help="The adapter's name in requests "
                                                     "(default: its folder's name).")] = None,
) -> None:
    """Serves MODEL with SGLang (agentrl's chat template and the tool-call parser for it) until Ctrl-C.

    Prints the engine's URL and its OpenAI base URL (URL/v1), which `agentrl eval --endpoint`
    and any OpenAI client use. Exit status: 0 after Ctrl-C/SIGTERM, 1 when the engine fails,
    2 for bad arguments.

    \b
    Examples:
      agentrl serve models/tiny-qwen3
      agentrl serve models/qwen3-4b --port 30000 --template qwen3
      agentrl serve models/tiny-qwen3 --device cpu --context-length 2048
      agentrl serve models/qwen3-8b --adapter runs/lora/adapter
    """
    try:
        plan = plan_serve(model, host=host, port=port, template=template, dtype=dtype, context_length=context_length,
                          max_total_tokens=max_total_tokens, device=device, adapter=adapter,
                          adapter_name=adapter_name)
    except ServeError as exc:
        fail(str(exc))
    cfg = plan.config
    typer.echo(f"serving    {cfg.model_path} on {cfg.device} ({cfg.dtype}); template {plan.template} ({plan.why}), "
               f"tool-call parser {plan.parser}" + (f"; LoRA adapter {adapter} as {plan.adapter!r}" if adapter else ""))
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        code = _run(plan)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code:
        raise typer.Exit(code=code)
