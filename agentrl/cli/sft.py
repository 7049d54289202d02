"""``agentrl sft``: supervised fine-tuning on conversations, with RL's token layout.

    agentrl sft sft.toml [train.steps=50 train.optimizer.lr=3e-3 ...] [--print-config]

The config file (TOML, YAML or JSON) holds an :class:`~agentrl.sft.SftConfig`; ``key.sub=value``
arguments override it, typed by the schema, exactly as for ``agentrl train`` (the same loader:
:mod:`agentrl.cli.config_files`). Every mistake in the file, an override, the data or the model
folder is one ``error: ...`` line naming the key and what is accepted, exit status 2, before any
training starts. ``--print-config`` shows every value and where it came from. See
:mod:`agentrl.sft.trainer` for what the run writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from agentrl.cli._errors import fail

__all__ = ["load_sft_config", "sft"]


def load_sft_config(path: Path, overrides: list[str]) -> Any:
    """The :class:`~agentrl.cli.config_files.ResolvedConfig` of an SFT config file plus overrides
    (``.config`` is the :class:`~agentrl.sft.SftConfig`); raises ``ConfigError``."""
    from agentrl.cli.config_files import load_config
    from agentrl.sft import SftConfig

    return load_config(path, overrides, schema=SftConfig)


def sft(
    config: Annotated[Path, typer.Argument(help="The SFT config file (.toml, .yaml or .json).")],
    overrides: Annotated[list[str] | None, typer.Argument(help="key.sub=value overrides, e.g. train.steps=20.")] = None,
    print_config: Annotated[bool, typer.Option("--print-config",
                                               help="Print the resolved config, each value's source, and exit.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the summary.")] = False,
) -> None:
    """Fine-tunes a model on conversations (JSONL of {"messages": [...], "tools": [...]}): only assistant
    tokens are trained, laid out exactly as the agent loop lays them out. Writes a Hugging Face folder.

    \b
    Examples:
      agentrl sft examples/sft_tiny_arithmetic.toml
      agentrl sft examples/sft_tiny_arithmetic.toml train.steps=40 output=out/
      agentrl sft examples/sft_tiny_arithmetic.toml --print-config
    """
    from agentrl.cli.config_files import ConfigError
    from agentrl.model_folder import ModelFolderError
    from agentrl.sft import SftDataError, run_sft

    try:
        resolved = load_sft_config(config, list(overrides or []))
    except ConfigError as exc:
        fail(str(exc))
    if print_config:
        typer.echo(resolved.format())
        return
    cfg = resolved.config

    def progress(step: int, metrics: dict[str, float]) -> None:
        if not quiet and (step % cfg.train.log_every == 0):
            typer.echo(f"step {step}  loss {metrics['loss']:.4f}  lr {metrics['lr']:.2e}  "
                       f"tokens {int(metrics['trained_tokens'])}  {metrics['step_s']:.2f} s")

    try:
        result = run_sft(cfg, on_step=progress)
    except (SftDataError, ModelFolderError) as exc:
        fail(str(exc))
    typer.echo(f"sft: {result.steps} steps on {result.conversations} conversations, loss {result.losses[0]:.4f} -> "
               f"{result.losses[-1]:.4f}, {result.seconds:.1f} s; model written to {result.output}"
               + (f" (LoRA merged; the adapter in {result.output / 'adapter'})" if cfg.train.lora is not None else ""))
