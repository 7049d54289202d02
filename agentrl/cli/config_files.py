"""Run configs from files: TOML or YAML into :class:`~agentrl.runner.RunConfig`, ``key.sub=value``
overrides typed by the schema, and where each resolved value came from.

    resolved = load_run_config("examples/tiny_cpu.toml", ["train.steps=4", "rollout.sampling.temperature=0.8"])
    resolved.config                # the validated RunConfig
    resolved.source("train.steps") # "override"  ("file", "default")
    print(resolved.format())       # every value, one line each, with its source

The file type is its suffix (``.toml``; ``.yaml``/``.yml``). Keys are the config's sections and
fields (``docs/training.md``); an override's dotted key is checked against the schema before its
value is parsed, so ``train.stpes=3`` is answered with ``did you mean 'steps'?``. Values are typed
by the field: ints, floats, ``true``/``false``, enum and literal names, lists (``[1, 2]`` or
``1,2``), inline tables (``{a = 1}``), and ``none``/``null`` for a field that may be unset. A
number in a key indexes a list (``data.eval.0.name=held_out``). Relative paths in a config are
relative to the directory the command runs in, as everywhere else in agentrl.

Every problem is a :class:`ConfigError` whose message names the key, the value and what is
accepted; a syntax error names the file, line and column. Nothing here imports torch or Ray.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.cli import _toml as tomllib
from agentrl.cli._schema import SchemaError, coerce, field_at, section_of

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    from agentrl.cli._schema import SectionType


__all__ = ["ConfigError", "Provenance", "ResolvedConfig", "apply_overrides", "leaves", "load_config", "load_config_file",
           "load_run_config", "parse_override", "validation_messages"]

CONFIG_SUFFIXES = (".toml", ".yaml", ".yml", ".json")


class ConfigError(ValueError):
    """A config file, an override or a config value that cannot be used; the message says which and why."""


def load_config_file(path: Path | str) -> dict[str, Any]:
    """The mapping a TOML or YAML file holds (an empty file: ``{}``)."""
    path = Path(path)
    if path.suffix.lower() not in CONFIG_SUFFIXES:
        raise ConfigError(f"{path}: unknown config file type {path.suffix!r}; expected .toml, .yaml, .yml or .json")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except UnicodeDecodeError as exc:
        raw = exc.object if isinstance(exc.object, bytes) else b""
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(f"{path}: not valid UTF-8 at line {line}, column {column} (byte {raw[exc.start:exc.start + 1]!r}: "
                          f"{exc.reason}); expected a UTF-8 text file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    suffix = path.suffix.lower()
    data = _parse_toml(path, text) if suffix == ".toml" else _parse_json(path, text) if suffix == ".json" \
        else _parse_yaml(path, text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of sections at the top level, got {type(data).__name__}")
    return data


def _parse_toml(path: Path, text: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)"
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None


def _parse_json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def _parse_yaml(path: Path, text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark, ctx = exc.problem_mark or exc.context_mark, exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        started = (f" (started at line {ctx.line + 1}, column {ctx.column + 1})"
                   if ctx is not None and mark is not None and ctx.line != mark.line else "")
        what = " ".join(p for p in (f"{exc.context}{started}" if exc.context else "", exc.problem) if p)
        raise ConfigError(f"{path}: YAML syntax error{where}: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML syntax error: {exc}") from None


def parse_override(text: str) -> tuple[str, str]:
    """``"a.b=1"`` -> ``("a.b", "1")``; anything without ``key=`` is a :class:`ConfigError`."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(c.isspace() for c in key) or key.startswith("-"):
        raise ConfigError(f"override {text!r}: expected KEY=VALUE with a dotted key, e.g. train.steps=10 "
                          "or rollout.sampling.temperature=0.7")
    return key, value


