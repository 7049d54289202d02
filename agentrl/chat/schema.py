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

import json
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import orjson

from agentrl.chat._values import normalize_schema_types, nullable_as_union, xml_value
from agentrl.chat.types import FailureKind, ToolCallFailure

__all__ = [
    "check_parameters_schema",
    "convert_xml_value",
    "json_value",
    "normalize_schema_types",
    "tool_name",
    "tool_parameters",
    "tool_properties",
    "validate_arguments",
]



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
    numbers, mappings with non-string keys, and strings holding a lone surrogate (JSON text may
    escape one, ``"\\ud800"``, but it is not Unicode: no UTF-8 file, tokenizer or server can carry
    it). Nesting deeper than the interpreter's recursion limit raises ``RecursionError``.
    """
    if isinstance(value, str):
        _check_unicode(value)
        return value
    if value is None or isinstance(value, (bool, int)):
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
            _check_unicode(k)
            out[k] = json_value(v)
        return out
    raise ValueError(f"a {type(value).__name__} ({value!r:.80}) is not a JSON value")


def _check_unicode(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"the string {text[max(exc.start - 20, 0):exc.end + 20]!r} holds a lone surrogate "
                             f"({text[exc.start]!r}), which is not valid Unicode") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# ---------------------------------------------------------------------------------------------
# XML value conversion (SGLang ``qwen3_coder`` semantics, in agentrl.chat._values)


def convert_xml_value(raw: str, param_name: str, properties: Mapping[str, Any]) -> tuple[Any, str | None]:
    """Converts one XML parameter value by the tool's schema, the way SGLang's ``qwen3_coder`` does.

    ``raw`` is the parameter text with its framing newlines already removed; ``properties`` is the
    tool schema's ``properties`` object (``{}`` when there is no schema). Returns ``(value, error)``:
    ``value`` is what a tool served by SGLang receives, and ``error`` is ``None`` when the text
    converted cleanly, else a sentence saying what the schema expected. Never raises.

    Rules (SGLang ``_convert_param_value``, after SGLang's rewrite of type aliases such as
    ``float``/``int``/``str``/``bool``/``dict``/``list``): ``null`` (any case) is ``None`` for every
    type; a parameter missing from the schema stays a string; string-like types stay strings;
    integer types use ``int()`` and keep the text when that fails; number types use ``float()`` and
    become ``int`` when the text has no ``.``/``e`` (an integer beyond 2**53 thus arrives rounded, with
    an error saying so, as in SGLang 0.5.23; newer SGLang keeps it exact); a boolean that is not ``true``/``false`` reads as
    ``False`` (with an error saying so); object/array types use ``json.loads`` then
    ``ast.literal_eval``; other types try ``ast.literal_eval`` and keep the string when that fails.
    A union type (``["integer", "string"]``) converts by its first non-null member. One deliberate
    difference: a value JSON cannot carry (``inf``, ``nan``, a set, bytes) is an error and ``value``
    is then the unchanged ``raw`` text.
    """
    normalized = {k: normalize_schema_types(v) for k, v in properties.items()}
    out = xml_value(raw, param_name, normalized)
    return out.value, out.note


# ---------------------------------------------------------------------------------------------
# Validation


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    """A checked jsonschema validator for one (canonically serialised) schema, type aliases rewritten
    and ``nullable: true`` read as SGLang reads it (:func:`~agentrl.chat._values.nullable_as_union`)."""
    schema = nullable_as_union(normalize_schema_types(json.loads(schema_json)))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def _compiled(tool: str, schema: Mapping[str, Any]) -> Any:
    """The validator of ``schema`` with its type aliases rewritten (:func:`normalize_schema_types`)."""
    try:  # orjson: this runs for every tool of every environment instance
        key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tool {tool!r}: parameters: expected a JSON-serialisable JSON schema ({exc})") from exc
    try:
        return _validator(key)
    except jsonschema.exceptions.SchemaError as exc:
        raise ValueError(f"tool {tool!r}: parameters is not a valid JSON schema: {exc.message}") from exc


def check_parameters_schema(tool_name: str, schema: Any) -> None:
    """Raises ``ValueError`` naming the tool when ``schema`` is not a usable JSON schema.

    ``{}`` and ``None`` are valid (anything accepted); non-standard type names that SGLang rewrites
    (``float``, ``int``, ``str``, ``bool``, ``dict``, ``list``, ...) are accepted as their JSON-schema
    equivalents, and OpenAPI's ``nullable: true`` also accepts ``null``, as in SGLang. This is the
    check for tool registration; the parser never raises on a schema.
    """
    if schema is None:
        return
    if not isinstance(schema, Mapping):
        raise ValueError(f"tool {tool_name!r}: parameters: expected a JSON-schema object, "
                         f"got {type(schema).__name__}: {schema!r:.200}")
    if schema:
        try:
            _compiled(tool_name, schema)
        except RecursionError:
            raise ValueError(f"tool {tool_name!r}: parameters: the schema is nested too deeply") from None


def usable_schema(tool_name: str, schema: Any) -> dict[str, Any] | None:
    """``schema`` with type aliases rewritten when it is a valid, non-empty JSON schema; else ``None``.

    Never raises: the parser uses it so that a bad schema turns validation off instead of failing.
    """
    if not isinstance(schema, Mapping) or not schema:
        return None
    try:
        validator = _compiled(tool_name, schema)
    except (ValueError, TypeError, RecursionError):
        return None
    normalized = validator.schema
    return dict(normalized) if isinstance(normalized, Mapping) else None


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
    Type aliases are rewritten and ``nullable: true`` accepts ``null``, as SGLang reads them.
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
