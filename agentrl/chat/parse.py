"""Typed tool-call parsing of a sampled assistant turn, in the Qwen JSON and XML formats.

``format="json"`` reads Qwen3/hermes calls (``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
SGLang parser ``qwen25``); ``format="xml"`` reads Qwen3-Coder/Qwen3.5 calls
(``<tool_call>\\n<function=N>\\n<parameter=k>\\nv\\n</parameter>\\n</function>\\n</tool_call>``,
SGLang parser ``qwen3_coder``), converting each value by the tool's JSON schema as SGLang does.

Where the engines skip, drop or guess, this parser reports: every call the model attempted ends up
either in ``ParsedReply.calls`` or as typed ``ParsedReply.failures`` (malformed, unknown tool,
unterminated, missing or ill-typed argument, empty call, text after the call, too many calls).
The contract:

- It never raises on any text. (A malformed ``tools`` list, an unknown ``format`` or a bad
  ``max_calls`` are caller bugs and raise ``TypeError``/``ValueError`` naming the field.)
- ``reasoning`` is the text inside ``<think>...</think>`` (``None`` when there is none); a
  completion that starts inside the block (only ``</think>``, as after Qwen3.5's generation
  prompt) has everything before ``</think>`` as reasoning. Calls inside reasoning are not calls.
- ``content`` is the text outside reasoning and call blocks, stripped at its ends. The turn ends
  at the first ``<|im_end|>``/``<|endoftext|>``: those markers and anything after them are not content.
- Accepted calls get deterministic ids ``call_0``, ``call_1``, ... and their span in the text.
- Lenient mode (default) accepts what the engines accept (an unterminated parameter, function or
  ``<tool_call>`` block whose body is complete, stray text inside a block, a ``<function=>``
  without its ``<tool_call>`` wrapper) and still reports each such defect as a failure whose
  ``call_id`` names the accepted call. Strict mode rejects those calls.
- With ``tools=None`` every name is accepted and nothing is validated; XML values stay strings
  (except ``null``). With tools, an unknown name is an ``unknown_tool`` failure, not a call.

Example::

    >>> reply = parse_tool_calls('<tool_call>\\n{"name": "calc", "arguments": {"code": "1+1"}}\\n</tool_call>')
    >>> reply.calls[0].name, reply.calls[0].arguments, reply.calls[0].id
    ('calc', {'code': '1+1'}, 'call_0')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from agentrl.chat._attempts import Attempt, json_attempt, xml_bare_function, xml_block
from agentrl.chat._scan import Finder, Region, scan, turn_end
from agentrl.chat.schema import (
    check_parameters_schema,
    convert_xml_value,
    tool_name,
    tool_parameters,
    tool_properties,
    validate_arguments,
)
from agentrl.chat.template import decode_keeping_special_tokens
from agentrl.chat.types import FailureKind, ParsedReply, ToolCall, ToolCallFailure

__all__ = ["FORMATS", "CallFormat", "parse_token_ids", "parse_tool_calls"]

CallFormat = Literal["json", "xml"]
FORMATS: tuple[str, ...] = ("json", "xml")


@dataclass(frozen=True)
class _ToolSpec:
    name: str
    schema: dict[str, Any]
    properties: dict[str, Any]
    required: tuple[str, ...]


def _tool_spec(tool: Any) -> _ToolSpec:
    if isinstance(tool, Mapping):
        name, schema = tool_name(tool), tool_parameters(tool)
    else:
        attr_name, attr_schema = getattr(tool, "name", None), getattr(tool, "parameters", None)
        if not isinstance(attr_name, str) or not attr_name:
            raise TypeError("expected an OpenAI tool dict or an object with 'name' and 'parameters', "
                            f"got {type(tool).__name__}: {tool!r:.200}")
        if attr_schema is not None and not isinstance(attr_schema, Mapping):
            raise ValueError(f"tool {attr_name!r}: parameters: expected a JSON-schema object, "
                             f"got {attr_schema!r:.200}")
        name, schema = attr_name, dict(attr_schema or {})
    props, required = tool_properties({"name": name, "parameters": schema})
    check_parameters_schema(name, schema)
    return _ToolSpec(name, schema, props, tuple(required))


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


_Problem = tuple[FailureKind, str, str | None]


def _typed_arguments(att: Attempt, spec: _ToolSpec | None) -> tuple[dict[str, Any], list[_Problem]]:
    """Converts XML values by the schema, validates, and flags calls whose required arguments are all blank."""
    problems: list[_Problem] = []
    args = att.arguments
    failed: set[str] = set()
    name = att.name or ""
    if att.xml:
        props = spec.properties if spec is not None else {}
        args = {}
        for key, raw in att.arguments.items():
            args[key], err = convert_xml_value(raw, key, props)
            if err is not None:
                failed.add(key)
                problems.append((FailureKind.INVALID_ARGUMENT_TYPE, f"{name}: argument {key!r}: {err}", key))
    if spec is None:
        return args, problems
    for f in validate_arguments(spec.name, args, spec.schema):
        if f.argument is None or f.argument not in failed:
            problems.append((f.kind, f.message, f.argument))
    if (not problems and spec.required
            and all(isinstance(args.get(r), str) and not args[r].strip() for r in spec.required)):
        problems.append((FailureKind.EMPTY_CALL,
                         f"{name}: every required argument is blank ({', '.join(spec.required)})", None))
    return args, problems


def _merge(problems: list[_Problem]) -> list[_Problem]:
    """One entry per kind and argument, distinct messages joined in order of appearance."""
    merged: dict[tuple[FailureKind, str | None], list[str]] = {}
    for kind, message, argument in problems:
        if message not in merged.setdefault((kind, argument), []):
            merged[(kind, argument)].append(message)
    return [(kind, "; ".join(messages), argument) for (kind, argument), messages in merged.items()]


def _settle(text: str, attempts: list[Attempt], specs: dict[str, _ToolSpec] | None, strict: bool,
            max_calls: int | None) -> tuple[list[ToolCall], list[ToolCallFailure]]:
    """Turns attempts into accepted calls (ids ``call_0``...) and typed failures."""
    calls: list[ToolCall] = []
    failures: list[ToolCallFailure] = []
    for att in attempts:
        problems = _merge([(k, m, None) for k, m in att.fatal])
        tolerated = _merge([(k, m, None) for k, m in att.tolerated])
        if strict:
            problems += tolerated
            tolerated = []
        args: dict[str, Any] = {}
        if att.name is not None and not att.fatal:
            spec = specs.get(att.name) if specs is not None else None
            if specs is not None and spec is None:
                available = ", ".join(sorted(specs)) or "none"
                problems.append((FailureKind.UNKNOWN_TOOL,
                                 f"tool {att.name!r:.200} is not available (available: {available:.500})", None))
            else:
                args, arg_problems = _typed_arguments(att, spec)
                problems += arg_problems
        call_id = None
        if not problems:
            if max_calls is not None and len(calls) >= max_calls:
                problems.append((FailureKind.TOO_MANY_CALLS,
                                 f"{att.name}: more than max_calls={max_calls} calls in one turn", None))
            else:
                call_id = f"call_{len(calls)}"
                calls.append(ToolCall(name=att.name or "", arguments=args, id=call_id, span=att.span))
        if call_id is None:  # rejected: one failure per kind and argument
            problems = _merge(problems + tolerated)
            tolerated = []
        raw = text[att.span[0]:att.span[1]]
        for kind, message, argument in problems:
            failures.append(ToolCallFailure(kind, message, raw, att.span, att.name, argument))
        for kind, message, _ in tolerated:
            failures.append(ToolCallFailure(kind, message, raw, att.span, att.name, call_id=call_id))
    return calls, failures


def _attempts(text: str, regions: list[Region], xml: bool) -> list[Attempt]:
    finder = Finder(text)
    attempts: list[Attempt] = []
    for region in regions:
        if region.kind == "call":
            attempts.extend(xml_block(text, finder, region) if xml else [json_attempt(text, region)])
        elif region.kind == "function":
            attempts.append(xml_bare_function(text, finder, region))
    return attempts


def _text_after_call(text: str, gaps: list[tuple[int, int]]) -> list[ToolCallFailure]:
    out = []
    for start, end in gaps:
        piece = text[start:end]
        if piece.strip():
            s = start + len(piece) - len(piece.lstrip())
            e = start + len(piece.rstrip())
            out.append(ToolCallFailure(
                FailureKind.TEXT_AFTER_CALL,
                f"text after a tool call (the format expects nothing after the calls): {text[s:e]!r:.120}",
                text[s:e], (s, e)))
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
    specs = _tool_specs(tools)
    xml = format == "xml"
    turn = text[:turn_end(text)]
    regions = scan(turn, xml)
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
    calls, failures = _settle(turn, _attempts(turn, regions, xml), specs, strict, max_calls)
    failures += _text_after_call(turn, gaps_after_call)
    failures.sort(key=lambda f: f.span[0])
    text = "".join(content).strip()
    written = _content_as_written(turn, regions, calls)
    return ParsedReply(content=text, reasoning="\n\n".join(reasoning) if reasoning else None,
                       calls=calls, failures=failures, message_content=None if written == text else written)


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
