"""The tool contract: a :class:`Tool` protocol, :class:`ToolResult`, and the ``@tool`` decorator.

A tool has a ``name``, a ``description``, a JSON-schema ``parameters`` object and an async
``__call__(**arguments) -> ToolResult``. ``schema()`` (or :func:`tool_schema`) gives the OpenAI
function dict ``{"type": "function", "function": {"name", "description", "parameters"}}`` that the
chat templates render unchanged.

Tools report failures as values, never as exceptions out of the agent loop: arguments are validated
against the schema before the call (``missing_required_argument``, ``invalid_argument_type`` — an
argument the function does not take included), an exception inside the tool becomes a
``tool_error`` result with a short message, and a call that exceeds the tool's ``timeout_s``
becomes ``tool_timeout``.

Parameter types: the JSON scalars, ``Literal``, ``Optional``, ``list``/``dict[str, ...]``/``set``/
``tuple`` with their item types, ``Enum``, ``datetime``/``date``/``time``, pydantic models and
dataclasses (see :mod:`agentrl.tools._hints`); the function receives values of those types (a
model instance, a ``datetime``, a ``set``, an ``Enum`` member). A docstring entry for a parameter
the function does not take, or a hint that cannot be resolved, fails at decoration.

Example::

    @tool(timeout_s=5)
    def add(a: int, b: int = 0) -> int:
        \"\"\"Adds two integers.

        Args:
            a: The first addend.
            b: The second addend.
        \"\"\"
        return a + b

    result = await add(a=2, b=3)        # ToolResult(content="5", is_error=False)
    add.schema()["function"]["parameters"]["required"]   # ["a"]

Sync functions run on a worker thread so they never block the event loop; on timeout the caller
gets ``tool_timeout`` at once, but the thread itself cannot be interrupted and finishes in the
background (use async functions or sandboxed tools for code that may hang).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import json
import re
import time
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, overload, runtime_checkable

import pydantic

from agentrl.chat.schema import validate_arguments
from agentrl.chat.types import FailureKind, ToolCallFailure
from agentrl.tools._hints import Converter, hint_schema

__all__ = ["FunctionTool", "Tool", "ToolResult", "function_parameters", "tool", "tool_schema", "validate_call"]

MAX_ERROR_CHARS = 500


@dataclass
class ToolResult:
    """What a tool returns to the model: ``content`` (the text rendered into the tool message),
    ``is_error``, the failure ``error_kind`` when it is an error, and ``metrics`` for logging
    (``returned_none``: a ``@tool`` function returned ``None``, shown to the model as ``""``)."""

    content: str
    is_error: bool = False
    error_kind: FailureKind | None = None
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def error(cls, kind: FailureKind, message: str, **metrics: Any) -> ToolResult:
        return cls(content=message, is_error=True, error_kind=kind, metrics=dict(metrics))

    @classmethod
    def from_failures(cls, failures: list[ToolCallFailure]) -> ToolResult:
        """An error result for argument-validation failures (the first failure's kind)."""
        return cls(content="Error: " + "; ".join(f.message for f in failures), is_error=True,
                   error_kind=failures[0].kind, metrics={"failures": [f.kind.value for f in failures]})


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call."""

    name: str
    description: str
    parameters: dict[str, Any]

    def __call__(self, **arguments: Any) -> Awaitable[ToolResult]: ...


def tool_schema(t: Tool) -> dict[str, Any]:
    """The OpenAI function dict of ``t``, as the chat templates list tools."""
    return {"type": "function", "function": {"name": t.name, "description": t.description,
                                             "parameters": t.parameters}}


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + " ..."


# --------------------------------------------------------------------------- schema from hints

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Raises|Yields|Example|Examples)\s*:\s*$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Splits a Google-style (``Args:``) or Sphinx-style (``:param x:``) docstring into the summary
    and per-argument descriptions."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    summary: list[str] = []
    params: dict[str, str] = {}
    section, current = None, None
    for line in lines:
        m = _SECTION.match(line)
        sphinx = re.match(r"^\s*:param\s+(?:\w+\s+)?(\w+)\s*:\s*(.*)$", line)
        if m:
            section, current = m.group(1), None
        elif sphinx:
            current = sphinx.group(1)
            params[current] = sphinx.group(2).strip()
        elif section in ("Args", "Arguments", "Parameters"):
            arg = re.match(r"^\s{0,8}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if arg and (len(line) - len(line.lstrip())) <= 4:
                current = arg.group(1)
                params[current] = arg.group(2).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
        elif section is None and current is None and not line.startswith(":"):
            summary.append(line)
    return "\n".join(summary).strip(), params


def _type_hints(fn: Callable[..., Any], localns: Mapping[str, Any] | None) -> dict[str, Any]:
    """``fn``'s resolved hints; an unresolvable forward reference fails naming it."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        return typing.get_type_hints(fn, localns=dict(localns) if localns is not None else None)
    except NameError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        raise TypeError(f"@tool {name}: cannot resolve the type hint {missing!r}; define or import it at module "
                        "level before the function (or quote nothing: use the class itself)") from None


def describe_function(fn: Callable[..., Any], localns: Mapping[str, Any] | None = None) -> tuple[
        str, dict[str, Any], dict[str, Converter]]:
    """``(description, parameters_schema, converters)`` from ``fn``'s signature, hints and docstring.

    ``converters`` turn each checked JSON value into its hint's type (models, datetimes, sets...).
    Raises ``TypeError`` at decoration for what cannot be described: a missing or unsupported hint,
    ``*args``/``**kwargs``, an unresolvable forward reference, or a docstring entry for a
    parameter the function does not take. ``localns`` resolves hints naming local classes.
    """
    name = getattr(fn, "__name__", repr(fn))
    description, docs = _parse_docstring(inspect.getdoc(fn) or "")
    signature = inspect.signature(fn)
    unknown = [d for d in docs if d not in signature.parameters]
    if unknown:
        raise TypeError(f"@tool {name}: the docstring describes {', '.join(map(repr, unknown))}, which {name}() does "
                        f"not take (parameters: {', '.join(signature.parameters) or 'none'}); fix the docstring")
    hints = _type_hints(fn, localns)
    properties: dict[str, Any] = {}
    required: list[str] = []
    defs: dict[str, Any] = {}
    converters: dict[str, Converter] = {}
    for pname, param in signature.parameters.items():
        where = f"@tool {name}({pname})"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"{where}: tools take named arguments only; *args, **kwargs and positional-only "
                            "parameters cannot be described by a JSON schema")
        if pname not in hints:
            raise TypeError(f"{where}: missing type hint; expected e.g. `{pname}: str`")
        prop, convert = hint_schema(hints[pname], defs, where)
        if convert is not None:
            converters[pname] = convert
        if pname in docs:
            prop["description"] = docs[pname]
        if param.default is param.empty:
            required.append(pname)
        elif param.default is not None and isinstance(param.default, (str, int, float, bool)):
            prop["default"] = param.default.value if isinstance(param.default, enum.Enum) else param.default
        elif isinstance(param.default, enum.Enum) and isinstance(param.default.value, (str, int, float, bool)):
            prop["default"] = param.default.value
        properties[pname] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if defs:
        schema["$defs"] = defs
    return description, schema, converters


