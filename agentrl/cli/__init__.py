"""The ``agentrl`` command line: one typer app; each subcommand lives in its own module here and is
registered in :mod:`agentrl.cli.main`."""

from agentrl.cli.main import app, main

__all__ = ["app", "main"]
