"""Typed tool-call parsing of a sampled assistant turn, in the Qwen JSON and XML formats.

``format="json"`` reads Qwen3/hermes calls (``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
SGLang parser ``qwen25``); ``format="xml"`` reads Qwen3-Coder/Qwen3.5 calls
(``<tool_call>\\n<function=N>\\n<parameter=k>\\nv\\n</parameter>\\n</function>\\n</tool_call>``,
SGLang parser ``qwen3_coder``), converting each value by the tool's JSON schema as SGLang does.
The block, function and parameter boundaries follow those parsers (``_scan``, ``_attempts``,
``_xml``), and value conversion their type rules (``_values``).

By default the parser runs exactly the calls SGLang's parser for the format serves, with the same
argument values (docs/chat.md, "Serving parity"), and reports every call the model attempted:
each one ends up either in ``ParsedReply.calls`` or as typed ``ParsedReply.failures``
(malformed, unknown tool, unterminated, missing or ill-typed argument, empty call, text after the
call, too many calls). The contract:

- It never raises on any text or tool schema. (A ``tools`` argument that is not a list of named
  tools, an unknown ``format`` or a bad ``max_calls`` are caller bugs and raise
  ``TypeError``/``ValueError`` naming the field; a bad schema only turns validation off.)
- ``reasoning`` is the text inside ``<think>...</think>`` (``None`` when there is none); a
  completion that starts inside the block (only ``</think>``, as after Qwen3.5's generation
  prompt) has everything before ``</think>`` as reasoning. Calls inside reasoning are not calls.
- ``content`` is the text outside reasoning and call blocks, stripped at its ends. The turn ends
  at the first ``<|im_end|>``/``<|endoftext|>``: those markers and anything after them are not content.
- Accepted calls get deterministic ids ``call_0``, ``call_1``, ... and their span in the text.
- A defect SGLang lets through (text after a call, a missing ``arguments`` key, an unterminated
  parameter or last block, a broken closing tag, stray text...) leaves the call running and is
  reported as a failure with ``tolerated=True`` and the call's ``call_id``. ``strict=True``
  rejects those calls instead (and reports nothing as tolerated).
- With ``tools=None`` every name is accepted and nothing is validated; XML values stay strings
  (except ``null``). With tools, an unknown name is an ``unknown_tool`` failure, not a call.

Example::

    >>> reply = parse_tool_calls('<tool_call>\\n{"name": "calc", "arguments": {"code": "1+1"}}\\n</tool_call>')
    >>> reply.calls[0].name, reply.calls[0].arguments, reply.calls[0].id
    ('calc', {'code': '1+1'}, 'call_0')
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, Protocol

import orjson

from agentrl.chat._attempts import Attempt, json_attempts
from agentrl.chat._scan import CALL_OPEN, FUNCTION_OPEN, JSON_OPEN, Finder, Region, scan, turn_end
from agentrl.chat._values import conversion_properties, normalize_schema_types, xml_value
from agentrl.chat._xml import block_attempts, dropped_attempt, fallback_attempts
from agentrl.chat.schema import tool_name, usable_schema, validate_arguments
from agentrl.chat.template import decode_keeping_special_tokens
from agentrl.chat.types import FailureKind, ParsedReply, ToolCall, ToolCallFailure

__all__ = ["FORMATS", "CallFormat", "parse_token_ids", "parse_tool_calls"]

CallFormat = Literal["json", "xml"]
FORMATS: tuple[str, ...] = ("json", "xml")


@dataclass(frozen=True)
class _ToolSpec:
    name: str
    schema: dict[str, Any] | None  # normalised and valid, or None: nothing is validated
    properties: dict[str, Any]  # where XML values look their type up (SGLang's rule)
    required: tuple[str, ...]


def _tool_spec(tool: Any) -> _ToolSpec:
    """A tool's name (a caller bug raises) and what its schema allows (a bad schema never raises)."""
    raw: Any
    if isinstance(tool, Mapping):
        name = tool_name(tool)
        raw = tool.get("function", tool).get("parameters")
    else:
        attr_name, raw = getattr(tool, "name", None), getattr(tool, "parameters", None)
        if not isinstance(attr_name, str) or not attr_name:
            raise TypeError("expected an OpenAI tool dict or an object with 'name' and 'parameters', "
                            f"got {type(tool).__name__}: {tool!r:.200}")
        name = attr_name
    try:
        key = json.dumps(raw, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return _spec(name, raw)
    return _cached_spec(name, key)


@lru_cache(maxsize=256)
def _cached_spec(name: str, schema_json: str) -> _ToolSpec:
    return _spec(name, json.loads(schema_json))


def _spec(name: str, raw: Any) -> _ToolSpec:
    schema = usable_schema(name, raw)
    required = (schema or {}).get("required")
    return _ToolSpec(name, schema, conversion_properties(normalize_schema_types(raw)),
                     tuple(r for r in required if isinstance(r, str)) if isinstance(required, list) else ())


def _cached_tool_specs(tools: Iterable[Any] | None) -> dict[str, _ToolSpec] | None:
    """:func:`_tool_specs`, memoised by the tools' JSON: every episode of a run lists the same tools, and
    building the specs costs more than parsing a short turn. Specs are never mutated."""
    if tools is None or not isinstance(tools, (list, tuple)):
        return _tool_specs(tools)
    try:
        key = orjson.dumps(tools)
    except TypeError:  # tool objects rather than dicts
        return _tool_specs(tools)
    return _specs_of_json(key)


@functools.lru_cache(maxsize=256)
def _specs_of_json(key: bytes) -> dict[str, _ToolSpec] | None:
    return _tool_specs(orjson.loads(key))


def _tool_specs(tools: Iterable[Any] | None) -> dict[str, _ToolSpec] | None:
    if tools is None:
        return None
    if isinstance(tools, (Mapping, str, bytes)):
        raise TypeError(f"tools: expected a list of tools, got {type(tools).__name__}")
    specs: dict[str, _ToolSpec] = {}
    for i, tool in enumerate(tools):
        try:
            spec = _tool_spec(tool)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"tools[{i}]: {exc}") from exc
        if spec.name in specs:
            raise ValueError(f"tools[{i}]: duplicate tool name {spec.name!r}; expected unique names")
        specs[spec.name] = spec
    return specs


