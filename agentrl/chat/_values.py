"""Tool-schema type names and XML value conversion, as SGLang serves them (internal to the chat layer).

At serving time SGLang first rewrites non-standard ``type`` names in each tool's ``parameters``
(``float``, ``int``, ``str``, ``bool``, ``dict``, ``list``, ``varchar``, ...) to JSON-schema names,
then its ``qwen3_coder`` parser converts each XML parameter value by the type it infers from the
parameter's schema, and finally sends the arguments on as JSON. This module does the same three
steps so that the values a tool receives in training are the values it would receive in serving:

- :func:`normalize_schema_types` returns a copy of a schema with the type names rewritten;
- :func:`conversion_properties` picks the mapping SGLang looks parameter schemas up in;
- :func:`xml_value` converts one value and says whether it converted cleanly, was coerced the way
  SGLang coerces it (a tolerated note), or cannot be carried at all (a fatal problem).

Two places where this code deliberately does not follow SGLang: values that JSON cannot carry
(``inf``, ``nan``, sets, bytes, complex numbers) are rejected, where SGLang sends non-standard
JSON or fails on the whole turn.

The rules are those of SGLang 0.5.23, the version the project pins, also where newer SGLang
changed them: an integer beyond 2**53 written for a ``number`` parameter goes through ``float()``
and arrives rounded (``9007199254740993`` becomes ``9007199254740992``; an ``integer`` parameter
keeps it exact), which is reported as a tolerated note. Validation reads OpenAPI's
``nullable: true`` as SGLang's grammar does (:func:`nullable_as_union`).
"""

from __future__ import annotations

import ast
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_STANDARD = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "enum", "uuid", "date", "datetime", "time",
                     "timestamp", "binary", "blob", "bytea", "bytes", "varbinary"), "string"),
    "bool": "boolean",
    **dict.fromkeys(("bigint", "smallint", "tinyint"), "integer"),
    **dict.fromkeys(("double", "decimal", "real", "numeric"), "number"),
    **dict.fromkeys(("arr", "tuple", "set"), "array"),
    "map": "object",
}
# A prefix names a type when it is the whole name or is followed by one of these ("int32",
# "list[str]", "float(8)"), so that "internal" or "list_price" are left alone.
_PREFIXES = ((("int", "uint", "long", "short", "unsigned"), "integer"), (("num", "float"), "number"),
             (("list",), "array"), (("dict",), "object"))
_BOUNDARY = frozenset("0123456789[<( \t")
_NESTED_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_NESTED_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_NESTED_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "unevaluatedItems", "unevaluatedProperties")

_STRING_KINDS = ("string", "str", "text", "varchar", "char", "enum")
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_FLOAT_PREFIXES = ("num", "float")
_BOOL_KINDS = ("boolean", "bool", "binary")
_CONTAINER_KINDS = ("object", "array", "arr")
_CONTAINER_PREFIXES = ("dict", "list")


def _standard_name(raw: Any) -> Any:
    if not isinstance(raw, str) or raw in _STANDARD:
        return raw
    base = raw.split("(", 1)[0].strip().lower()
    if base in _STANDARD:
        return base
    if base in _ALIASES:
        return _ALIASES[base]
    for prefixes, target in _PREFIXES:
        if any(base == p or (base.startswith(p) and base[len(p)] in _BOUNDARY) for p in prefixes):
            return target
    return raw


def _renamed(node: dict[str, Any]) -> dict[str, Any]:
    t = node.get("type")
    if isinstance(t, str):
        node["type"] = _standard_name(t)
    elif isinstance(t, list):
        names: list[Any] = []
        for name in map(_standard_name, t):
            if name not in names:
                names.append(name)
        node["type"] = names
    return node


def _rewritten(schema: Any, rewrite: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """``schema`` with ``rewrite`` applied to a copy of every subschema, children first."""
    if isinstance(schema, list):
        return [_rewritten(s, rewrite) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _NESTED_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: _rewritten(v, rewrite) for k, v in out[key].items()}
    for key in _NESTED_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_rewritten(v, rewrite) for v in out[key]]
    for key in _NESTED_ONE:
        if key in out:
            out[key] = _rewritten(out[key], rewrite)
    return rewrite(out)


