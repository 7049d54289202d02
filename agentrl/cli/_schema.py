"""What a run-config key is, read from the pydantic schema: the config files' and overrides' type system.

:func:`field_at` walks a dotted key (``rollout.scheduler.group_size``) down the
:class:`~agentrl.runner.RunConfig` sections and returns the field's :class:`Slot`: its type, whether
``None`` is allowed, the accepted values of an enum or literal, and for a section the names of its
keys (so an unknown key can be answered with the closest valid ones). :func:`coerce` turns an
override's text into a value of that type. A section is a pydantic model, or a runtime dataclass that a
section holds directly (:class:`~agentrl._config.RunFields`: its keys and their annotations).
"""

from __future__ import annotations

import difflib
import enum
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from agentrl._config import RunFields
from agentrl.cli import _toml as tomllib

__all__ = ["SchemaError", "Slot", "coerce", "field_at", "fields_of", "section_of", "suggest"]

SectionType = type[BaseModel] | RunFields[Any]
"""What a section is: a pydantic model class, or the :class:`RunFields` of a runtime dataclass."""


class SchemaError(ValueError):
    """A dotted key or an override value that the schema does not accept; the message says why."""


@dataclass(frozen=True)
class Slot:
    """One field of the schema: ``kind`` is ``section``, ``list``, ``mapping``, ``bool``, ``int``,
    ``float``, ``str``, ``choice`` or ``any``; ``item`` is the element slot of a list, ``model`` what
    the section is (:data:`SectionType`)."""

    kind: str
    nullable: bool = False
    choices: tuple[Any, ...] = ()
    model: SectionType | None = None
    item: Slot | None = None

    def describe(self) -> str:
        """What the field accepts, in words (``an int``, ``one of 'a', 'b'``...)."""
        text = {"section": "a table of keys", "list": "a list", "mapping": "a table", "bool": "true or false",
                "int": "an int", "float": "a number", "str": "a string", "any": "a value"}.get(self.kind, "")
        if self.kind == "choice":
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind == "list" and self.item is not None and self.item.kind != "any":
            text = f"a list of {self.item.describe()}s" if self.item.kind in ("int", "float", "str") else text
        return f"{text} or none" if self.nullable else text


def fields_of(model: SectionType) -> dict[str, Any]:
    """The keys of a section and the annotation of each."""
    if isinstance(model, RunFields):
        return model.field_types()
    return {name: _annotated(info.annotation, info.metadata) for name, info in model.model_fields.items()}


def _annotated(annotation: Any, metadata: list[Any]) -> Any:
    """pydantic keeps a field's ``Annotated`` metadata apart; a :class:`RunFields` there makes it a section."""
    marks = [m for m in metadata if isinstance(m, RunFields)]
    return typing.Annotated[annotation, marks[0]] if marks else annotation


def _slot(annotation: Any) -> Slot:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        marks = [m for m in args[1:] if isinstance(m, RunFields)]
        return Slot("section", model=marks[0]) if marks else _slot(args[0])
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        nullable = len(rest) < len(args)
        if len(rest) == 1:
            inner = _slot(rest[0])
            return Slot(inner.kind, nullable or inner.nullable, inner.choices, inner.model, inner.item)
        return Slot("any", nullable)
    if origin is typing.Literal:
        return Slot("choice", choices=args)
    if origin in (tuple, list):
        kinds = {a for a in args if a is not Ellipsis}
        item = args[0] if len(kinds) == 1 else Any
        return Slot("list", item=_slot(item))
    if origin is dict or annotation is dict:
        return Slot("mapping")
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return Slot("section", model=annotation)
        if issubclass(annotation, enum.Enum):
            return Slot("choice", choices=tuple(m.value for m in annotation))
        for kind in (bool, int, float, str):
            if issubclass(annotation, kind):
                return Slot(kind.__name__)
    return Slot("any")


def suggest(name: str, valid: list[str]) -> str:
    """``; did you mean 'x' or 'y'?`` for the closest valid names (empty when none is close)."""
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _nested_keys(model: SectionType, name: str, prefix: str) -> list[str]:
    """Dotted keys ``<prefix>.<section...>.<name>`` of the sections below ``model`` that have a key
    ``name``, shallowest first (``steps`` at the top level -> ``train.steps``, ``warmup.steps``)."""
    found: list[tuple[int, str]] = []
    frontier = [(model, prefix)]
    while frontier:
        current, path = frontier.pop(0)
        for key, annotation in fields_of(current).items():
            slot = _slot(annotation)
            if slot.kind != "section" or slot.model is None:
                continue
            dotted = f"{path}.{key}" if path else key
            if name in fields_of(slot.model):
                found.append((dotted.count("."), f"{dotted}.{name}"))
            frontier.append((slot.model, dotted))
    return [key for _, key in sorted(found)]