# (kind, message, argument, tolerated)
_Problem = tuple[FailureKind, str, "str | None", bool]


def _typed_arguments(att: Attempt, spec: _ToolSpec | None) -> tuple[dict[str, Any], list[_Problem]]:
    """Converts XML values as SGLang does, validates, and notes calls whose required arguments are all blank.

    A coerced value (a boolean that was neither true nor false) is tolerated unless validation
    fails on the same argument; so is an XML ``null`` for a parameter whose schema does not allow
    null (SGLang's ``qwen3_coder`` serves ``null`` for every type: the call runs with ``None``); a
    value JSON cannot carry and every other validation failure are fatal.
    """
    problems: list[_Problem] = []
    notes: dict[str, str] = {}
    nulls: set[str] = set()  # XML parameters written as null: served as None whatever their type
    args = att.arguments
    name = att.name or ""
    if att.xml:
        props = spec.properties if spec is not None else {}
        args = {}
        for key, raw in att.arguments.items():
            out = xml_value(raw, key, props)
            args[key] = out.value
            if out.value is None and key in props:
                nulls.add(key)
            if out.note is not None and out.fatal:
                problems.append((FailureKind.INVALID_ARGUMENT_TYPE, f"{name}: argument {key!r}: {out.note}", key, False))
            elif out.note is not None:
                notes[key] = f"{name}: argument {key!r}: {out.note}"
    if spec is None or spec.schema is None:
        return args, problems + [(FailureKind.INVALID_ARGUMENT_TYPE, m, k, True) for k, m in notes.items()]
    failed = {p[2] for p in problems}
    for f in validate_arguments(spec.name, args, spec.schema):
        if f.argument is not None and f.argument in failed:
            continue
        if f.argument in nulls and f.kind is FailureKind.INVALID_ARGUMENT_TYPE:
            problems.append((f.kind, f"{f.message}; served as null, as SGLang's qwen3_coder serves it", f.argument,
                             True))
            continue
        message = f"{notes.pop(f.argument)}; {f.message}" if f.argument in notes else f.message
        problems.append((f.kind, message, f.argument, False))
    problems += [(FailureKind.INVALID_ARGUMENT_TYPE, m, k, True) for k, m in notes.items()]
    if (not any(not p[3] for p in problems) and spec.required
            and all(isinstance(args.get(r), str) and not args[r].strip() for r in spec.required)):
        problems.append((FailureKind.EMPTY_CALL,
                         f"{name}: every required argument is blank ({', '.join(spec.required)})", None, True))
    return args, problems


def _merge(problems: list[_Problem]) -> list[_Problem]:
    """One entry per kind, argument and tolerance, distinct messages joined in order of appearance."""
    merged: dict[tuple[FailureKind, str | None, bool], list[str]] = {}
    for kind, message, argument, tolerated in problems:
        if message not in merged.setdefault((kind, argument, tolerated), []):
            merged[(kind, argument, tolerated)].append(message)
    return [(kind, "; ".join(messages), argument, tol) for (kind, argument, tol), messages in merged.items()]