def normalize_schema_types(schema: Any) -> Any:
    """A copy of ``schema`` with non-standard type names rewritten to JSON-schema names.

    ``float``/``double``/``decimal`` become ``number``, ``int``/``int64``/``bigint`` ``integer``,
    ``str``/``text``/``varchar``/``enum``/``date`` ``string``, ``bool`` ``boolean``, ``dict``/``map``
    ``object`` and ``list``/``tuple``/``set`` ``array``, at every nesting level; unknown names are
    kept so that validation still reports them. ``schema`` itself is not modified. A schema nested
    beyond the recursion limit is returned unchanged.
    """
    try:
        return _rewritten(schema, _renamed)
    except RecursionError:
        return schema


def _null_allowed(node: dict[str, Any]) -> dict[str, Any]:
    if node.get("nullable") is not True:
        return node
    del node["nullable"]  # gone from the rewritten copy, so that rewriting it again changes nothing
    return {"anyOf": [node, {"type": "null"}]}


def nullable_as_union(schema: Any) -> Any:
    """A copy of ``schema`` where every subschema marked ``nullable: true`` also accepts ``null``.

    ``nullable`` is OpenAPI's (and Gemini's, and pydantic v1's) way to say a value may be null;
    JSON schema ignores it, so a validator alone would reject ``null`` for ``{"type": "number",
    "nullable": true}``. SGLang 0.5.23 reads it as ``{"anyOf": [schema, {"type": "null"}]}`` when it
    constrains tool arguments (``response_template_structural_tag._json_value_schema``), and so
    does this. ``schema`` itself is not modified; one nested beyond the recursion limit is
    returned unchanged. The root is the arguments object and never null: a ``nullable`` there is dropped.
    """
    if not isinstance(schema, Mapping):
        return schema
    root = {k: v for k, v in schema.items() if k != "nullable"}
    try:
        return _rewritten(root, _null_allowed)
    except RecursionError:
        return schema


def get_properties(schema: Any) -> dict[str, Any]:
    """Top-level ``properties``, or those of ``anyOf``/``oneOf``/``allOf`` branches when there are none."""
    if not isinstance(schema, Mapping):
        return {}
    props = schema.get("properties")
    if isinstance(props, Mapping):
        return dict(props)
    merged: dict[str, Any] = {}
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                for name, value in get_properties(branch).items():
                    merged.setdefault(name, value)
    return merged


def conversion_properties(schema: Any) -> dict[str, Any]:
    """The mapping SGLang looks a parameter's schema up in.

    That is the schema's properties; when it declares none at all (no ``properties`` key and no
    branch with properties), SGLang looks names up in the schema object itself.
    """
    if not isinstance(schema, Mapping):
        return {}
    props = get_properties(schema)
    if props or "properties" in schema:
        return props
    return dict(schema)


def _enum_type(values: list[Any]) -> str:
    kinds: set[str] = set()
    for v in values:
        kinds.add("null" if v is None else "boolean" if isinstance(v, bool) else "integer" if isinstance(v, int)
                  else "number" if isinstance(v, float) else "string" if isinstance(v, str)
                  else "array" if isinstance(v, list) else "object" if isinstance(v, dict) else "")
    kinds.discard("")
    return kinds.pop() if len(kinds) == 1 else "string"


def _inferred(schema: Any) -> Any:
    """The type SGLang infers from one parameter schema, or None (then: string)."""
    if not isinstance(schema, Mapping):
        return None
    t = schema.get("type")
    if isinstance(t, str):
        return t
    if isinstance(t, list) and t:
        return next((x for x in t if x != "null"), "string")
    alts = schema.get("anyOf") or schema.get("oneOf") if ("anyOf" in schema or "oneOf" in schema) else None
    if isinstance(alts, list):
        kinds = [k for k in (_inferred(a) for a in alts) if k]
        if kinds:
            distinct = set(kinds)
            if len(distinct) == 1:
                return kinds[0]
            if len(distinct) == 2 and "null" in distinct:
                return next(k for k in kinds if k != "null")
            return "string" if "string" in distinct else kinds[0]
    enum = schema.get("enum")
    if isinstance(enum, list):
        return _enum_type(enum)
    if isinstance(schema.get("allOf"), list):
        return next((k for k in map(_inferred, schema["allOf"]) if k and k != "string"), "string")
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def schema_kind(schema: Any) -> str:
    """The lower-cased type name that decides how an XML value converts (``string`` by default)."""
    try:
        kind = _inferred(schema)
    except RecursionError:
        return "string"
    return "string" if kind is None else str(kind).strip().lower()


