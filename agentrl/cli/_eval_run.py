"""The work behind ``agentrl eval``: checkpoint export, engines or an endpoint, results on disk and
on the terminal. User errors exit with status 2 (:func:`agentrl.cli._errors.fail`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.cli._errors import fail

if TYPE_CHECKING:
    from agentrl.rollout.eval import EvalReport
    from agentrl.runner.config import RunConfig
    from agentrl.runner.envs import EnvFactory

__all__ = ["EvalRun", "check_model_arg", "export_checkpoint", "print_table", "resolve_checkpoint",
           "run_endpoint", "run_engines", "write_reports"]


@dataclass
class EvalRun:
    reports: list[EvalReport]
    model: str | None = None


def check_model_arg(path: Path) -> Path:
    from agentrl.model_folder import ModelFolderError, check_model_folder

    try:
        return check_model_folder(path, what="--model")
    except ModelFolderError as exc:
        fail(str(exc))


def resolve_checkpoint(path: Path) -> Path:
    from agentrl.runner.checkpoint import CheckpointError, RunCheckpointer

    try:
        folder = RunCheckpointer.resolve(path)
    except CheckpointError as exc:
        fail(f"--checkpoint: {exc}")
    from agentrl.train.checkpoint import trainer_path

    if not trainer_path(folder / "trainer").is_file():
        fail(f"--checkpoint {str(folder)!r}: no trainer/trainer.pt in it (a checkpoint of the torch backend expected)")
    return folder


def export_checkpoint(config: RunConfig, checkpoint: Path, out: Path) -> Path:
    """The checkpoint's weights as a Hugging Face folder: ``model.path``'s config and the tokenizer,
    the trained state dict loaded over them. Written once per checkpoint (reused when complete)."""
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.model_folder import ModelFolderError, check_model_folder
    from agentrl.train.checkpoint import trainer_path

    try:
        base = check_model_folder(config.model.path, what="model.path")
    except ModelFolderError as exc:
        fail(str(exc))
    saved = torch.load(trainer_path(checkpoint / "trainer"), map_location="cpu", weights_only=True)
    state = saved["model"]
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=next(iter(state.values())).dtype)
    if saved.get("lora"):  # a LoRA run: its adapter, merged into the base
        model = _merged(model, state, config, checkpoint)
    else:
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:  # a tied lm_head is not saved
            fail(f"--checkpoint {str(checkpoint)!r}: its weights do not fit model.path={config.model.path!r} "
                 f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(str(tmp), safe_serialization=True)
    AutoTokenizer.from_pretrained(config.model.tokenizer, local_files_only=True).save_pretrained(str(tmp))
    tmp.rename(out)
    return out


def _merged(model: Any, adapter: dict[str, Any], config: RunConfig, checkpoint: Path) -> Any:
    """``model`` with a LoRA checkpoint's ``adapter`` state merged in (``train.lora`` of ``config``
    rebuilds the layers it was saved from)."""
    from agentrl.train.lora import attach_lora

    if config.train.lora is None:
        fail(f"--checkpoint {str(checkpoint)!r}: it holds a LoRA adapter but the config has no train.lora; "
             "expected the config of the run that wrote it")
    lora = attach_lora(model, config.train.lora)
    try:
        lora.load_state_dict(adapter)
    except (KeyError, RuntimeError, ValueError) as exc:
        fail(f"--checkpoint {str(checkpoint)!r}: its adapter does not fit train.lora={config.train.lora} on "
             f"model.path={config.model.path!r}: {exc}")
    return lora.wrapper.merge_and_unload()


def run_engines(config: RunConfig, factory: EnvFactory, sets: list[tuple[Any, list[Any]]], served: Path | None,
                logs: Path) -> EvalRun:
    """Starts the config's router and engines on ``served`` (``None``: ``model.path``), evaluates each set
    with the environments ``factory`` builds."""
    return EvalRun(asyncio.run(_engines(config, factory, sets, served, logs)))


async def _engines(config: RunConfig, factory: EnvFactory, sets: list[tuple[Any, list[Any]]], served: Path | None,
                   logs: Path) -> list[EvalReport]:
    from transformers import AutoTokenizer

    from agentrl.chat.template import ChatTemplate
    from agentrl.rollout.eval import evaluate
    from agentrl.rollout.health import EngineGroup
    from agentrl.rollout.opening import OpeningCache

    logs.mkdir(parents=True, exist_ok=True)
    base = config.engine_config()
    if served is not None:
        base = dataclasses.replace(base, model_path=str(served))
    n = config.rollout.engines.count
    envs = _cpu_envs(n) if config.cluster.accelerator == "cpu" else [{}] * n
    engine_cfgs = [dataclasses.replace(base, log_dir=logs, env={**envs[i], **base.env}) for i in range(n)]
    router_cfg = dataclasses.replace(config.rollout.router, log_dir=logs)
    tokenizer = AutoTokenizer.from_pretrained(config.model.tokenizer, local_files_only=True)
    template = ChatTemplate.from_name(config.model.template, tokenizer=tokenizer)
    started = time.perf_counter()
    group = await EngineGroup.launch(engine_cfgs, router_cfg)
    print(f"engines ready: {n} behind {group.router.url} ({time.perf_counter() - started:.0f} s)", flush=True)
    try:
        async with group.client() as client:
            cache = OpeningCache(template)
            return [await evaluate(factory, template, client, rows, section.to_eval_config(),
                                   agent=config.agent_config(), opening_cache=cache) for section, rows in sets]
    finally:
        await group.shutdown()


def _cpu_envs(n: int) -> list[dict[str, str]]:
    from agentrl.runner.cpu import plan_cpu

    try:
        plan = plan_cpu(engines=n, engine_fraction=1.0)
    except ValueError:
        return [{}] * n
    return [plan.engine_env(i) for i in range(n)]


def run_endpoint(config: RunConfig, factory: EnvFactory, sets: list[tuple[Any, list[Any]]], url: str,
                 model: str | None, api_key: str | None) -> EvalRun:
    """Evaluates each set against the OpenAI-compatible server at ``url`` (message-level episodes)."""
    from agentrl.rollout.endpoint import ChatEndpoint, EndpointError, evaluate_endpoint

    per_turn = config.rollout.sampling.max_new_tokens

    async def go() -> EvalRun:
        async with ChatEndpoint(url, model=model, api_key=api_key) as endpoint:
            try:
                name = await endpoint.model_name()
            except EndpointError as exc:
                fail(f"--endpoint {url!r}: {exc}")
            reports = [await evaluate_endpoint(factory, endpoint, rows, section.to_eval_config(),
                                               max_new_tokens=per_turn) for section, rows in sets]
            return EvalRun(reports, model=name)

    return asyncio.run(go())


def _episode_record(episode: Any) -> dict[str, Any]:
    traj = episode.trajectory
    if traj.message_level:  # the conversation, as SFT data reads it
        return {"messages": [m.to_dict() for m in traj.messages], "reward": traj.reward,
                "status": traj.status.value, "stop_reason": traj.stop_reason.value if traj.stop_reason else None,
                "sample_id": traj.sample_id, "metrics": traj.metrics, "info": traj.info,
                "errors": [e.to_dict() for e in traj.errors]}
    out: dict[str, Any] = episode.to_dict()
    return out


def write_reports(folder: Path, reports: list[EvalReport], source: dict[str, Any], config: RunConfig) -> list[Path]:
    """``<set>.json`` (the figures, the source, the config hash) and ``<set>.episodes.jsonl`` per set."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for report in reports:
        message_level = any(ep.trajectory.message_level for ep in report.episodes)
        body = {**report.to_dict(), "source": source, "message_level": message_level,
                "config_hash": config.hash(), "time": time.time()}
        path = folder / f"{report.name}.json"
        path.write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")
        with open(folder / f"{report.name}.episodes.jsonl", "w") as f:
            for ep in report.episodes:
                f.write(json.dumps(_episode_record(ep), default=str) + "\n")
        paths.append(path)
    return paths