def section_of(model: SectionType, prefix: str, name: str) -> str:
    """The message for an unknown key ``name`` in the section ``prefix`` (``""``: the root): the
    sections below it that have that key (``steps`` -> ``train.steps``), else the closest names."""
    valid = sorted(fields_of(model))
    where = f"section [{prefix}]" if prefix else "the top level"
    nested = _nested_keys(model, name, prefix)[:3]
    hint = f"; did you mean {' or '.join(repr(k) for k in nested)}?" if nested else suggest(name, valid)
    return f"unknown key {name!r} in {where}{hint} (valid keys: {', '.join(valid)})"


def field_at(root: SectionType, dotted: str) -> Slot:
    """The slot of ``dotted`` (segments separated by dots; a number indexes a list); raises
    :class:`SchemaError` naming the first unknown segment, its section and the closest valid names."""
    slot = Slot("section", model=root)
    done: list[str] = []
    for part in dotted.split("."):
        if not part:
            raise SchemaError(f"{dotted!r}: empty key segment; expected names separated by single dots")
        if slot.kind == "list" and part.isdigit() and slot.item is not None:
            slot = slot.item
        elif slot.kind == "section" and slot.model is not None:
            fields = fields_of(slot.model)
            if part not in fields:
                raise SchemaError(f"{dotted}: {section_of(slot.model, '.'.join(done), part)}")
            slot = _slot(fields[part])
        elif slot.kind in ("mapping", "any"):
            slot = Slot("any")
        else:
            raise SchemaError(f"{dotted}: {'.'.join(done)!r} is {slot.describe()}, it has no key {part!r}")
        done.append(part)
    return slot


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_NONE = ("none", "null", "~")


def _literal(text: str) -> Any:
    """A TOML value (``3``, ``[1, 2]``, ``{a = 1}``, ``"s"``) or JSON; raises ValueError."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return json.loads(text)


def coerce(key: str, text: str, slot: Slot) -> Any:
    """The value of the override ``key=text`` typed by ``slot``; raises :class:`SchemaError` naming the
    key, the value and what the field accepts."""
    stripped = text.strip()

    def bad(extra: str = "") -> SchemaError:
        return SchemaError(f"{key}={text}: expected {slot.describe()}{extra}")

    if slot.nullable and stripped.lower() in _NONE:
        return None
    if slot.kind == "bool":
        low = stripped.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise bad()
    if slot.kind in ("int", "float"):
        try:
            return int(stripped) if slot.kind == "int" else float(stripped)
        except ValueError:
            raise bad() from None
    if slot.kind == "str":
        return text
    if slot.kind == "choice":
        for choice in slot.choices:
            if stripped == str(choice) or stripped.lower() == str(choice).lower():
                return choice
        raise bad(suggest(stripped, [str(c) for c in slot.choices]))
    if slot.kind == "list":
        return _coerce_list(key, stripped, slot, bad)
    try:
        value = _literal(stripped)
    except ValueError:
        if slot.kind in ("section", "mapping"):
            raise bad(" (an inline table such as {key = 1}, or set key.sub=value)") from None
        return text  # 'any': a bare word is a string
    if slot.kind in ("section", "mapping") and not isinstance(value, dict):
        raise bad(" (an inline table such as {key = 1}, or set key.sub=value)")
    return value


def _coerce_list(key: str, text: str, slot: Slot, bad: Any) -> list[Any]:
    item = slot.item or Slot("any")
    if text.startswith("["):
        try:
            value = _literal(text)
        except ValueError:
            raise bad(" (a list such as [1, 2] or 1,2)") from None
        if not isinstance(value, list):
            raise bad()
        return value if item.kind not in ("int", "float", "bool") else [
            coerce(f"{key}[{i}]", str(v).lower() if isinstance(v, bool) else str(v), item)
            for i, v in enumerate(value)]
    if not text:
        return []
    return [coerce(f"{key}[{i}]", part, item) for i, part in enumerate(text.split(","))]
