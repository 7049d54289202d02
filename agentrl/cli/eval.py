"""``agentrl eval CONFIG (--model PATH | --checkpoint DIR | --endpoint URL)``: evaluation rollouts.

``CONFIG`` is a config file or a run folder (``agentrl eval runs/exp1 --checkpoint runs/exp1``: the
run's own config, as ``agentrl train runs/exp1 --resume`` reads it). Runs the config's evaluation sets (``[[data.eval]]``; ``--eval-set NAME`` picks one, ``--data FILE``
evaluates one file instead) with the config's environment, reward, template and agent settings:

- ``--model PATH``: a Hugging Face folder served by the config's engines behind the router;
- ``--checkpoint DIR``: a run checkpoint (``step_NNNNNN``, or a run folder: its latest), exported
  to a Hugging Face folder (weights of the checkpoint, config and tokenizer of ``model.path``), then
  served the same way;
- ``--endpoint URL``: any OpenAI-compatible chat-completions server (messages in, messages out; e.g.
  ``agentrl serve MODEL``); its episodes are message-level and can never enter a training batch. An
  agent harness (:class:`agentrl.proxy.Agent`) runs against the endpoint itself, its client pointed
  there (:mod:`agentrl.proxy._endpoint`).

``environment.name`` is resolved as ``agentrl train`` resolves it: a built-in, an installed
package's entry point or ``module:attr`` (imported with the current directory on ``sys.path``).

Writes, per set, ``<set>.json`` (mean reward, pass@k, tool-call rate, failure kinds, truncation
rate...) and ``<set>.episodes.jsonl`` under ``evals/<source>/`` of the run folder (the
checkpoint's run, else ``logging.run_dir``) for a model or checkpoint, and under
``evals/endpoint-<model>/`` of the current directory for an endpoint (it belongs to no run);
``--out`` to choose. Prints a table. ``--print-config``
prints the resolved config and where each value came from, and exits. Examples::

    agentrl eval configs/toy.toml --model models/tiny
    agentrl eval configs/toy.toml --checkpoint runs/exp1            # its latest checkpoint
    agentrl eval runs/exp1 --checkpoint runs/exp1/step_000010        # the run's own config
    agentrl eval configs/toy.toml --endpoint http://127.0.0.1:30000/v1 --data test.jsonl
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentrl.cli._errors import fail

if TYPE_CHECKING:
    from agentrl.cli.config_files import ResolvedConfig
    from agentrl.runner.config import RunConfig
    from agentrl.runner.envs import EnvFactory

__all__ = ["eval_command", "load_config_file"]


def load_config_file(path: Path, overrides: list[str]) -> RunConfig:
    """The run config of ``path`` with ``key=value`` overrides, by the loader ``agentrl train`` uses;
    a user's mistake exits with status 2."""
    config: RunConfig = _resolve(path, overrides).config
    return config


def _resolve(path: Path, overrides: list[str]) -> ResolvedConfig:
    """``path``'s config: a config file, or a run folder's own config (as ``agentrl train RUN --resume``
    reads it: its ``config.json``, the run folder as ``logging.run_dir``)."""
    from agentrl.cli.config_files import ConfigError, load_run_config

    if path.is_dir():
        from agentrl.cli.train import resolve_target

        return resolve_target(path, overrides, resume=True)
    try:
        return load_run_config(path, overrides)
    except ConfigError as exc:
        fail(str(exc))


def _environment_factory(config: RunConfig) -> EnvFactory:
    """The ``row -> environment`` factory of ``config``: ``environment.name`` resolved as ``agentrl
    train`` resolves it (a built-in, an installed package's entry point or ``module:attr``, by
    :func:`agentrl.environments.registry.resolve`); an unknown name exits with status 2."""
    from agentrl.environments.registry import RegistryError, resolve
    from agentrl.runner.envs import environment_factory

    try:
        return environment_factory(config, resolve("environment", config.environment.name, allow_import=True))
    except RegistryError as exc:
        fail(f"environment.name: {exc}")
    except (ValueError, TypeError) as exc:
        fail(str(exc))


def _eval_sets(config: RunConfig, factory: EnvFactory, name: str | None, data: Path | None,
               limit: int | None) -> list[tuple[Any, list[Any]]]:
    """``(EvalDatasetSection, rows)`` of each set to run; rows checked against the environment."""
    from agentrl.data.source import DataError, read_rows
    from agentrl.runner._launch import row_validator
    from agentrl.runner._sections import EvalDatasetSection

    if data is not None:
        sections = [EvalDatasetSection(path=str(data), name=re.sub(r"[^\w.-]", "_", data.stem) or "eval")]
    elif name is not None:
        sections = [s for s in config.data.eval if s.name == name]
        if not sections:
            fail(f"--eval-set {name!r}: not an eval set of CONFIG (expected one of {[s.name for s in config.data.eval]})")
    else:
        sections = list(config.data.eval)
    if not sections:
        fail("CONFIG has no [[data.eval]] set: add one (name, path, samples_per_prompt, pass_k...) or pass --data FILE")
    out = []
    for section in sections:
        try:
            good, bad = read_rows(section.to_config(), validate=row_validator(factory))
        except DataError as exc:
            fail(f"data.eval {section.name!r}: {exc}")
        if bad:
            typer.echo(f"warning: data.eval {section.name!r}: {len(bad)} bad rows left out (first: {bad[0]})", err=True)
        rows = [row for _, row in good][:limit]
        if not rows:
            fail(f"data.eval {section.name!r}: {section.path!r} holds no usable row")
        out.append((section, rows))
    return out