def print_table(reports: list[EvalReport], source: dict[str, Any], paths: list[Path]) -> None:
    from rich.console import Console
    from rich.table import Table

    what = source.get("url") or source.get("path")
    table = Table(title=f"agentrl eval: {source['kind']} {what}")
    ks = sorted({k for r in reports for k in r.pass_at_k})
    for col in ("set", "prompts", "samples", "mean reward", *(f"pass@{k}" for k in ks), "tool-call rate",
                "truncated", "failed", "failure kinds", "errors", "wall s"):
        table.add_column(col)
    for r in reports:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.failure_kinds.items(), key=lambda kv: -kv[1])[:4]) or "-"
        errors = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items(), key=lambda kv: -kv[1])) or "-"
        table.add_row(r.name, str(r.prompts), str(r.samples), f"{r.mean_reward:.3f}",
                      *(f"{r.pass_at_k[k]:.3f}" if k in r.pass_at_k else "-" for k in ks),
                      f"{r.tool_call_rate:.3f}", f"{r.truncation_rate:.3f}", f"{r.failure_rate:.3f}", kinds, errors,
                      f"{r.wall_s:.1f}")
    console = Console()
    if not console.is_terminal:  # a log or a pipe: as wide as the table needs, never cut or wrapped
        console = Console(width=max(Console(width=100_000).measure(table).maximum, 80))
    console.print(table)
    for p in paths:
        console.print(f"results: {p}", soft_wrap=True)