def _set(data: dict[str, Any], parts: list[str], value: Any, key: str) -> None:
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            index = int(part)
            if index >= len(node):
                raise ConfigError(f"{key}: {'.'.join(parts[:i])} has {len(node)} entries, no entry {index}")
            node = node[index]
            continue
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"{key}: {'.'.join(parts[:i + 1])} is set to {child!r}, not a table")
        node = child
    last = parts[-1]
    if isinstance(node, list):
        index = int(last)
        if index >= len(node):
            raise ConfigError(f"{key}: {'.'.join(parts[:-1])} has {len(node)} entries, no entry {index}")
        node[index] = value
    else:
        node[last] = value


def _run_config_schema() -> type[BaseModel]:
    from agentrl.runner.config import RunConfig

    return RunConfig


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str], *,
                    schema: type[BaseModel] | None = None) -> tuple[dict[str, Any], list[str]]:
    """``data`` with each ``key=value`` override applied (typed by ``schema``, default
    :class:`~agentrl.runner.RunConfig`), and the keys set."""
    root = schema if schema is not None else _run_config_schema()
    out: dict[str, Any] = json.loads(json.dumps(data, default=str))  # a deep copy of plain values
    keys: list[str] = []
    for text in overrides:
        key, raw = parse_override(text)
        try:
            value = coerce(key, raw, field_at(root, key))
        except SchemaError as exc:
            raise ConfigError(str(exc)) from None
        _set(out, key.split("."), value, key)
        keys.append(key)
    return out, keys


def leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value for every non-table value (lists are leaves)."""
    if isinstance(data, dict) and (data or not prefix):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


@dataclass(frozen=True)
class Provenance:
    """The keys a config file set and the keys overrides set (dotted)."""

    file_keys: frozenset[str] = frozenset()
    override_keys: tuple[str, ...] = ()

    def source(self, key: str) -> str:
        """``override``, ``file`` or ``default`` for a dotted key (a value inside a table the file or
        an override set counts as set by them)."""
        def covered(keys: Any) -> bool:
            return any(key == k or key.startswith(k + ".") for k in keys)
        if covered(self.override_keys):
            return "override"
        return "file" if covered(self.file_keys) else "default"


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated config, the file it came from, where each value came from, and the merged mapping."""

    config: Any  # a RunConfig, or the schema's model given to load_config
    path: Path | None
    provenance: Provenance = field(default_factory=Provenance)
    raw: dict[str, Any] = field(default_factory=dict)

    def source(self, key: str) -> str:
        """See :meth:`Provenance.source`."""
        return self.provenance.source(key)

    def format(self) -> str:
        """Every resolved value as ``key = value  # source``, one per line, in section order."""
        rows = [(k, json.dumps(v, ensure_ascii=False), self.source(k)) for k, v in leaves(self.config.to_dict()).items()]
        width = min(max((len(k) + len(v) for k, v, _ in rows), default=0) + 3, 72)
        where = f" from {self.path}" if self.path is not None else ""
        digest = f" (hash {self.config.hash()[:12]})" if callable(getattr(self.config, "hash", None)) else ""
        head = [f"# resolved config{where}{digest}; # default | file | override"]
        return "\n".join(head + [f"{f'{k} = {v}':<{width}} # {s}" for k, v, s in rows])


def _model_at(root: type[BaseModel], loc: Sequence[Any]) -> tuple[SectionType | None, str]:
    """The section that holds ``loc``'s last element, and that section's dotted name."""
    from agentrl.cli._schema import Slot, fields_of

    slot: Slot = Slot("section", model=root)
    parts = [str(p) for p in loc[:-1]]
    for part in parts:
        if slot.kind == "list" and slot.item is not None:
            slot = slot.item
        elif slot.kind == "section" and slot.model is not None and part in fields_of(slot.model):
            slot = field_at(slot.model, part)
        else:
            return None, ".".join(parts)
    return slot.model if slot.kind == "section" else None, ".".join(parts)


