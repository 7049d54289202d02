"""Tool argument schemas: SGLang-style XML value conversion and JSON-schema validation.

Two consumers share this module: the tool-call parser (which converts XML parameter text to typed
values and checks every call against its tool's schema) and the tool runner (which validates
arguments before calling a tool). Both report problems as :class:`ToolCallFailure` values of kind
``missing_required_argument`` or ``invalid_argument_type``, never as exceptions, and each failure
names the tool, the argument, the offending value and what the schema expected.

Example::

    >>> props = {"n": {"type": "integer"}, "zip": {"type": "string"}}
    >>> convert_xml_value("42", "n", props)
    (42, None)
    >>> convert_xml_value("03106", "zip", props)
    ('03106', None)
    >>> [f.kind.value for f in validate_arguments("f", {"n": "x"}, {"type": "object", "properties": props,
    ...                                                              "required": ["zip"]})]
    ['missing_required_argument', 'invalid_argument_type']
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from agentrl.chat.types import FailureKind, ToolCallFailure

__all__ = [
    "check_parameters_schema",
    "convert_xml_value",
    "json_value",
    "tool_name",
    "tool_parameters",
    "tool_properties",
    "validate_arguments",
]

_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INT_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_FLOAT_PREFIXES = ("num", "float")
_BOOL_TYPES = ("boolean", "bool", "binary")
_CONTAINER_TYPES = ("object", "array", "arr")
_CONTAINER_PREFIXES = ("dict", "list")
_NOT_JSON = object()


# ---------------------------------------------------------------------------------------------
# OpenAI tool dicts


def _function_part(tool: Any) -> Mapping[str, Any]:
    """The ``{"name", "description", "parameters"}`` part of an OpenAI tool dict (or a flat one)."""
    if not isinstance(tool, Mapping):
        raise TypeError(f"tool: expected an OpenAI tool object (a dict), got {type(tool).__name__}: {tool!r:.200}")
    fn = tool.get("function", tool)
    if not isinstance(fn, Mapping):
        raise ValueError(f"tool.function: expected an object, got {type(fn).__name__}: {fn!r:.200}")
    return fn


def tool_name(tool: Mapping[str, Any]) -> str:
    """The tool's name from ``{"type": "function", "function": {"name": ...}}`` or a flat ``{"name": ...}``."""
    name = _function_part(tool).get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool.function.name: expected a non-empty string, got {name!r:.200}")
    return name


def tool_parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's JSON-schema ``parameters`` object; ``{}`` (anything accepted) when it has none."""
    params = _function_part(tool).get("parameters")
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise ValueError(
            f"tool {tool_name(tool)!r}: function.parameters: expected a JSON-schema object, "
            f"got {type(params).__name__}: {params!r:.200}"
        )
    return dict(params)


def tool_properties(tool: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(properties, required)`` of an OpenAI tool dict, both empty when the schema declares none."""
    params = tool_parameters(tool)
    props = params.get("properties") or {}
    required = params.get("required") or []
    name = tool_name(tool)
    if not isinstance(props, Mapping):
        raise ValueError(f"tool {name!r}: parameters.properties: expected an object, got {props!r:.200}")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"tool {name!r}: parameters.required: expected a list of strings, got {required!r:.200}")
    return dict(props), list(required)


# ---------------------------------------------------------------------------------------------
# JSON values


def json_value(value: Any) -> Any:
    """``value`` as plain JSON data (tuples become lists), or raises ``ValueError`` naming the problem.

    Rejects what JSON cannot carry: non-finite floats (``inf``, ``nan``), sets, bytes, complex
    numbers and mappings with non-string keys. Nesting deeper than the interpreter's recursion
    limit raises ``RecursionError``.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        return value
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"object key {k!r} is not a string")
            out[k] = json_value(v)
        return out
    raise ValueError(f"a {type(value).__name__} ({value!r:.80}) is not a JSON value")


def _as_json(value: Any) -> Any:
    """:func:`json_value`, or ``_NOT_JSON`` instead of raising."""
    try:
        return json_value(value)
    except (ValueError, RecursionError):
        return _NOT_JSON


# ---------------------------------------------------------------------------------------------
# XML value conversion (SGLang / vLLM ``qwen3_coder`` semantics)