def _problems(att: Attempt, specs: dict[str, _ToolSpec] | None) -> tuple[dict[str, Any], list[_Problem]]:
    problems: list[_Problem] = [(k, m, None, False) for k, m in att.fatal]
    problems += [(k, m, None, True) for k, m in att.tolerated]
    if att.name is None or att.fatal:
        return {}, problems
    spec = specs.get(att.name) if specs is not None else None
    if specs is not None and spec is None:
        available = ", ".join(sorted(specs)) or "none"
        problems.append((FailureKind.UNKNOWN_TOOL,
                         f"tool {att.name!r:.200} is not available (available: {available:.500})", None, False))
        return {}, problems
    args, arg_problems = _typed_arguments(att, spec)
    return args, problems + arg_problems


def _settle(text: str, attempts: list[Attempt], specs: dict[str, _ToolSpec] | None, strict: bool,
            max_calls: int | None) -> tuple[list[ToolCall], list[ToolCallFailure]]:
    """Turns attempts into accepted calls (ids ``call_0``...) and typed failures.

    A call runs when it has no fatal problem (strict: no problem at all); its tolerated problems
    are reported with its ``call_id`` and ``tolerated=True``. A rejected call reports every problem.
    """
    calls: list[ToolCall] = []
    failures: list[ToolCallFailure] = []
    for att in attempts:
        args, problems = _problems(att, specs)
        if strict:
            problems = [(k, m, a, False) for k, m, a, _ in problems]
        call_id = None
        if not any(not p[3] for p in problems):
            if max_calls is not None and len(calls) >= max_calls:
                problems.append((FailureKind.TOO_MANY_CALLS,
                                 f"{att.name}: more than max_calls={max_calls} calls in one turn", None, False))
            else:
                call_id = f"call_{len(calls)}"
                calls.append(ToolCall(name=att.name or "", arguments=args, id=call_id, span=att.span))
        if call_id is None:  # rejected: every problem counts, one failure per kind and argument
            problems = [(k, m, a, False) for k, m, a, _ in problems]
        raw = text[att.span[0]:att.span[1]]
        for kind, message, argument, tolerated in _merge(problems):
            failures.append(ToolCallFailure(kind, message, raw, att.span, att.name, argument,
                                            call_id=call_id, tolerated=tolerated))
    return calls, failures


def _xml_attempts(text: str, regions: list[Region]) -> tuple[list[Attempt], list[Region]]:
    """SGLang's qwen3_coder reading: complete blocks only, else everything from the first call tag."""
    finder = Finder(text)
    blocks = [r for r in regions if r.kind == "call"]
    if any(r.closed for r in blocks):
        attempts: list[Attempt] = []
        for r in regions:
            if r.kind == "call" and r.closed:
                attempts.extend(block_attempts(text, finder, r))
            elif r.kind in ("call", "function"):
                attempts.append(dropped_attempt(text, r, "SGLang reads only complete blocks when the turn has one"))
        return attempts, regions
    first = next((r for r in regions if r.kind in ("call", "function")), None)
    if blocks and first is not None and text.find(FUNCTION_OPEN, first.start) != -1:
        fallback = fallback_attempts(text, finder, first.start, blocks[0].start)
        if fallback:
            kept = [r for r in regions if r.end <= first.start]
            return fallback, [*kept, Region("call", first.start, len(text), first.start, len(text), False)]
    reason = "a turn without <tool_call> has no calls for SGLang"
    return [dropped_attempt(text, r, reason) for r in regions if r.kind in ("call", "function")], regions


def _attempts(text: str, regions: list[Region], xml: bool) -> tuple[list[Attempt], list[Region]]:
    if xml:
        return _xml_attempts(text, regions)
    attempts: list[Attempt] = []
    for region in regions:
        if region.kind == "call":
            attempts.extend(json_attempts(text, region))
    return attempts, regions


def _text_after_call(text: str, gaps: list[tuple[int, int]], tolerated: bool) -> list[ToolCallFailure]:
    out = []
    for start, end in gaps:
        piece = text[start:end]
        if piece.strip():
            s = start + len(piece) - len(piece.lstrip())
            e = start + len(piece.rstrip())
            out.append(ToolCallFailure(
                FailureKind.TEXT_AFTER_CALL,
                f"text after a tool call (the format expects nothing after the calls): {text[s:e]!r:.120}",
                text[s:e], (s, e), tolerated=tolerated))
    return out


