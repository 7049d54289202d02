"""Reading call attempts out of JSON (qwen25 / hermes) call blocks (internal to the parser).

An :class:`Attempt` is one call the model tried to make, before the tool list and schemas are
consulted: its span, its name (if one could be read), its arguments (typed for JSON, raw strings
for XML) and its defects. ``fatal`` defects make the call unusable (SGLang does not run it either);
``tolerated`` defects are those SGLang's parser accepts silently (a missing ``arguments`` key,
several calls in one block, an unterminated parameter...), which the default parse accepts while
still reporting them and a strict parse rejects. The XML reader is in :mod:`agentrl.chat._xml`.

The JSON rules are SGLang's ``qwen25`` rules: a block is ``<tool_call>\\n ... \\n</tool_call>``, its
body is one JSON object or a list of them, the arguments are ``parameters`` when that key holds a
non-empty value and ``arguments`` otherwise (``{}`` when there is neither).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat._scan import Region
from agentrl.chat.schema import _reject_constant, json_value
from agentrl.chat.types import FailureKind

SHOW = 120  # characters of model text quoted in a message
Defect = tuple[FailureKind, str]


@dataclass
class Attempt:
    """One call attempt; ``arguments`` hold raw strings when ``xml`` is true."""

    span: tuple[int, int]
    name: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    xml: bool = False
    fatal: list[Defect] = field(default_factory=list)
    tolerated: list[Defect] = field(default_factory=list)


def _loads(raw: str) -> tuple[Any, str | None]:
    """Strict JSON (no NaN/Infinity, no raw control characters in strings), never raising."""
    try:
        return json_value(json.loads(raw, parse_constant=_reject_constant)), None
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as exc:
        return None, str(exc)


def _arguments(obj: dict[str, Any], att: Attempt) -> None:
    """SGLang's choice: ``parameters`` if it holds a non-empty value, else ``arguments``, else ``{}``."""
    params = obj.get("parameters")
    key, args = ("parameters", params) if params else ("arguments", obj.get("arguments", {}))
    if key not in obj and "parameters" not in obj:
        att.tolerated.append((FailureKind.MALFORMED_JSON,
                              f"{att.name}: the call object has no 'arguments' (keys: {sorted(obj)!r:.{SHOW}}); "
                              "it runs with no arguments, as SGLang runs it"))
    if not isinstance(args, dict):
        hint = " (SGLang passes a string on as a JSON string, which no tool can take)" if isinstance(args, str) else ""
        att.fatal.append((FailureKind.MALFORMED_JSON,
                          f"{att.name}: '{key}' must be an object, got {type(args).__name__}: {args!r:.{SHOW}}{hint}"))
        return
    att.arguments = args


def _call_object(obj: Any, span: tuple[int, int], body: str) -> Attempt:
    att = Attempt(span=span)
    if not isinstance(obj, dict):
        att.fatal.append((FailureKind.MALFORMED_JSON,
                          f"call body must be a JSON object, got {type(obj).__name__}: {body!r:.{SHOW}}"))
        return att
    name = obj.get("name")
    if not isinstance(name, str):
        att.fatal.append((FailureKind.MALFORMED_JSON, f"call object needs a 'name' string, got {name!r:.{SHOW}}"))
        return att
    if not name.strip():
        att.fatal.append((FailureKind.EMPTY_CALL, "call has an empty function name"))
        return att
    att.name = name
    _arguments(obj, att)
    return att


def _list_spans(body: str, offset: int, count: int) -> list[int] | None:
    """Start offsets of the ``count`` elements of the JSON list ``body`` (which is valid JSON)."""
    decoder = json.JSONDecoder()
    starts: list[int] = []
    i = body.index("[") + 1
    try:
        for _ in range(count):
            while body[i] in " \t\r\n,":
                i += 1
            starts.append(offset + i)
            _, i = decoder.raw_decode(body, i)
    except (ValueError, IndexError, RecursionError):
        return None
    return starts


def _list_attempts(items: list[Any], text: str, region: Region) -> list[Attempt]:
    """A block whose body is a JSON list: SGLang reads each element as one call."""
    if not items:
        return [Attempt(span=(region.start, region.end), fatal=[(FailureKind.EMPTY_CALL, "the call list is empty")])]
    body = text[region.body_start:region.body_end]
    starts = _list_spans(body, region.body_start, len(items))
    bounds = [region.start, *starts[1:], region.end] if starts else [region.start, region.end]
    attempts = []
    for i, obj in enumerate(items):
        span = (bounds[i], bounds[i + 1]) if starts else (region.start, region.end)
        att = _call_object(obj, span, text[span[0]:span[1]].strip())
        att.tolerated.append((FailureKind.MALFORMED_JSON, f"{len(items)} calls written as one JSON list in one "
                                                          "<tool_call> block (one block per call is the format)"))
        if not starts and i:  # element positions unknown: only the first element is read
            att.fatal.append((FailureKind.MALFORMED_JSON, "the call list could not be split into its elements"))
        attempts.append(att)
    return attempts


def json_attempts(text: str, region: Region) -> list[Attempt]:
    """Reads the call(s) inside one ``<tool_call>`` block, as SGLang's ``qwen25`` parser does."""
    span = (region.start, region.end)
    body = text[region.body_start:region.body_end].strip()
    if not region.framed:
        return [Attempt(span=span, fatal=[(FailureKind.MALFORMED_JSON,
                                           "<tool_call> must be followed by a newline (the format is "
                                           "<tool_call>\\n{...}\\n</tool_call>); SGLang does not read this block")])]
    if not region.closed:
        if not body:
            return [Attempt(span=span, fatal=[(FailureKind.UNTERMINATED, "<tool_call> has no closing </tool_call>")])]
        message = ("<tool_call> is closed by </tool_call> without the newline before it; SGLang does not read "
                   "this block" if "</tool_call>" in body else "<tool_call> has no closing \\n</tool_call>")
        return [Attempt(span=span, fatal=[(FailureKind.UNTERMINATED if "</tool_call>" not in body
                                           else FailureKind.MALFORMED_JSON, message)])]
    if not body:
        return [Attempt(span=span, fatal=[(FailureKind.EMPTY_CALL, "<tool_call> block is empty")])]
    obj, err = _loads(body)
    if err is not None:
        return [Attempt(span=span, fatal=[(FailureKind.MALFORMED_JSON,
                                           f"call body is not valid JSON ({err}): {body!r:.{SHOW}}")])]
    if isinstance(obj, list):
        return _list_attempts(obj, text, region)
    return [_call_object(obj, span, body)]
