"""Reading call attempts out of call regions, in the JSON (hermes) and XML (qwen3_coder) formats.

An :class:`Attempt` is one call the model tried to make, before the tool list and schemas are
consulted: its span, its name (if one could be read), its arguments (typed for JSON, raw strings
for XML) and its defects. ``fatal`` defects make the call unusable; ``tolerated`` defects are those
the engines accept silently (an unterminated parameter, function or block, stray text), which a
lenient parse accepts while still reporting them and a strict parse rejects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat._scan import (
    FUNCTION_CLOSE,
    FUNCTION_OPEN,
    PARAMETER_CLOSE,
    PARAMETER_OPEN,
    Finder,
    Region,
)
from agentrl.chat.schema import _reject_constant, json_value
from agentrl.chat.types import FailureKind

_SHOW = 120  # characters of model text quoted in a message


@dataclass
class Attempt:
    """One call attempt; ``arguments`` hold raw strings when ``xml`` is true."""

    span: tuple[int, int]
    name: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    xml: bool = False
    fatal: list[tuple[FailureKind, str]] = field(default_factory=list)
    tolerated: list[tuple[FailureKind, str]] = field(default_factory=list)


def _loads(raw: str) -> tuple[Any, str | None]:
    """Strict JSON (no NaN/Infinity, no raw control characters in strings), never raising."""
    try:
        return json_value(json.loads(raw, parse_constant=_reject_constant)), None
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as exc:
        return None, str(exc)


def _decode_arguments(obj: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The call object's ``arguments`` (or ``parameters``) as a dict, decoding a JSON string once."""
    key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
    if key is None:
        return None, f"the call object has no 'arguments' (keys: {sorted(obj)!r:.{_SHOW}})"
    args = obj[key]
    if isinstance(args, str):
        if not args.strip():
            return {}, None
        decoded, err = _loads(args)
        if err is not None:
            return None, f"'{key}' is a string that is not JSON ({err}): {args!r:.{_SHOW}}"
        args = decoded
    if not isinstance(args, dict):
        return None, f"'{key}' must be an object, got {type(args).__name__}: {args!r:.{_SHOW}}"
    return args, None


def json_attempt(text: str, region: Region) -> Attempt:
    """Reads ``{"name": ..., "arguments": {...}}`` inside one ``<tool_call>`` block."""
    att = Attempt(span=(region.start, region.end))
    body = text[region.body_start:region.body_end].strip()
    unterminated = (FailureKind.UNTERMINATED, "<tool_call> has no closing </tool_call>")
    if not body:
        att.fatal.append(unterminated if not region.closed else (FailureKind.EMPTY_CALL, "<tool_call> block is empty"))
        return att
    obj, err = _loads(body)
    if err is not None:
        if region.closed:
            att.fatal.append((FailureKind.MALFORMED_JSON, f"call body is not valid JSON ({err}): {body!r:.{_SHOW}}"))
        else:
            att.fatal.append((FailureKind.UNTERMINATED, f"{unterminated[1]} and its body is incomplete ({err})"))
        return att
    if not region.closed:
        att.tolerated.append(unterminated)
    if not isinstance(obj, dict):
        att.fatal.append((FailureKind.MALFORMED_JSON,
                          f"call body must be a JSON object, got {type(obj).__name__}: {body!r:.{_SHOW}}"))
        return att
    name = obj.get("name")
    if not isinstance(name, str):
        att.fatal.append((FailureKind.MALFORMED_JSON, f"call object needs a 'name' string, got {name!r:.{_SHOW}}"))
        return att
    if not name.strip():
        att.fatal.append((FailureKind.EMPTY_CALL, "call has an empty function name"))
        return att
    att.name = name
    args, err = _decode_arguments(obj)
    if err is not None:
        att.fatal.append((FailureKind.MALFORMED_JSON, f"{name}: {err}"))
    else:
        att.arguments = args or {}
    return att