def _schema_type(prop: Any) -> str:
    """The lower-cased type name that decides how an XML value converts (SGLang's ``param_type``).

    A missing type means ``string``. Nullable forms (``["integer", "null"]``, ``anyOf`` with a
    ``null`` branch) use their single non-null type; several non-null types fall to ``other``
    (``ast.literal_eval`` with the string as fallback). A bare ``enum`` of strings is a string.
    """
    if not isinstance(prop, Mapping):
        return "string"
    t = prop.get("type")
    if t is None:
        for key in ("anyOf", "oneOf"):
            alts = prop.get(key)
            if isinstance(alts, list):
                kinds = [_schema_type(a) for a in alts if not (isinstance(a, Mapping) and a.get("type") == "null")]
                return kinds[0] if len(kinds) == 1 else "other"
        enum = prop.get("enum")
        if isinstance(enum, list) and not all(isinstance(e, str) for e in enum):
            return "other"
        return "string"
    if isinstance(t, list):
        kinds = [str(x).strip().lower() for x in t if x != "null"]
        return kinds[0] if len(kinds) == 1 else "other"
    return str(t).strip().lower()


def _convert_number(raw: str) -> tuple[Any, str | None]:
    """SGLang's ``num*``/``float*`` rule: a float, or an int when the text has no ``.``/``e``."""
    integral = "." not in raw and "e" not in raw.lower()
    try:
        if integral:
            try:
                return int(raw), None
            except ValueError:
                pass  # e.g. "inf": let float() decide
        value = float(raw)
    except (ValueError, OverflowError) as exc:
        return raw, f"expected a number, got {raw!r:.200} ({exc})"
    if not math.isfinite(value):
        return raw, f"expected a finite number, got {raw!r:.200}"
    if integral and value.is_integer():
        return int(value), None
    return value, None