def _check_options(text: Any, format: str, max_calls: Any) -> None:
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    if format not in FORMATS:
        raise ValueError(f"format: expected one of {FORMATS}, got {format!r}")
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 0):
        raise ValueError(f"max_calls: expected None or an int >= 0, got {max_calls!r}")


def parse_tool_calls(text: str, format: CallFormat = "json", tools: Iterable[Any] | None = None, *,
                     strict: bool = False, max_calls: int | None = None) -> ParsedReply:
    """Parses one sampled assistant turn into content, reasoning, calls and typed failures.

    ``tools`` are OpenAI tool dicts (``{"type": "function", "function": {...}}`` or flat) or
    objects with ``name`` and ``parameters``; ``None`` accepts every name. ``max_calls`` caps the
    accepted calls per turn (the rest become ``too_many_calls`` failures). See the module doc for
    the full contract.
    """
    _check_options(text, format, max_calls)
    xml = format == "xml"
    turn = text[:turn_end(text)]
    specs = _cached_tool_specs(tools)
    attempts, regions = _attempts(turn, scan(turn, xml), xml)
    content: list[str] = []
    reasoning: list[str] = []
    gaps_after_call: list[tuple[int, int]] = []
    pos = 0
    seen_call = False
    for region in [*regions, Region("end", len(turn), len(turn), len(turn), len(turn), True)]:
        content.append(turn[pos:region.start])
        if seen_call:
            gaps_after_call.append((pos, region.start))
        if region.kind == "think":
            reasoning.append(turn[region.body_start:region.body_end].strip())
        elif region.kind in ("call", "function"):
            seen_call = True
        pos = region.end
    calls, failures = _settle(turn, attempts, specs, strict, max_calls)
    failures += _text_after_call(turn, gaps_after_call, tolerated=not strict)
    failures.sort(key=lambda f: f.span[0])
    text = "".join(content).strip()
    written = _content_as_written(turn, regions, calls)
    unstripped = _outside_reasoning(turn, regions)
    outside = unstripped.strip()
    # where SGLang's parser says a call starts, looked for before stripping: a turn ending in the
    # JSON marker's own newline ("<tool_call>\n") starts one
    cut = unstripped.find(CALL_OPEN if xml else JSON_OPEN)
    served = outside if cut < 0 else unstripped[:cut].strip()
    return ParsedReply(content=text, reasoning="\n\n".join(reasoning) if reasoning else None,
                       calls=calls, failures=failures, message_content=None if written == text else written,
                       text=None if outside == text else outside, served=None if served == text else served)


def _outside_reasoning(turn: str, regions: list[Region]) -> str:
    """The turn without its reasoning blocks (what SGLang's reasoning parser leaves), not stripped."""
    pieces: list[str] = []
    pos = 0
    for region in regions:
        if region.kind == "think":
            pieces.append(turn[pos:region.start])
            pos = region.end
    pieces.append(turn[pos:])
    return "".join(pieces)


def _content_as_written(turn: str, regions: list[Region], calls: list[ToolCall]) -> str:
    """The text outside reasoning and accepted calls: a call block nothing was accepted from stays in
    place, so the assistant message re-renders to what the model wrote (see ``ParsedReply.message_content``)."""
    accepted = [c.span[0] for c in calls if c.span is not None]
    pieces: list[str] = []
    pos = 0
    for region in regions:
        if region.kind == "think" or any(region.start <= start < region.end for start in accepted):
            pieces.append(turn[pos:region.start])
            pos = region.end
    pieces.append(turn[pos:])
    return "".join(pieces).strip()


class TokenDecoder(Protocol):
    """What :func:`parse_token_ids` needs of a tokenizer (any Hugging Face tokenizer fits)."""

    def decode(self, token_ids: Any, **kwargs: Any) -> str: ...


def parse_token_ids(token_ids: Sequence[int], tokenizer: TokenDecoder, format: CallFormat = "json",
                    tools: Iterable[Any] | None = None, *, strict: bool = False,
                    max_calls: int | None = None) -> ParsedReply:
    """:func:`parse_tool_calls` on sampled ids, decoded with ``skip_special_tokens=False``.

    Special tokens must stay in the text: ``<|im_end|>`` marks the end of the turn, and the
    tool and think tags are what the parser looks for. Spans index the decoded text. The same
    decode as :meth:`ChatTemplate.parse` on ids, for callers that have a tokenizer but no template.
    """
    text = decode_keeping_special_tokens(tokenizer, token_ids)
    return parse_tool_calls(text, format, tools, strict=strict, max_calls=max_calls)