def function_parameters(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """``(description, parameters_schema)`` derived from ``fn``'s signature, hints and docstring."""
    description, schema, _ = describe_function(fn)
    return description, schema


# --------------------------------------------------------------------------- FunctionTool


def _as_content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class FunctionTool:
    """A Python function (sync or async) exposed as a :class:`Tool`. Built by :func:`tool`."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                 timeout_s: float | None = 30.0, localns: Mapping[str, Any] | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionTool: expected a function, got {fn!r}")
        if timeout_s is not None and (isinstance(timeout_s, bool) or timeout_s <= 0):
            raise ValueError(f"@tool(timeout_s=...): expected a positive number or None, got {timeout_s!r}")
        doc_description, self.parameters, self._converters = describe_function(fn, localns)
        self.name = name or fn.__name__
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", self.name):
            raise ValueError(f"@tool(name=...): expected letters, digits, '_', '.' or '-' (max 64), got {self.name!r}")
        self.description = description if description is not None else doc_description
        self.timeout_s = timeout_s
        self.fn = fn
        self._is_async = inspect.iscoroutinefunction(fn)

    def schema(self) -> dict[str, Any]:
        return tool_schema(self)

    def _checked(self, arguments: dict[str, Any]) -> dict[str, Any] | list[ToolCallFailure]:
        """The arguments converted to the function's types, or the failures that keep it from being called."""
        allowed = self.parameters["properties"]
        failures = [ToolCallFailure(FailureKind.INVALID_ARGUMENT_TYPE,
                                    f"{self.name}: argument {k!r}: got {v!r:.200}, expected no such argument "
                                    f"(allowed: {', '.join(allowed) or 'none'})", tool_name=self.name, argument=k)
                    for k, v in arguments.items() if k not in allowed]
        failures += validate_arguments(self.name, arguments, self.parameters)
        if failures:
            return failures
        converted = dict(arguments)
        for key, convert in self._converters.items():
            if key not in converted or converted[key] is None:
                continue
            try:
                converted[key] = convert(converted[key])
            except (pydantic.ValidationError, ValueError, TypeError) as exc:
                detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()) \
                    if isinstance(exc, pydantic.ValidationError) else str(exc)
                failures.append(ToolCallFailure(FailureKind.INVALID_ARGUMENT_TYPE,
                                                f"{self.name}: argument {key!r}: {detail[:300]}",
                                                tool_name=self.name, argument=key))
        return failures or converted

    async def __call__(self, **arguments: Any) -> ToolResult:
        checked = self._checked(arguments)
        if isinstance(checked, list):
            return ToolResult.from_failures(checked)
        arguments = checked
        start = time.monotonic()
        try:
            if self._is_async:
                value = await asyncio.wait_for(self.fn(**arguments), self.timeout_s)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(self.fn, **arguments), self.timeout_s)
        except asyncio.TimeoutError:
            return ToolResult.error(FailureKind.TOOL_TIMEOUT,
                                    f"Error: tool {self.name!r} timed out after {self.timeout_s} s",
                                    duration_s=time.monotonic() - start)
        except Exception as exc:
            return ToolResult.error(FailureKind.TOOL_ERROR, f"Error: {short_error(exc)}",
                                    duration_s=time.monotonic() - start)
        if isinstance(value, ToolResult):
            return value
        metrics: dict[str, Any] = {"duration_s": time.monotonic() - start}
        if value is None:  # the model sees "": say so, for `agentrl env check` to warn (a forgotten return?)
            metrics["returned_none"] = True
        return ToolResult(_as_content(value), metrics=metrics)

    def __repr__(self) -> str:
        return f"FunctionTool(name={self.name!r}, timeout_s={self.timeout_s})"


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(*, name: str | None = None, description: str | None = None,
         timeout_s: float | None = 30.0) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
         timeout_s: float | None = 30.0) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turns a typed, documented function into a :class:`FunctionTool` (``@tool`` or ``@tool(...)``).

    Hints may name classes local to the decorating scope (a model defined inside a function): that
    scope's names resolve them.
    """
    caller = inspect.currentframe()
    localns = dict(caller.f_back.f_locals) if caller is not None and caller.f_back is not None else None
    del caller
    if fn is not None:
        return FunctionTool(fn, name=name, description=description, timeout_s=timeout_s, localns=localns)

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description, timeout_s=timeout_s, localns=localns)

    return wrap


def validate_call(t: Tool, arguments: Mapping[str, Any]) -> list[ToolCallFailure]:
    """Schema validation of ``arguments`` for any tool (what ``FunctionTool`` does before calling)."""
    return validate_arguments(t.name, arguments, t.parameters)