def _out_folder(config: RunConfig, out: Path | None, label: str, checkpoint: Path | None) -> Path:
    if out is not None:
        return out
    root = checkpoint.parent.parent if checkpoint is not None else config.run_dir()
    return root / "evals" / label


def eval_command(
    config_path: Annotated[Path, typer.Argument(metavar="CONFIG", help="the run config (.toml or .yaml), or a "
                                                "run folder (its own config)")],
    overrides: Annotated[list[str] | None, typer.Argument(metavar="[KEY=VALUE]...",
                                                          help="overrides, e.g. rollout.sampling.temperature=0")] = None,
    model: Annotated[Path | None, typer.Option("--model", help="a Hugging Face model folder to serve")] = None,
    checkpoint: Annotated[Path | None, typer.Option("--checkpoint", help="a run checkpoint (or run folder)")] = None,
    endpoint: Annotated[str | None, typer.Option("--endpoint", help="an OpenAI-compatible server URL")] = None,
    api_model: Annotated[str | None, typer.Option("--api-model", help="model name for --endpoint "
                                                  "(default: the first the server lists)")] = None,
    api_key_env: Annotated[str | None, typer.Option("--api-key-env", help="environment variable holding "
                                                    "the --endpoint API key")] = None,
    eval_set: Annotated[str | None, typer.Option("--eval-set", help="run only this [[data.eval]] set")] = None,
    data: Annotated[Path | None, typer.Option("--data", help="evaluate this file instead of the config's sets")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="only the first N rows of each set")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="where to write the results")] = None,
    print_config: Annotated[bool, typer.Option("--print-config", help="print the resolved config (with --model "
                                               "applied) and each value's source, and exit")] = False,
) -> None:
    """Evaluate a model, a checkpoint or an endpoint on the config's eval sets.

    Examples:

      agentrl eval toy.toml --model models/tiny

      agentrl eval toy.toml --checkpoint runs/exp1

      agentrl eval runs/exp1 --checkpoint runs/exp1   (the run folder's own config)

      agentrl eval toy.toml --endpoint http://127.0.0.1:30000/v1 --data test.jsonl

      agentrl eval toy.toml --model models/tiny --print-config
    """
    if print_config:  # needs no model, checkpoint or endpoint
        from agentrl.cli import _eval_run as run

        extra = [f"model.path={run.check_model_arg(model)}"] if model is not None else []
        typer.echo(_resolve(config_path, [*(overrides or []), *extra]).format())
        return
    given = [n for n, v in (("--model", model), ("--checkpoint", checkpoint), ("--endpoint", endpoint)) if v is not None]
    if len(given) != 1:
        fail(f"expected exactly one of --model PATH, --checkpoint DIR, --endpoint URL; got "
             f"{', '.join(given) if given else 'none'}")
    if api_model is not None and endpoint is None:
        fail("--api-model: only with --endpoint")
    from agentrl.cli import _eval_run as run

    settings = list(overrides or [])
    if model is not None:
        settings.append(f"model.path={run.check_model_arg(model)}")
    config = load_config_file(config_path, settings)
    factory = _environment_factory(config)
    sets = _eval_sets(config, factory, eval_set, data, limit)
    if endpoint is not None:
        key = None
        if api_key_env is not None:
            key = os.environ.get(api_key_env)
            if not key:
                fail(f"--api-key-env {api_key_env!r}: that environment variable is not set")
        reports = run.run_endpoint(config, factory, sets, endpoint, api_model, key)
        folder_out = out or Path("evals") / ("endpoint-" + (re.sub(r"[^\w.-]", "_", reports.model or "") or "model"))
        source: dict[str, Any] = {"kind": "endpoint", "url": endpoint, "model": reports.model}
    else:
        ckpt = run.resolve_checkpoint(checkpoint) if checkpoint is not None else None
        label = ckpt.name if ckpt is not None else f"model-{Path(config.model.path).name}"
        folder_out = _out_folder(config, out, label, ckpt)
        served = run.export_checkpoint(config, ckpt, folder_out / "model") if ckpt is not None else None
        reports = run.run_engines(config, factory, sets, served, folder_out / "logs")
        source = {"kind": "checkpoint", "path": str(ckpt), "exported": str(served)} if ckpt is not None else \
            {"kind": "model", "path": config.model.path}
    paths = run.write_reports(folder_out, reports.reports, source, config)
    run.print_table(reports.reports, source, paths)