_EXPECT = {"int_parsing": "an int", "int_type": "an int", "int_from_float": "an int", "float_parsing": "a number",
           "float_type": "a number", "bool_parsing": "true or false", "bool_type": "true or false",
           "string_type": "a string", "dict_type": "a table", "model_type": "a table of keys",
           "tuple_type": "a list", "list_type": "a list"}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _one_message(root: type[BaseModel], err: Mapping[str, Any], origin: Provenance | None) -> str:
    loc = [p for p in err.get("loc", ()) if not (isinstance(p, str) and p.startswith("function-"))]
    key = ".".join(str(p) for p in loc)
    kind, ctx = err.get("type", ""), err.get("ctx") or {}
    where = f" (set by {origin.source(key)})" if origin is not None and key and origin.source(key) != "default" else ""
    if kind == "extra_forbidden":
        model, prefix = _model_at(root, loc)
        return f"{key}: {section_of(model, prefix, str(loc[-1]))}" if model is not None else f"{key}: unknown key"
    if kind == "missing":
        return f"missing required key {key!r}" + (f" (section [{key.rpartition('.')[0]}])" if "." in key else "")
    value = err.get("input")
    shown = json.dumps(value, default=str) if not isinstance(value, dict) else "{...}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        return f"{key} = {shown}{where}: expected a value {_BOUNDS[kind]} {bound}"
    if kind in ("literal_error", "enum"):
        return f"{key} = {shown}{where}: expected {ctx.get('expected', '?')}"
    if kind in _EXPECT:
        return f"{key} = {shown}{where}: expected {_EXPECT[kind]}"
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    field = f"{loc[-1]}=" if loc else ""
    if field and msg.startswith(field) and ": " in msg:  # a runtime object's check of one field: "f=v: expected"
        head, _, rest = msg.partition(": ")
        return f"{key}{head[len(field) - 1:]}{where}: {rest}"
    return f"{key}: {msg}" if key else msg


def validation_messages(exc: ValidationError, origin: Provenance | None = None, *,
                        schema: type[BaseModel] | None = None) -> list[str]:
    """One sentence per problem of a validation error of ``schema`` (default ``RunConfig``)."""
    root = schema if schema is not None else _run_config_schema()
    return [_one_message(root, err, origin) for err in exc.errors()]


def load_run_config(path: Path | str | None, overrides: Sequence[str] = (), *,
                    base: Mapping[str, Any] | None = None) -> ResolvedConfig:
    """Reads ``path`` (or starts from ``base``, e.g. a run folder's saved config), applies the
    overrides and validates into a :class:`~agentrl.runner.RunConfig`; every problem found is in
    the one :class:`ConfigError` raised."""
    return load_config(path, overrides, schema=_run_config_schema(), base=base)


def load_config(path: Path | str | None, overrides: Sequence[str] = (), *, schema: type[BaseModel],
                base: Mapping[str, Any] | None = None) -> ResolvedConfig:
    """:func:`load_run_config` for any config model ``schema`` (e.g. :class:`~agentrl.sft.SftConfig`):
    the same file types, override syntax, messages and provenance."""
    from pydantic import ValidationError

    data = load_config_file(path) if path is not None else dict(base or {})
    merged, keys = apply_overrides(data, overrides, schema=schema)
    provenance = Provenance(frozenset(leaves(data)) - {""}, tuple(keys))
    try:
        build = getattr(schema, "from_dict", schema.model_validate)
        config = build(merged)
    except ValidationError as exc:
        messages = validation_messages(exc, provenance, schema=schema)
        name = f"{path}: " if path is not None else ""
        if len(messages) == 1:
            raise ConfigError(f"{name}{messages[0]}") from None
        raise ConfigError(f"{name}{len(messages)} problems:\n" + "\n".join(f"  - {m}" for m in messages)) from None
    return ResolvedConfig(config=config, path=Path(path) if path is not None else None, provenance=provenance,
                          raw=merged)
