"""``agentrl env check``: run an environment through scripted replies and report contract violations.

    agentrl env check my_package.envs:MyEnv --data rows.jsonl [--rows 3]

``module:Class`` names an :class:`~agentrl.environments.Environment` subclass; the module is
imported with the current directory on ``sys.path`` (as ``python -m`` does). ``--data`` is a JSONL
file with one dataset row per line; the report names rows by their line. ``--verbose`` prints each
scripted episode. No model is needed: see :mod:`agentrl.environments.conformance` for what is
checked. Exit status: 0 when every check passes (warnings allowed), 1 when there are violations,
2 for bad arguments (``error: ...`` on stderr).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from agentrl.cli._errors import fail

__all__ = ["CheckInputError", "check", "env_app", "load_environment_class", "load_rows"]

env_app = typer.Typer(name="env", no_args_is_help=True, add_completion=False, rich_markup_mode=None, help="""\
Check environments.

\b
Examples:
  agentrl env check my_package.envs:MyEnv --data rows.jsonl
  agentrl env check --help
""")


class CheckInputError(ValueError):
    """The environment class or the data file cannot be used."""


def load_environment_class(target: str) -> type[Any]:
    """Imports ``module:Class`` and checks it is an Environment subclass; errors say what was expected."""
    from agentrl.environments import Environment

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise CheckInputError(f"{target!r}: expected 'module:Class', e.g. 'my_envs.math:MathEnv'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CheckInputError(f"{target!r}: cannot import module {module_name!r} ({exc})") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CheckInputError(f"{target!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Environment)):
        raise CheckInputError(f"{target!r}: expected an Environment subclass, got {obj!r:.120}")
    return obj


def load_rows(path: Path, limit: int) -> tuple[list[Any], list[int], int]:
    """The first ``limit`` JSON rows of a JSONL file, their line numbers, and how many rows the file
    holds in all; a bad line is reported with its number."""
    rows: list[Any] = []
    lines: list[int] = []
    total = 0
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                total += 1
                if len(rows) >= limit:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise CheckInputError(f"{path}:{lineno}: not a JSON row ({exc})") from exc
                lines.append(lineno)
    except OSError as exc:
        raise CheckInputError(f"--data {path}: cannot read it ({exc})") from exc
    if not rows:
        raise CheckInputError(f"--data {path}: expected at least one JSON row, found none")
    return rows, lines, total


@env_app.command("check", short_help="Run scripted episodes and report contract violations.")
def check(
    target: Annotated[str, typer.Argument(help="The environment class, as module:Class.")],
    data: Annotated[Path, typer.Option("--data", help="JSONL file of dataset rows.")],
    rows: Annotated[int, typer.Option("--rows", min=1, help="How many rows to check.")] = 3,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every scripted episode.")] = False,
) -> None:
    """Runs scripted episodes (no model) and reports every contract violation.

    Exit status: 0 when every check passes, 1 on violations, 2 for bad arguments.

    \b
    Examples:
      agentrl env check agentrl.environments:RetoolMathEnv --data rows.jsonl
      agentrl env check my_package.envs:MyEnv --data rows.jsonl --rows 10 -v
    """
    from agentrl.environments.conformance import check_environment

    try:
        env_cls = load_environment_class(target)
        dataset, lines, total = load_rows(data, rows)
    except CheckInputError as exc:
        fail(str(exc))
    if rows > total:
        typer.echo(f"note: --rows {rows}, but {data} has {total} row{'s' if total != 1 else ''}; checking {total}")
    report = asyncio.run(check_environment(env_cls, dataset, max_rows=rows, row_numbers=lines, verbose=verbose))
    typer.echo(report.format())
    if not report.ok:
        raise typer.Exit(code=1)
