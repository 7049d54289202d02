"""``agentrl inspect``: a run folder's report, or the episodes of a trajectory file, as HTML.

    agentrl inspect runs/exp1 [--out DIR] [--open]          # report: curves, best/worst, failures, config
    agentrl inspect rollouts.jsonl [--out DIR] [--open]     # every episode of the file, with viewers

A run folder's report goes to ``RUN/inspect/index.html`` by default; a file's index to
``<name>.inspect/index.html`` next to it. Works on a run that is still going (it reads what is
there). Token texts come from ``--tokenizer`` (a ``tokenizer.json`` or a folder holding one), else,
for a run folder, from the run's model folder when it is on disk. Every input problem is one line
``error: ...`` on stderr and exit status 2.
"""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import Annotated

import typer

from agentrl.cli._errors import fail

__all__ = ["inspect_command"]


def inspect_command(
    target: Annotated[Path, typer.Argument(
        help="A run folder (config.json, metrics.jsonl, trajectories/) or a JSONL(.gz) file of episodes or trajectories.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder to write the pages to.")] = None,
    open_: Annotated[bool, typer.Option("--open", help="Open the page in a web browser.")] = False,
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", help="tokenizer.json (or a folder holding one) for the token texts.")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Episodes in each of the best / worst tables.")] = 5,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Viewers written for a file (the first N).")] = 500,
) -> None:
    """Write a run folder's report (or a trajectory file's index) as HTML, with a viewer per episode.

    \b
    Examples:
      agentrl inspect runs/tiny_cpu --open
      agentrl inspect runs/tiny_cpu --out report/ --top 10
      agentrl inspect runs/tiny_cpu/trajectories/step_000002.jsonl.gz --limit 50
    """
    from agentrl.inspect import InspectError, token_decoder, write_file_report, write_run_report

    if not target.exists():
        fail(f"{target}: no such file or folder; expected a run folder or a JSONL file of episodes")
    try:
        decoder = token_decoder(tokenizer) if tokenizer is not None else None
        if target.is_dir():
            index = write_run_report(target, out, decoder=decoder, top=top)
        else:
            index = write_file_report(target, out, decoder=decoder, limit=limit)
    except (InspectError, ValueError) as exc:
        fail(str(exc).splitlines()[0])
    typer.echo(str(index))
    if open_:
        webbrowser.open(index.resolve().as_uri())
