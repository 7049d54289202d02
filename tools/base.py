"""The tool contract: a :class:`Tool` protocol, :class:`ToolResult`, and the ``@tool`` decorator.

A tool has a ``name``, a ``description``, a JSON-schema ``parameters`` object and an async
``__call__(**arguments) -> ToolResult``. ``schema()`` (or :func:`tool_schema`) gives the OpenAI
function dict ``{"type": "function", "function": {"name", "description", "parameters"}}`` that the
chat templates render unchanged.

Tools report failures as values, never as exceptions out of the agent loop: arguments are validated
against the schema before the call (``missing_required_argument``, ``invalid_argument_type``), an
exception inside the tool becomes a ``tool_error`` result with a short message, and a call that
exceeds the tool's ``timeout_s`` becomes ``tool_timeout``.

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
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, overload, runtime_checkable

from agentrl.chat.schema import validate_arguments
from agentrl.chat.types import FailureKind, ToolCallFailure

__all__ = ["FunctionTool", "Tool", "ToolResult", "function_parameters", "tool", "tool_schema", "validate_call"]

MAX_ERROR_CHARS = 500


@dataclass
class ToolResult:
    """What a tool returns to the model: ``content`` (the text rendered into the tool message),
    ``is_error``, the failure ``error_kind`` when it is an error, and ``metrics`` for logging."""

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

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _json_type(hint: Any, where: str) -> dict[str, Any]:
    """The JSON schema of a type hint (str/int/float/bool, list/dict, Literal, Enum, Optional)."""
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        schema: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
            schema["type"] = _SCALARS[next(iter(kinds))]
        return schema
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _json_type(rest[0], where)
        return {"anyOf": [_json_type(a, where) for a in rest]}
    if hint is list or origin is list:
        return {"type": "array", **({"items": _json_type(args[0], where)} if args else {})}
    if hint is dict or origin is dict:
        return {"type": "object"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        return {"type": "string", "enum": values} if all(isinstance(v, str) for v in values) else {"enum": values}
    raise TypeError(f"{where}: unsupported type hint {hint!r}; expected str, int, float, bool, list[...], dict, "
                    "Literal[...], an Enum or Optional[...] of those")


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


def function_parameters(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """``(description, parameters_schema)`` derived from ``fn``'s signature, hints and docstring."""
    name = getattr(fn, "__name__", repr(fn))
    description, docs = _parse_docstring(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        where = f"@tool {name}({pname})"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"{where}: tools take named arguments only; *args, **kwargs and positional-only "
                            "parameters cannot be described by a JSON schema")
        if pname not in hints:
            raise TypeError(f"{where}: missing type hint; expected e.g. `{pname}: str`")
        prop = _json_type(hints[pname], where)
        if pname in docs:
            prop["description"] = docs[pname]
        if param.default is param.empty:
            required.append(pname)
        elif param.default is not None and isinstance(param.default, (str, int, float, bool)):
            prop["default"] = param.default
        properties[pname] = prop
    return description, {"type": "object", "properties": properties, "required": required}


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
                 timeout_s: float | None = 30.0) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionTool: expected a function, got {fn!r}")
        if timeout_s is not None and (isinstance(timeout_s, bool) or timeout_s <= 0):
            raise ValueError(f"@tool(timeout_s=...): expected a positive number or None, got {timeout_s!r}")
        doc_description, self.parameters = function_parameters(fn)
        self.name = name or fn.__name__
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", self.name):
            raise ValueError(f"@tool(name=...): expected letters, digits, '_', '.' or '-' (max 64), got {self.name!r}")
        self.description = description if description is not None else doc_description
        self.timeout_s = timeout_s
        self.fn = fn
        self._is_async = inspect.iscoroutinefunction(fn)

    def schema(self) -> dict[str, Any]:
        return tool_schema(self)

    async def __call__(self, **arguments: Any) -> ToolResult:
        failures = validate_arguments(self.name, arguments, self.parameters)
        if failures:
            return ToolResult.from_failures(failures)
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
        return ToolResult(_as_content(value), metrics={"duration_s": time.monotonic() - start})

    def __repr__(self) -> str:
        return f"FunctionTool(name={self.name!r}, timeout_s={self.timeout_s})"


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(*, name: str | None = None, description: str | None = None,
         timeout_s: float | None = 30.0) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
         timeout_s: float | None = 30.0) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turns a typed, documented function into a :class:`FunctionTool` (``@tool`` or ``@tool(...)``)."""
    if fn is not None:
        return FunctionTool(fn, name=name, description=description, timeout_s=timeout_s)

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description, timeout_s=timeout_s)

    return wrap


def validate_call(t: Tool, arguments: Mapping[str, Any]) -> list[ToolCallFailure]:
    """Schema validation of ``arguments`` for any tool (what ``FunctionTool`` does before calling)."""
    return validate_arguments(t.name, arguments, t.parameters)
