"""Property tests: the tool-call parser never raises and its output is well formed, on hostile text.

Each format gets 10,000 generated strings that mix random text with fragments of the call,
parameter and think tags, braces, quotes, newlines, NULs, huge numbers and complete valid calls.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.chat.parse import parse_tool_calls
from agentrl.chat.types import FailureKind, ParsedReply

CALC = {"type": "function", "function": {"name": "calc", "parameters": {
    "type": "object",
    "properties": {"code": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": "number"},
                   "ok": {"type": "boolean"}, "opts": {"type": "object"}, "items": {"type": "array"},
                   "mode": {"type": "string", "enum": ["a", "b"]}},
    "required": ["code"],
}}}

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>",
    "<function=", "<function=calc>", "<function=other>", "<function=>", "</function>",
    "<parameter=", "<parameter=code>", "<parameter=n>", "<parameter=x>", "<parameter=ok>",
    "<parameter=opts>", "<parameter=items>", "<parameter=mode>", "</parameter>",
    "<think>", "</think>", "<|im_end|>", "<|endoftext|>", "<|im_start|>",
    "{", "}", "[", "]", '"', "'", ":", ",", ">", "<", "=", "\\", "\n", "\n\n", " ", "\t", "\x00", "\ud7ff",
    '"name"', '"arguments"', '"parameters"', '"calc"', '{"name": "calc", "arguments": ', '{"code": "1"}',
    "null", "None", "true", "True", "NaN", "Infinity", "-inf", "1e999", "9" * 400, "0.5", "03106",
    "{'a': 1}", "[1, 2]",
    '<tool_call>{"name": "other", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "calc", "arguments": {"n": "x"}}</tool_call>',
    '<tool_call>{"name": "calc", "parameters": "{\\"code\\": \\"1\\"}"}</tool_call>',
    '<tool_call>{"name": "calc", "arguments": {"code": " "}}</tool_call>',
    '<tool_call>\n{"name": "calc", "arguments": {"code": "print(1)"}}\n</tool_call>',
    "<tool_call>\n<function=calc>\n<parameter=code>\nprint(1)\n</parameter>\n</function>\n</tool_call>",
]

# Generation cost dominates these tests, so strings are drawn as bytes indexing a table of
# fragments and characters (cheap for hypothesis to generate and shrink), or as plain random text.
_TABLE = FRAGMENTS + [chr(c) for c in range(32, 127)] + ["\x00", "\x01", "\x7f", "\r", "\u2028", "é", "✓", "日",
                                                         "\U0001f600", "\ufeff"]
hostile_text = st.one_of(
    st.binary(max_size=32).map(lambda b: "".join(_TABLE[x % len(_TABLE)] for x in b)),
    st.text(max_size=40),
)


def check_well_formed(text: str, reply: ParsedReply) -> None:
    assert isinstance(reply.content, str)
    assert reply.reasoning is None or isinstance(reply.reasoning, str)
    assert "<|im_end|>" not in reply.content and "<|endoftext|>" not in reply.content
    for i, call in enumerate(reply.calls):
        assert isinstance(call.name, str) and call.name.strip()
        assert isinstance(call.arguments, dict) and call.id == f"call_{i}"
        json.dumps(call.arguments, allow_nan=False)  # plain, finite JSON data
        assert call.span is not None and 0 <= call.span[0] < call.span[1] <= len(text)
        call_text = text[call.span[0]:call.span[1]]
        assert call_text.strip() and call_text not in reply.content
    for f in reply.failures:
        assert isinstance(f.kind, FailureKind) and isinstance(f.message, str) and f.message
        assert 0 <= f.span[0] <= f.span[1] <= len(text) and f.raw == text[f.span[0]:f.span[1]]
        assert f.call_id is None or f.call_id in {c.id for c in reply.calls}
    spans = sorted(c.span for c in reply.calls if c.span is not None)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # calls never overlap


FUZZ = settings(max_examples=10_000, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
OPTIONS: list[dict[str, Any]] = [
    {"tools": None},
    {"tools": [CALC]},
    {"tools": [CALC], "strict": True, "max_calls": 1},
]


@pytest.mark.slow
@FUZZ
@given(text=hostile_text)
def test_parsers_never_raise_and_are_well_formed(text: str) -> None:
    """10,000 strings, each parsed in both formats (so 10,000 per format) under three option sets."""
    for fmt in ("json", "xml"):
        for opts in OPTIONS:
            check_well_formed(text, parse_tool_calls(text, fmt, **opts))  # type: ignore[arg-type]


# Text that ends the turn, the call block or the reasoning wherever it appears, even inside a JSON
# string (Hypothesis draws these too: it mines string constants from the code under test).
_CLOSERS = ("<|im_end|>", "<|endoftext|>", "</tool_call>", "</think>")


@settings(max_examples=300, deadline=None, database=None)
@given(code=st.text(max_size=40).filter(lambda s: not any(c in s for c in _CLOSERS)), n=st.integers(), prefix=st.text(max_size=10).filter(lambda s: "<" not in s))
def test_valid_calls_are_always_found(code: str, n: int, prefix: str) -> None:
    """A well-formed call survives any argument text that cannot close its own tags."""
    args = {"code": code, "n": n}
    as_json = f'{prefix}\n<tool_call>\n{{"name": "calc", "arguments": {json.dumps(args)}}}\n</tool_call>'
    reply = parse_tool_calls(as_json, "json", [CALC])
    if code.strip():
        assert [c.arguments for c in reply.calls] == [args] and reply.failures == []
    if "<" not in code:
        as_xml = (f"{prefix}\n<tool_call>\n<function=calc>\n<parameter=code>\n{code}\n</parameter>\n"
                  f"<parameter=n>\n{n}\n</parameter>\n</function>\n</tool_call>")
        reply = parse_tool_calls(as_xml, "xml", [CALC])
        if code.strip() and code.lower() != "null":
            assert [c.arguments for c in reply.calls] == [args] and reply.failures == []


# Schemas as real tool specs write them, and broken ones: type aliases, unions, garbage types,
# properties and required of the wrong shape, nesting. None of it may make the parser raise.
_TYPE_NAMES = st.sampled_from(["string", "integer", "number", "boolean", "object", "array", "null", "float", "int",
                               "str", "bool", "dict", "list", "int64", "varchar(8)", "tuple", "weird", 3, None])
_prop_schema = st.recursive(
    st.fixed_dictionaries({}, optional={"type": _TYPE_NAMES | st.lists(_TYPE_NAMES, max_size=3),
                                        "enum": st.lists(st.none() | st.integers() | st.text(max_size=3), max_size=3)}),
    lambda inner: st.fixed_dictionaries({}, optional={"anyOf": st.lists(inner, max_size=3), "items": inner,
                                                      "properties": st.dictionaries(st.sampled_from(["a", "b"]), inner,
                                                                                    max_size=2)}),
    max_leaves=6,
) | st.integers() | st.text(max_size=5)
_parameters = st.none() | st.lists(st.integers(), max_size=2) | st.fixed_dictionaries({}, optional={
    "type": _TYPE_NAMES,
    "properties": st.dictionaries(st.sampled_from(["code", "n", "x", "opts"]), _prop_schema, max_size=4)
    | st.lists(st.integers(), max_size=2),
    "required": st.lists(st.sampled_from(["code", "n", "zzz"]), max_size=2) | st.text(max_size=3),
    "additionalProperties": st.booleans(),
})


@settings(max_examples=1500, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=hostile_text, parameters=_parameters, strict=st.booleans())
def test_no_schema_makes_the_parser_raise(text: str, parameters: Any, strict: bool) -> None:
    tools = [{"type": "function", "function": {"name": "calc", "parameters": parameters}}]
    for fmt in ("json", "xml"):
        check_well_formed(text, parse_tool_calls(text, fmt, tools, strict=strict))  # type: ignore[arg-type]