@dataclass(frozen=True)
class Converted:
    """One converted XML value: ``note`` when it was coerced, ``fatal`` when it cannot be sent."""

    value: Any
    note: str | None = None
    fatal: bool = False


def _literal(raw: str) -> Any:
    """``ast.literal_eval`` without invalid-escape warnings; raises as it does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.literal_eval(raw)


def _served(value: Any, raw: str, what: str) -> Converted:
    """``value`` as the tool receives it after SGLang's JSON round trip, or a fatal problem."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        served = json.loads(text)
    except ValueError:
        return Converted(raw, f"expected {what}, got {raw!r:.200}, which is not a finite number "
                              "(JSON cannot carry it)", fatal=True)
    except (TypeError, RecursionError):
        return Converted(raw, f"expected {what}, got {raw!r:.200}, which reads as a "
                              f"{type(value).__name__} that JSON cannot carry", fatal=True)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return Converted(raw, f"expected {what}, got {raw!r:.200}, which holds a lone surrogate (not valid "
                                  "Unicode: JSON cannot carry it)", fatal=True)
    return Converted(served)


def _number(raw: str) -> Converted:
    try:
        value = float(raw)
    except (ValueError, OverflowError) as exc:
        return Converted(raw, f"expected a number, got {raw!r:.200} ({exc}); the text is passed on as it is")
    if "." not in raw and "e" not in raw.lower() and value.is_integer():
        # SGLang 0.5.23 reads a number through float() even when it is an integer, so one beyond
        # 2**53 arrives rounded; newer SGLang keeps it exact. The pinned version decides.
        served = int(value)
        exact = _exact_int(raw)
        if exact is not None and exact != served:
            return Converted(served, f"the integer {raw.strip()!r:.80} is beyond what a float holds exactly and "
                                     f"arrives as {served} (SGLang 0.5.23 reads numbers through float()); "
                                     "declare the parameter an integer to keep it exact")
        return Converted(served)
    return _served(value, raw, "a number")


def _exact_int(raw: str) -> int | None:
    try:
        return int(raw)
    except ValueError:  # also past int()'s digit limit: then nothing is said about rounding
        return None


def _container(raw: str, kind: str) -> Converted:
    what = "an array" if kind.startswith(("arr", "list")) else "an object"
    try:
        return _served(json.loads(raw), raw, what)
    except (ValueError, RecursionError):
        pass
    try:
        value = _literal(raw)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return Converted(raw, f"expected {what} as JSON (or a Python literal), got {raw!r:.200}; "
                              "the text is passed on as it is")
    return _served(value, raw, what)


def xml_value(raw: str, param_name: str, properties: Mapping[str, Any]) -> Converted:
    """Converts one XML parameter value by its schema the way SGLang's ``qwen3_coder`` parser does.

    ``properties`` comes from :func:`conversion_properties` of the (normalised) tool schema.
    """
    if raw.lower() == "null":
        return Converted(None)
    if param_name not in properties:
        return Converted(raw)
    kind = schema_kind(properties[param_name])
    if kind in _STRING_KINDS:
        return Converted(raw)
    if kind.startswith(_INT_PREFIXES):
        try:
            return Converted(int(raw))
        except ValueError as exc:
            return Converted(raw, f"expected an integer, got {raw!r:.200} ({exc}); the text is passed on as it is")
    if kind.startswith(_FLOAT_PREFIXES):
        return _number(raw)
    if kind in _BOOL_KINDS:
        word = raw.lower()
        if word in ("true", "false"):
            return Converted(word == "true")
        return Converted(False, f"expected a boolean (true or false), got {raw!r:.200}; read as false, "
                                "as SGLang reads it")
    if kind in _CONTAINER_KINDS or kind.startswith(_CONTAINER_PREFIXES):
        return _container(raw, kind)
    try:
        value = _literal(raw)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return Converted(raw)
    return _served(value, raw, f"a {kind} value")
