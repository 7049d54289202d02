"""``agentrl env check``: run an environment through scripted replies and report contract violations.

    agentrl env check my_package.envs:MyEnv --data rows.jsonl [--rows 3] [--reward my_rewards:score]

The environment is named as a run config names it, by the resolver every command uses
(:func:`agentrl.environments.registry.resolve`): a built-in (``toy_arithmetic``), an installed
package's entry point, or ``module:Class`` (imported with the current directory on ``sys.path``, as
``python -m`` does); it must be an :class:`~agentrl.environments.Environment` subclass. ``--reward``
names a reward function ``(trajectory, task) -> float`` the same way (as ``agentrl train --reward``
takes it) and checks it on every scripted episode. ``--data`` is a JSONL file with one dataset row
per line; the report names rows by their line. ``--verbose`` prints each scripted episode. No model
is needed: see :mod:`agentrl.environments.conformance` for what is checked. An agent harness
(:class:`agentrl.proxy.Agent`) named the same way is run on each row against a scripted model
through a real proxy server (:mod:`agentrl.proxy.check`; ``--template`` picks the chat template,
rendered with the tiny test tokenizer: no model files are needed). Exit status: 0 when every check
passes (warnings allowed), 1 when there are violations, 2 for bad arguments (``error: ...`` on
stderr).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentrl.cli._errors import fail

if TYPE_CHECKING:
    from agentrl.environments.registry import Kind

__all__ = ["CheckInputError", "check", "env_app", "load_environment", "load_environment_class", "load_reward",
           "load_rows"]

env_app = typer.Typer(name="env", no_args_is_help=True, add_completion=False, rich_markup_mode=None, help="""\
Check environments.

\b
Examples:
  agentrl env check my_package.envs:MyEnv --data rows.jsonl
  agentrl env check --help
""")


class CheckInputError(ValueError):
    """The environment class, the reward function or the data file cannot be used."""


def _resolve(kind: Kind, target: str, what: str = "") -> Any:
    """``target`` by the registry's resolver (:func:`~agentrl.environments.registry.resolve`, ``module:attr``
    allowed); its error, prefixed with ``what``, as a :class:`CheckInputError`."""
    from agentrl.environments.registry import RegistryError, resolve

    try:
        return resolve(kind, target, allow_import=True)
    except RegistryError as exc:
        raise CheckInputError(f"{what}{exc}") from None


def load_environment(target: str) -> Any:
    """The Environment subclass or the :class:`agentrl.proxy.Agent` ``target`` names (see
    :func:`load_environment_class`)."""
    from agentrl.proxy.adapter import Agent

    obj = _resolve("environment", target)
    return obj if isinstance(obj, Agent) else _environment_class(target, obj)


def load_environment_class(target: str) -> type[Any]:
    """The Environment subclass ``target`` names (a built-in, an installed package's entry point or
    ``module:Class``, by :func:`~agentrl.environments.registry.resolve`); an unknown name's error
    lists the valid ones. A factory function is refused: the checker builds the class itself."""
    return _environment_class(target, _resolve("environment", target))


def _environment_class(target: str, obj: Any) -> type[Any]:
    from agentrl.environments import Environment

    if not (isinstance(obj, type) and issubclass(obj, Environment)):
        raise CheckInputError(f"{target!r}: expected an Environment subclass (env check builds and drives the class "
                              f"itself), got {obj!r:.120}")
    return obj


def load_reward(target: str) -> Any:
    """The reward function ``target`` names, as ``agentrl train --reward`` resolves it."""
    return _resolve("reward", target, "--reward: ")


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
    target: Annotated[str, typer.Argument(help="The environment: a built-in or installed name, or module:Class.")],
    data: Annotated[Path, typer.Option("--data", help="JSONL file of dataset rows.")],
    rows: Annotated[int, typer.Option("--rows", min=1, help="How many rows to check.")] = 3,
    reward: Annotated[str | None, typer.Option("--reward", help="A reward function (trajectory, task) -> float "
                                               "to check too: a name or module:fn, as train takes it.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every scripted episode.")] = False,
    template: Annotated[str, typer.Option("--template", help="The chat template an agent's requests are "
                                          "rendered with (agents only).")] = "qwen3",
) -> None:
    """Runs scripted episodes (no model) and reports every contract violation.

    An agent (agentrl.proxy.Agent) is run once per row against a scripted model
    through a real proxy server; its harness errors, refused requests, late calls
    and reward are checked.

    With --reward, also calls that reward function on every episode and reports an exception,
    None, or a value that is not a finite number, with the text it was given.

    Exit status: 0 when every check passes, 1 on violations, 2 for bad arguments.

    \b
    Examples:
      agentrl env check agentrl.environments:RetoolMathEnv --data rows.jsonl
      agentrl env check my_package.envs:MyEnv --data rows.jsonl --rows 10 -v
      agentrl env check toy_arithmetic --data rows.jsonl --reward my_rewards:score
      agentrl env check examples.byo_agent:openai_agent --data rows.jsonl
    """
    from agentrl.environments.conformance import check_environment
    from agentrl.proxy.adapter import Agent

    try:
        env_cls = load_environment(target)
        reward_fn = load_reward(reward) if reward is not None else None
        dataset, lines, total = load_rows(data, rows)
    except CheckInputError as exc:
        fail(str(exc))
    if rows > total:
        typer.echo(f"note: --rows {rows}, but {data} has {total} row{'s' if total != 1 else ''}; checking {total}")
    if isinstance(env_cls, Agent):
        report = asyncio.run(_check_agent(env_cls, dataset, lines, reward_fn, verbose, template, target))
    else:
        report = asyncio.run(check_environment(env_cls, dataset, max_rows=rows, row_numbers=lines, verbose=verbose,
                                               reward=reward_fn))
    typer.echo(report.format())
    if not report.ok:
        raise typer.Exit(code=1)


async def _check_agent(agent: Any, dataset: list[Any], lines: list[int], reward_fn: Any, verbose: bool,
                       template_name: str, name: str) -> Any:
    from agentrl.chat.template import ChatTemplate
    from agentrl.proxy.check import check_agent
    from agentrl.testing import build_tokenizer

    try:
        template = ChatTemplate.from_name(template_name, build_tokenizer())
    except ValueError as exc:
        fail(f"--template: {exc}")
    return await check_agent(agent, dataset, template=template, row_numbers=lines, reward=reward_fn, verbose=verbose,
                             name=name)
