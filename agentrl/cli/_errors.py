"""The command line's one error style: ``error: <what>`` on stderr, exit status 2 for bad input."""

from __future__ import annotations

from typing import NoReturn

import typer

__all__ = ["BAD_INPUT", "fail"]

BAD_INPUT = 2  # exit status of every input error (a file, an argument, a dataset row that cannot be read)


def fail(message: str) -> NoReturn:
    """Prints ``error: message`` on stderr and exits with :data:`BAD_INPUT`."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=BAD_INPUT)
