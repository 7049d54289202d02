"""``agentrl sft``: supervised fine-tuning on conversations, with RL's token layout.

    agentrl sft sft.toml [train.steps=50 train.optimizer.lr=3e-3 ...] [--print-config]

The config file (TOML, YAML or JSON) holds an :class:`~agentrl.sft.SftConfig`; ``key.sub=value``
arguments override it (values are read as YAML scalars: ``3``, ``1e-3``, ``true``, ``null``,
``[1, 2]``; anything else is a string). Every mistake in the file, an override, the data or the
model folder is one ``error: ...`` line naming the key and what is accepted, exit status 2, before
any training starts. See :mod:`agentrl.sft.trainer` for what the run writes.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from agentrl.cli._errors import fail

__all__ = ["ConfigFileError", "apply_overrides", "read_config_file", "sft"]


class ConfigFileError(ValueError):
    """A config file or override that cannot be read (the message names the file, line or key)."""


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping a TOML / YAML / JSON file holds; syntax errors name the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read the config file ({exc.strerror or exc})") from None
    suffix = path.suffix.lower()
    if suffix == ".toml":
        import tomllib

        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigFileError(f"{path}: TOML syntax error: {exc}") from None
    elif suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise ConfigFileError(f"{path}: YAML syntax error{where}: {getattr(exc, 'problem', exc)}") from None
    elif suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigFileError(f"{path}: JSON syntax error at line {exc.lineno}: {exc.msg}") from None
    else:
        raise ConfigFileError(f"{path}: unknown config format {suffix or '(no suffix)'!r}; expected .toml, .yaml, "
                              ".yml or .json")
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a table of sections at the top, got {type(data).__name__}")
    return data


def _scalar(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``data`` with each ``key.sub=value`` set (nested tables created as needed)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise ConfigFileError(f"override {item!r}: expected key.sub=value, e.g. train.steps=20")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigFileError(f"override {item!r}: {'.'.join(parts[:i + 1])} is a value, not a section")
            node = child
        node[parts[-1]] = _scalar(value)
    return data


def _valid_names(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the section at ``loc`` (the last entry is the bad key itself)."""
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        annotation = getattr(field, "annotation", None)
        if not isinstance(annotation, type):
            return []
        model = annotation
    return sorted(getattr(model, "model_fields", {}))


def describe_validation_error(exc: Any, root: Any) -> str:
    """One line per problem: the dotted key, what is wrong, the value given; unknown keys get suggestions."""
    lines = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        key = ".".join(str(p) for p in loc) or "<config>"
        if err.get("type") == "extra_forbidden":
            names = _valid_names(root, loc)
            close = difflib.get_close_matches(str(loc[-1]), names, n=3)
            section = ".".join(str(p) for p in loc[:-1]) or "the top level"
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            lines.append(f"{key}: unknown key in {section}{hint} (valid: {', '.join(names)})")
        elif err.get("type") == "missing":
            lines.append(f"{key}: required, but missing")
        else:
            lines.append(f"{key}: {err.get('msg')} (got {err.get('input')!r:.80})")
    return "\n".join(lines)


def load_sft_config(path: Path, overrides: list[str]) -> Any:
    """The validated :class:`~agentrl.sft.SftConfig` of a file plus overrides; raises :class:`ConfigFileError`."""
    from pydantic import ValidationError

    from agentrl.sft import SftConfig

    data = apply_overrides(read_config_file(path), overrides)
    try:
        return SftConfig.from_dict(data)
    except ValidationError as exc:
        raise ConfigFileError(describe_validation_error(exc, SftConfig)) from None


def sft(
    config: Annotated[Path, typer.Argument(help="The SFT config file (.toml, .yaml or .json).")],
    overrides: Annotated[list[str] | None, typer.Argument(help="key.sub=value overrides, e.g. train.steps=20.")] = None,
    print_config: Annotated[bool, typer.Option("--print-config", help="Print the resolved config and exit.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the summary.")] = False,
) -> None:
    """Fine-tunes a model on conversations (JSONL of {"messages": [...], "tools": [...]}): only assistant
    tokens are trained, laid out exactly as the agent loop lays them out. Writes a Hugging Face folder.

    Example: agentrl sft examples/sft_tiny_arithmetic.toml train.steps=40 output=models/tiny-sft
    """
    from agentrl.model_folder import ModelFolderError
    from agentrl.sft import SftDataError, run_sft

    try:
        cfg = load_sft_config(config, list(overrides or []))
    except ConfigFileError as exc:
        fail(str(exc))
    if print_config:
        typer.echo(json.dumps(cfg.to_dict(), indent=2))
        return

    def progress(step: int, metrics: dict[str, float]) -> None:
        if not quiet and (step % cfg.train.log_every == 0):
            typer.echo(f"step {step}  loss {metrics['loss']:.4f}  lr {metrics['lr']:.2e}  "
                       f"tokens {int(metrics['trained_tokens'])}  {metrics['step_s']:.2f} s")

    try:
        result = run_sft(cfg, on_step=progress)
    except (SftDataError, ModelFolderError) as exc:
        fail(str(exc))
    typer.echo(f"sft: {result.steps} steps on {result.conversations} conversations, loss {result.losses[0]:.4f} -> "
               f"{result.losses[-1]:.4f}, {result.seconds:.1f} s; model written to {result.output}")
