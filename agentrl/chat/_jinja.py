"""The Jinja environment and input normalisation that Hugging Face ``apply_chat_template`` uses.

A chat template only renders byte-identically to Hugging Face when three things match:

- the environment: ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with
  the ``loopcontrols`` extension and a ``{% generation %}`` tag that renders its body unchanged,
  ``keep_trailing_newline`` off;
- the helpers: a ``tojson`` filter that is plain ``json.dumps`` (non-ASCII kept, keys in insertion
  order, ``", "``/``": "`` separators, no HTML escaping; Jinja's own filter sorts keys and escapes
  ``< > & '``), and the globals ``raise_exception``, ``strftime_now`` and ``namespace``;
- the inputs: message and tool objects turned into plain JSON-like dicts and lists, keys whose
  value is ``None`` dropped from messages and tool-call entries (so ``content=None`` is undefined
  to the template, never the text ``None``), and the reasoning aliases resolved.

Nothing here is specific to one model; :mod:`agentrl.chat.template` builds on it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agentrl.chat.types import REASONING_KEYS

__all__ = ["compile_template", "normalize_messages", "normalize_tools", "to_plain"]


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body unchanged (Hugging Face uses it
    to mark assistant spans for masks; agentrl derives masks from token provenance instead)."""

    tags = {"generation"}  # noqa: RUF012 - Jinja reads this class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_passthrough"), [], [], body).set_lineno(lineno)

    def _passthrough(self, caller: Any) -> str:
        return str(caller())


class _Namespace(jinja2.utils.Namespace):
    """Jinja's ``namespace`` that refuses attribute names starting with an underscore."""

    def __setitem__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace: attribute {name!r} may not start with '_'")
        super().__setitem__(name, value)


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


# json.dumps builds a new encoder whenever an argument differs from its defaults (ensure_ascii does):
# the one a template asks for on every tool call is built once.
_PLAIN_JSON = json.JSONEncoder(ensure_ascii=False)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    if not ensure_ascii and indent is None and separators is None and not sort_keys:
        return _PLAIN_JSON.encode(value)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Sandbox(ImmutableSandboxedEnvironment):
    """Hugging Face's sandbox, its attribute verdicts remembered.

    Whether ``obj.attr`` is safe depends only on the object's type and the attribute's name (Jinja
    reads the name and ``isinstance`` of the object against fixed types), and a template asks the
    same few (``loop.first``, ``text.startswith``) for every message of every render. Objects whose
    ``__class__`` is not their type are judged afresh each time.
    """

    _MAX_VERDICTS = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        cls = type(obj)
        if obj.__class__ is not cls:
            return super().is_safe_attribute(obj, attr, value)
        key = (cls, attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = super().is_safe_attribute(obj, attr, value)
            if len(self._verdicts) < self._MAX_VERDICTS:
                self._verdicts[key] = verdict
        return verdict


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compiles ``source`` in the Hugging Face-equivalent environment (cached by text)."""
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


_SCALARS = frozenset({str, bool, int, float})  # exact types; subclasses take the general path, to the same end


def to_plain(value: Any, where: str) -> Any:
    """Rebuilds ``value`` from plain JSON-like types: dicts (string keys), lists, str, int, float,
    bool and None. Dataclasses and pydantic models become dicts, tuples become lists.

    Raises ``TypeError`` naming ``where`` for anything else (sets, bytes, arbitrary objects), so a
    value never reaches a template as its Python ``repr`` by accident.
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if type(value) is not dict and type(value) is not list:  # plain containers (every message a loop builds) skip the probes
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            if hasattr(value, "to_dict"):
                return to_plain(value.to_dict(), where)
            return to_plain(dataclasses.asdict(value), where)
        model_dump = getattr(value, "model_dump", None)
        if callable(model_dump):
            return to_plain(model_dump(), where)
    # An item's path is spelled out only for items that are not plain scalars themselves.
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: keys must be strings, got {type(key).__name__} {key!r:.80}")
            out[key] = item if item is None or type(item) in _SCALARS else to_plain(item, f"{where}.{key}")
        return out
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [item if item is None or type(item) in _SCALARS else to_plain(item, f"{where}[{i}]")
                for i, item in enumerate(value)]
    raise TypeError(f"{where}: expected JSON-like data (dict, list, str, number, bool, None), "
                    f"got {type(value).__name__}: {value!r:.120}")


def _drop_none(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if v is not None}


def _normalize_message(message: Any, index: int) -> dict[str, Any]:
    plain = to_plain(message, f"messages[{index}]")
    if not isinstance(plain, dict):
        raise TypeError(f"messages[{index}]: expected a message object or dict, got {type(message).__name__}: "
                        f"{message!r:.120}")
    msg = _drop_none(plain)
    reasoning = next((plain[k] for k in REASONING_KEYS if plain.get(k) is not None), None)
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
        msg.setdefault("thinking", reasoning)
    calls = msg.get("tool_calls")
    if isinstance(calls, list):
        fixed: list[Any] = []
        for call in calls:
            if isinstance(call, dict):
                call = _drop_none(call)
                if isinstance(call.get("function"), dict):
                    call["function"] = _drop_none(call["function"])
            fixed.append(call)
        msg["tool_calls"] = fixed
    return msg


def normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Messages (``Message`` objects, dataclasses, pydantic models or dicts) as plain dicts.

    Keys whose value is None are dropped from each message, each tool-call entry and its
    ``function`` (values inside ``arguments`` are kept: ``None`` is a real argument value). The
    first non-None of ``reasoning_content``, ``thinking``, ``reasoning`` is copied to
    ``reasoning_content`` and, unless already set, to ``thinking``.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages: expected a list of messages, got {type(messages).__name__}: {messages!r:.120}")
    if len(messages) == 0:
        raise ValueError("messages: expected at least one message, got an empty list")
    return [_normalize_message(m, i) for i, m in enumerate(messages)]


def _tool_schema(tool: Any, index: int) -> Any:
    if isinstance(tool, Mapping):
        return tool
    for method in ("to_openai", "openai_schema", "schema", "to_dict"):
        fn = getattr(tool, method, None)
        if callable(fn):
            return fn()
    raise TypeError(f"tools[{index}]: expected an OpenAI function dict or an object with to_openai()/schema(), "
                    f"got {type(tool).__name__}: {tool!r:.120}")


def normalize_tools(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """Tools as OpenAI function dicts (``{"type": "function", "function": {...}}``), or None.

    Accepts dicts and objects with ``to_openai()``, ``openai_schema()``, ``schema()`` or
    ``to_dict()``. Dict contents are passed on as given (apart from becoming plain data), because
    templates print schemas verbatim.
    """
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools: expected a list of tool schemas, got {type(tools).__name__}: {tools!r:.120}")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        schema = to_plain(_tool_schema(tool, i), f"tools[{i}]")
        if not isinstance(schema, dict):
            raise TypeError(f"tools[{i}]: expected the schema to be an object, got {type(schema).__name__}")
        out.append(schema)
    return out
