"""Type hints of ``@tool`` functions as JSON schemas, and the conversion of checked JSON values into them.

The simple hints (``str``, ``int``, ``float``, ``bool``, ``Any``, ``Literal``, ``Optional``/unions,
``list[...]``, ``dict[str, ...]``) map to small hand-written schemas, so what the model reads in the
prompt stays short. Richer hints are described and validated by pydantic:

- a pydantic model or a dataclass: its JSON schema (nested definitions hoisted into the
  parameters' ``$defs``); the value arrives as an instance;
- ``datetime``/``date``/``time``: a string with a ``format``; the value arrives parsed;
- ``set[...]``/``frozenset[...]``: an array with ``uniqueItems``; ``tuple[...]``: a fixed-length array;
- an ``Enum``: its values; the value arrives as the member.

Containers keep their item types (``list[dict[str, float]]`` is an array of objects of numbers), and a
container of rich items converts each item.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import types
import typing
from collections.abc import Callable
from typing import Any

import pydantic

__all__ = ["Converter", "hint_schema"]

Converter = Callable[[Any], Any]
_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_FORMATS: dict[Any, str] = {datetime.datetime: "date-time", datetime.date: "date", datetime.time: "time"}
_UNSUPPORTED = ("expected str, int, float, bool, list[...], dict[str, ...], set[...], tuple[...], Literal[...], an "
                "Enum, datetime/date/time, a pydantic model, a dataclass or Optional[...] of those")


def _is_model(hint: Any) -> bool:
    return isinstance(hint, type) and (issubclass(hint, pydantic.BaseModel) or dataclasses.is_dataclass(hint))


def _strip_titles(schema: Any) -> Any:
    """Drops pydantic's ``title`` keywords (prompt noise), never a property that is named ``title``."""
    if isinstance(schema, list):
        return [_strip_titles(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


def _pydantic_schema(hint: Any, defs: dict[str, Any], where: str) -> dict[str, Any]:
    try:
        schema = pydantic.TypeAdapter(hint).json_schema(ref_template="#/$defs/{model}")
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError, NameError) as exc:
        raise TypeError(f"{where}: cannot describe {hint!r} as a JSON schema ({exc})") from None
    schema = _strip_titles(schema)
    for name, sub in schema.pop("$defs", {}).items():
        if defs.get(name, sub) != sub:
            raise TypeError(f"{where}: two different types are both named {name!r}; rename one")
        defs[name] = sub
    return dict(schema)


def _adapter(hint: Any) -> Converter:
    adapter = pydantic.TypeAdapter(hint)
    return lambda value: adapter.validate_python(value)


def hint_schema(hint: Any, defs: dict[str, Any], where: str) -> tuple[dict[str, Any], Converter | None]:
    """The JSON schema of ``hint`` and the converter its checked JSON value needs (None: use as is).

    Definitions of nested models are added to ``defs``. Raises ``TypeError`` naming ``where`` for a
    hint that cannot be described.
    """
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}, None
    if hint is Any:
        return {}, None
    if hint in _FORMATS:
        return {"type": "string", "format": _FORMATS[hint]}, _adapter(hint)
    if _is_model(hint):
        return _pydantic_schema(hint, defs, where), _adapter(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        schema: dict[str, Any] = {"type": "string", "enum": values} if all(isinstance(v, str) for v in values) \
            else {"enum": values}
        return schema, hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        schema = {"enum": list(args)}
        if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
            schema["type"] = _SCALARS[next(iter(kinds))]
        return schema, None
    if origin in (typing.Union, types.UnionType):
        return _union(hint, args, defs, where)
    return _container(hint, origin, args, defs, where)


def _union(hint: Any, args: tuple[Any, ...], defs: dict[str, Any], where: str) -> tuple[dict[str, Any], Converter | None]:
    rest = [a for a in args if a is not type(None)]
    parts = [hint_schema(a, defs, where) for a in rest]
    convert = _adapter(hint) if any(c is not None for _, c in parts) else None
    if len(parts) == 1:
        return parts[0][0], convert
    return {"anyOf": [s for s, _ in parts]}, convert


def _container(hint: Any, origin: Any, args: tuple[Any, ...], defs: dict[str, Any],
               where: str) -> tuple[dict[str, Any], Converter | None]:
    if hint in (list, set, frozenset, tuple) or origin in (list, set, frozenset):
        kind = origin or hint
        schema: dict[str, Any] = {"type": "array"}
        convert: Converter | None = None
        if args:
            items, item_convert = hint_schema(args[0], defs, where)
            schema["items"] = items
            convert = _adapter(hint) if item_convert is not None else None
        if kind in (set, frozenset):
            schema["uniqueItems"] = True
            convert = _adapter(hint)
        if kind is tuple:
            convert = tuple
        return schema, convert
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            items, _ = hint_schema(args[0], defs, where)
            return {"type": "array", "items": items}, _adapter(hint)
        prefix = [hint_schema(a, defs, where)[0] for a in args]
        return {"type": "array", "prefixItems": prefix, "minItems": len(args), "maxItems": len(args)}, _adapter(hint)
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{where}: unsupported type hint {hint!r}; JSON objects have string keys, so expected "
                            "dict[str, ...]")
        if len(args) == 2 and args[1] is not Any:
            values, value_convert = hint_schema(args[1], defs, where)
            return {"type": "object", "additionalProperties": values}, (
                _adapter(hint) if value_convert is not None else None)
        return {"type": "object"}, None
    raise TypeError(f"{where}: unsupported type hint {hint!r}; {_UNSUPPORTED}")