def _unframe(value: str) -> str:
    """Drops exactly one framing newline on each side; never more (code keeps its whitespace)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _stray(att: Attempt, text: str, start: int, end: int, where: str) -> None:
    stray = text[start:end].strip()
    if stray:
        att.tolerated.append((FailureKind.MALFORMED_XML, f"text outside {where}: {stray!r:.{_SHOW}}"))


def _parameters(att: Attempt, text: str, finder: Finder, start: int, end: int) -> None:
    """Reads ``<parameter=NAME>value</parameter>`` items from ``text[start:end]`` into ``att``.

    A value ends at the first ``</parameter>``, next ``<parameter=``, or ``end`` (the function's
    closer or the end of the text), as in SGLang; the last two are reported as unterminated.
    """
    pos = start
    while True:
        p = finder.next(PARAMETER_OPEN, pos, end)
        _stray(att, text, pos, p if p != -1 else end, "<parameter=...>")
        if p == -1:
            return
        name_start = p + len(PARAMETER_OPEN)
        gt = finder.next(">", name_start, end)
        if gt == -1:
            kind = FailureKind.UNTERMINATED if end == len(text) else FailureKind.MALFORMED_XML
            att.tolerated.append((kind, f"parameter header not closed by '>': {text[p:end]!r:.{_SHOW}}"))
            return
        name = text[name_start:gt].strip()
        if not name or "<" in name or "\n" in name:
            att.tolerated.append((FailureKind.MALFORMED_XML, f"bad parameter name {text[name_start:gt]!r:.{_SHOW}}"))
            pos = name_start
            continue
        value_start = gt + 1
        close = finder.next(PARAMETER_CLOSE, value_start, end)
        nxt = finder.next(PARAMETER_OPEN, value_start, end)
        if close != -1 and (nxt == -1 or close < nxt):
            value_end, pos = close, close + len(PARAMETER_CLOSE)
        else:
            value_end = pos = nxt if nxt != -1 else end
            att.tolerated.append((FailureKind.UNTERMINATED, f"<parameter={name}> has no closing </parameter>"))
        if name in att.arguments:
            att.tolerated.append((FailureKind.MALFORMED_XML, f"parameter {name!r} given twice; the last value is used"))
        att.arguments[name] = _unframe(text[value_start:value_end])


def xml_function(text: str, finder: Finder, start: int, end: int) -> tuple[Attempt, int]:
    """Reads the ``<function=NAME>...</function>`` that starts at ``start``; returns it and where it ends."""
    att = Attempt(span=(start, end), xml=True)
    name_start = start + len(FUNCTION_OPEN)
    gt = finder.next(">", name_start, end)
    close = finder.next(FUNCTION_CLOSE, name_start, end)
    after = close + len(FUNCTION_CLOSE) if close != -1 else end
    if gt == -1:
        kind = FailureKind.UNTERMINATED if end == len(text) else FailureKind.MALFORMED_XML
        att.fatal.append((kind, f"function header not closed by '>': {text[start:end]!r:.{_SHOW}}"))
        return att, end
    raw_name = text[name_start:gt]
    if "<" in raw_name or "\n" in raw_name:
        # Resume right after "<function=" so that a well-formed call further on is still found.
        att.fatal.append((FailureKind.MALFORMED_XML, f"bad function name {raw_name!r:.{_SHOW}}"))
        att.span = (start, name_start)
        return att, name_start
    if not raw_name.strip():
        att.fatal.append((FailureKind.EMPTY_CALL, "call has an empty function name"))
        return att, after
    att.name = raw_name.strip()
    if close == -1:
        att.tolerated.append((FailureKind.UNTERMINATED, f"<function={att.name}> has no closing </function>"))
    _parameters(att, text, finder, gt + 1, close if close != -1 else end)
    return att, after


def xml_block(text: str, finder: Finder, region: Region) -> list[Attempt]:
    """Reads every ``<function=...>`` in one ``<tool_call>`` block (SGLang accepts several)."""
    attempts: list[Attempt] = []
    block_defects: list[tuple[FailureKind, str]] = []
    if not region.closed:
        block_defects.append((FailureKind.UNTERMINATED, "<tool_call> has no closing </tool_call>"))
    pos, end = region.body_start, region.body_end
    while True:
        f = finder.next(FUNCTION_OPEN, pos, end)
        stray = text[pos:f if f != -1 else end].strip()
        if stray:
            block_defects.append((FailureKind.MALFORMED_XML, f"text outside <function=...>: {stray!r:.{_SHOW}}"))
        if f == -1:
            break
        att, pos = xml_function(text, finder, f, end)
        attempts.append(att)
    if not attempts:
        att = Attempt(span=(region.start, region.end), xml=True)
        if not text[region.body_start:region.body_end].strip():
            att.fatal.append(block_defects[0] if block_defects else (FailureKind.EMPTY_CALL,
                                                                     "<tool_call> block is empty"))
        else:
            att.fatal.append((FailureKind.MALFORMED_XML, "no <function=NAME> inside <tool_call>"))
            att.fatal.extend(d for d in block_defects if d[0] is FailureKind.UNTERMINATED)
        return [att]
    # Spans tile the block: the first call starts at <tool_call>, the last ends after </tool_call>.
    starts = [region.start] + [a.span[0] for a in attempts[1:]]
    ends = [a.span[0] for a in attempts[1:]] + [region.end]
    for att, s, e in zip(attempts, starts, ends, strict=True):
        att.span = (s, e)
    attempts[-1].tolerated.extend(block_defects)
    return attempts


def xml_bare_function(text: str, finder: Finder, region: Region) -> Attempt:
    """A ``<function=...>`` written without the ``<tool_call>`` wrapper (vLLM accepts these)."""
    att, _ = xml_function(text, finder, region.start, region.end)
    att.span = (region.start, region.end)
    att.tolerated.append((FailureKind.MALFORMED_XML, "<function=...> outside a <tool_call> block"))
    return att
