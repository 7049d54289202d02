"""Entry point of the ``agentrl`` command (``agentrl = "agentrl.cli.main:main"`` in pyproject).

To add a subcommand, write it as a function in its own module under ``agentrl/cli/`` and add one
line to :func:`_register` below. Keep imports of heavy modules inside the command functions so that
``agentrl --help`` stays fast.
"""

from __future__ import annotations

import typer

__all__ = ["app", "main"]

app = typer.Typer(name="agentrl", help="Reinforcement learning of tool-using language models.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@app.callback()
def _root() -> None:
    """agentrl: render conversations, train, evaluate and inspect tool-using models."""


def _register() -> None:
    from agentrl.cli.doctor import doctor
    from agentrl.cli.env import env_app
    from agentrl.cli.render import render

    app.command("render")(render)
    app.command("doctor")(doctor)
    app.add_typer(env_app, name="env")


_register()


def main() -> None:
    """Runs the ``agentrl`` command line."""
    app()


if __name__ == "__main__":
    main()