def _convert_container(raw: str, kind: str) -> tuple[Any, str | None]:
    """``json.loads``, then ``ast.literal_eval`` (Python-repr dicts as Qwen3-Coder renders them)."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(raw)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
            return raw, f"expected {kind} as JSON (or a Python literal), got {raw!r:.200} ({type(exc).__name__})"
    converted = _as_json(value)
    if converted is _NOT_JSON:
        return raw, f"expected {kind} as JSON, got {raw!r:.200} (not representable as JSON)"
    return converted, None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def convert_xml_value(raw: str, param_name: str, properties: Mapping[str, Any]) -> tuple[Any, str | None]:
    """Converts one XML parameter value by the tool's schema, the way SGLang's ``qwen3_coder`` does.

    ``raw`` is the parameter text with its framing newlines already removed; ``properties`` is the
    tool schema's ``properties`` object (``{}`` when there is no schema). Returns ``(value, error)``:
    ``error`` is ``None`` on success, else a sentence saying what was expected, and ``value`` is then
    the unchanged ``raw`` string. Never raises.

    Rules (SGLang ``_convert_param_value``): ``null`` (any case) is ``None`` for every type; a
    parameter missing from the schema stays a string; string-like types stay strings; ``int*``
    types use ``int()``; ``num*``/``float*`` use ``float()`` and become ``int`` when the text has no
    ``.``/``e``; object/array types use ``json.loads`` then ``ast.literal_eval``; other types try
    ``ast.literal_eval`` and keep the string when that fails. Two deliberate differences: a boolean
    that is neither ``true`` nor ``false`` is an error (SGLang silently makes it ``False``), and
    non-finite numbers (``inf``, ``nan``) are errors (JSON cannot carry them).
    """
    if raw.lower() == "null":
        return None, None
    if param_name not in properties:
        return raw, None
    kind = _schema_type(properties[param_name])
    if kind in _STRING_TYPES:
        return raw, None
    if kind.startswith(_INT_PREFIXES):
        try:
            return int(raw), None
        except ValueError as exc:
            return raw, f"expected an integer, got {raw!r:.200} ({exc})"
    if kind.startswith(_FLOAT_PREFIXES):
        return _convert_number(raw)
    if kind in _BOOL_TYPES:
        word = raw.strip().lower()
        if word in ("true", "false"):
            return word == "true", None
        return raw, f"expected a boolean (true or false), got {raw!r:.200}"
    if kind in _CONTAINER_TYPES or kind.startswith(_CONTAINER_PREFIXES):
        return _convert_container(raw, "an array" if kind.startswith(("arr", "list")) else "an object")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return raw, None
    converted = _as_json(value)
    return (raw, None) if converted is _NOT_JSON else (converted, None)


# ---------------------------------------------------------------------------------------------
# Validation


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """A checked jsonschema validator for one (canonically serialised) schema."""
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def _compiled(tool: str, schema: Mapping[str, Any]) -> Any:
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tool {tool!r}: parameters: expected a JSON-serialisable JSON schema ({exc})") from exc
    try:
        return _validator(key)
    except jsonschema.exceptions.SchemaError as exc:
        raise ValueError(f"tool {tool!r}: parameters is not a valid JSON schema: {exc.message}") from exc


def check_parameters_schema(tool_name: str, schema: Mapping[str, Any] | None) -> None:
    """Raises ``ValueError`` naming the tool when ``schema`` is not a valid JSON schema (``{}``/None are valid)."""
    if schema:
        _compiled(tool_name, schema)


def _expected(err: jsonschema.exceptions.ValidationError) -> str:
    if err.validator == "type":
        return f"type {err.validator_value!r}"
    if err.validator == "enum":
        return f"one of {err.validator_value!r}"
    return err.message


def _type_failure(tool: str, arg: str, err: jsonschema.exceptions.ValidationError) -> ToolCallFailure:
    where = "".join(f"[{p!r}]" for p in list(err.absolute_path)[1:])
    got = err.instance
    message = (f"{tool}: argument {arg!r}{where}: got {got!r:.200} ({type(got).__name__}), "
               f"expected {_expected(err)}")
    return ToolCallFailure(FailureKind.INVALID_ARGUMENT_TYPE, message, tool_name=tool, argument=arg)


def validate_arguments(tool_name: str, arguments: Mapping[str, Any], schema: Mapping[str, Any] | None
                       ) -> list[ToolCallFailure]:
    """Checks a call's ``arguments`` against the tool's JSON-schema ``parameters`` object.

    Returns one ``missing_required_argument`` failure per absent required argument (in the
    schema's order), then at most one ``invalid_argument_type`` failure per offending argument
    (wrong type, enum violated, nested schema failure, or an argument the schema forbids through
    ``additionalProperties: false``), each naming the argument, its value and the expectation.
    An empty list means the call is valid. Raises ``ValueError`` only when ``schema`` itself is
    not a valid JSON schema (a tool definition bug, not a model error).
    """
    if not schema:
        return []
    validator = _compiled(tool_name, schema)
    failures: list[ToolCallFailure] = []
    required = schema.get("required") or []
    for name in required:
        if name not in arguments:
            prop = (schema.get("properties") or {}).get(name)
            expect = f"type {prop['type']!r}" if isinstance(prop, Mapping) and "type" in prop else "a value"
            failures.append(ToolCallFailure(
                FailureKind.MISSING_REQUIRED_ARGUMENT,
                f"{tool_name}: missing required argument {name!r} (expected {expect})",
                tool_name=tool_name, argument=name))
    try:
        errors = list(validator.iter_errors(dict(arguments)))
    except RecursionError:
        return [*failures, ToolCallFailure(FailureKind.INVALID_ARGUMENT_TYPE,
                                           f"{tool_name}: arguments are nested too deeply to validate",
                                           tool_name=tool_name)]
    by_arg: dict[str, list[jsonschema.exceptions.ValidationError]] = {}
    for err in errors:
        if err.absolute_path:
            by_arg.setdefault(str(err.absolute_path[0]), []).append(err)
        elif err.validator == "additionalProperties":
            props = schema.get("properties") or {}
            for extra in (k for k in arguments if k not in props):
                failures.append(ToolCallFailure(
                    FailureKind.INVALID_ARGUMENT_TYPE,
                    f"{tool_name}: argument {extra!r}: got {arguments[extra]!r:.200}, expected no such argument "
                    f"(allowed: {sorted(props)})", tool_name=tool_name, argument=extra))
        elif err.validator != "required":
            failures.append(ToolCallFailure(FailureKind.INVALID_ARGUMENT_TYPE,
                                            f"{tool_name}: arguments: {err.message}", tool_name=tool_name))
    for arg, errs in by_arg.items():
        best = jsonschema.exceptions.best_match(errs)
        if best is not None:
            failures.append(_type_failure(tool_name, arg, best))
    return failures
