"""Entry point of the ``agentrl`` command (``agentrl = "agentrl.cli.main:main"`` in pyproject).

To add a subcommand, write it as a function in its own module under ``agentrl/cli/`` and add one
line to :func:`_register` below. Keep imports of heavy modules inside the command functions so that
``agentrl --help`` stays fast.
"""

from __future__ import annotations

import typer

__all__ = ["app", "main"]

app = typer.Typer(name="agentrl", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)


def _version(value: bool) -> None:
    if value:
        from agentrl import __version__

        typer.echo(f"agentrl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the agentrl version and exit.")) -> None:
    """agentrl: render conversations, train, evaluate and inspect tool-using models.

    Each command has its own --help with examples.

    \b
    Examples:
      agentrl doctor --quick
      agentrl train examples/tiny_cpu.toml --dry-run
      agentrl train examples/tiny_cpu.toml
      agentrl eval examples/demo_cpu.toml --checkpoint runs/demo_cpu
      agentrl serve models/tiny-qwen3
      agentrl inspect runs/tiny_cpu --open
    """


def _register() -> None:
    from agentrl.cli.doctor import doctor
    from agentrl.cli.env import env_app
    from agentrl.cli.eval import eval_command
    from agentrl.cli.inspect import inspect_command
    from agentrl.cli.models import models_app
    from agentrl.cli.render import render
    from agentrl.cli.serve import serve
    from agentrl.cli.sft import sft
    from agentrl.cli.train import train

    # Short one-line help for the command list (click cuts longer first sentences at the terminal width).
    app.command("render", short_help="Render a conversation with a chat template (and its tokens).")(render)
    app.command("doctor", short_help="Report what is installed and usable.")(doctor)
    app.command("sft", short_help="Fine-tune a model on tool-use conversations (assistant tokens only).")(sft)
    app.command("train", short_help="Train from a config file (--dry-run checks it and starts nothing).")(train)
    app.command("eval", short_help="Evaluate a model, checkpoint or endpoint on the eval sets.")(eval_command)
    app.command("serve", short_help="Serve a model folder with SGLang (OpenAI API) until Ctrl-C.")(serve)
    app.command("inspect", short_help="Write a run's report or a trajectory file's episodes as HTML.")(inspect_command)
    app.add_typer(env_app, name="env", short_help="Check environments.")
    app.add_typer(models_app, name="models", short_help="Model folders from GGUF files; known checkpoints.")


_register()


def main() -> None:
    """Runs the ``agentrl`` command line."""
    app()


if __name__ == "__main__":
    main()
