"""Tool-call parsing: golden targets, every failure kind in both formats, value round trips."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from agentrl.chat import ChatTemplate, parse_token_ids, parse_tool_calls
from agentrl.chat.parse import CallFormat
from agentrl.chat.types import FailureKind, ParsedReply

K = FailureKind

CALC = {"type": "function", "function": {"name": "calc", "description": "Run python.", "parameters":
        {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer"},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "opts": {"type": "object", "properties": {"lang": {"type": "string"}}},
    },
    "required": ["query"],
}}}
TOOLS = [CALC, SEARCH]

# Golden completions from the reference (what the model samples after each generation prompt).
Q3_TARGET = ("<think>\nUse code.\n</think>\n\n<tool_call>\n{\"name\": \"calc\", \"arguments\": "
             "{\"code\": \"print(2**10)\"}}\n</tool_call><|im_end|>")
QC_TARGET = "<tool_call>\n<function=calc>\n<parameter=code>\nprint(2**10)\n</parameter>\n</function>\n</tool_call><|im_end|>"
Q35_TARGET = ("Use code.\n</think>\n\n<tool_call>\n<function=calc>\n<parameter=code>\nprint(2**10)\n</parameter>\n"
              "</function>\n</tool_call><|im_end|>")


def json_call(name: str, args: Any, key: str = "arguments") -> str:
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "{key}": {json.dumps(args, ensure_ascii=False)}}}\n</tool_call>'


def xml_call(name: str, params: dict[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def kinds(reply: ParsedReply) -> list[str]:
    return [f.kind.value for f in reply.failures]


def assert_well_formed(text: str, reply: ParsedReply) -> None:
    for i, call in enumerate(reply.calls):
        assert call.id == f"call_{i}" and isinstance(call.arguments, dict) and call.name
        assert call.span is not None and 0 <= call.span[0] < call.span[1] <= len(text)
    for f in reply.failures:
        assert 0 <= f.span[0] <= f.span[1] <= len(text) and f.raw == text[f.span[0]:f.span[1]] and f.message


# --- golden vectors ----------------------------------------------------------------------------

def test_golden_qwen3_json_target() -> None:
    reply = parse_tool_calls(Q3_TARGET, "json", [CALC])
    assert reply.reasoning == "Use code." and reply.content == "" and reply.failures == []
    assert [(c.name, c.arguments, c.id) for c in reply.calls] == [("calc", {"code": "print(2**10)"}, "call_0")]
    call = reply.calls[0]
    assert call.span is not None and Q3_TARGET[call.span[0]:call.span[1]].startswith("<tool_call>")


def test_golden_qwen3_coder_xml_target() -> None:
    reply = parse_tool_calls(QC_TARGET, "xml", [CALC])
    assert reply.reasoning is None and reply.content == "" and reply.failures == []
    assert [(c.name, c.arguments) for c in reply.calls] == [("calc", {"code": "print(2**10)"})]


def test_golden_qwen3_5_target_starts_inside_think() -> None:
    reply = parse_tool_calls(Q35_TARGET, "xml", [CALC])
    assert reply.reasoning == "Use code." and reply.content == "" and reply.failures == []
    assert [(c.name, c.arguments) for c in reply.calls] == [("calc", {"code": "print(2**10)"})]


def test_plain_answer_has_no_calls() -> None:
    reply = parse_tool_calls("<think>\nDone.\n</think>\n\n\\boxed{1024}<|im_end|>", "json", [CALC])
    assert reply == ParsedReply(content="\\boxed{1024}", reasoning="Done.")


# --- reasoning and the end of the turn -----------------------------------------------------------

@pytest.mark.parametrize("fmt, call", [("json", json_call("calc", {"code": "1"})),
                                       ("xml", xml_call("calc", {"code": "1"}))])
def test_calls_inside_think_are_not_calls(fmt: CallFormat, call: str) -> None:
    closed = parse_tool_calls(f"<think>\nmaybe {call}\n</think>\n\nNo call.", fmt, [CALC])
    assert closed.calls == [] and closed.failures == [] and closed.content == "No call."
    assert closed.reasoning == f"maybe {call}"
    leading = parse_tool_calls(f"I could {call}\n</think>\n\nanswer", fmt, [CALC])
    assert leading.calls == [] and leading.reasoning == f"I could {call}" and leading.content == "answer"
    unclosed = parse_tool_calls(f"<think>\nstill thinking {call}", fmt, [CALC])
    assert unclosed.calls == [] and unclosed.failures == [] and unclosed.content == ""
    assert unclosed.reasoning == f"still thinking {call}"


def test_stop_markers_and_anything_after_them_are_not_content() -> None:
    for tail in ["<|im_end|>", "<|endoftext|>", "<|im_end|><|endoftext|>", "<|im_end|>\n<|im_start|>user\nhi"]:
        reply = parse_tool_calls("Hello" + tail, "json")
        assert reply.content == "Hello" and reply.failures == []
    reply = parse_tool_calls(json_call("calc", {"code": "1"}) + "<|im_end|>garbage", "json", [CALC])
    assert len(reply.calls) == 1 and reply.failures == []


def test_content_outside_calls() -> None:
    text = "Let me check.\n" + json_call("calc", {"code": "1"}) + "\n" + json_call("calc", {"code": "2"})
    reply = parse_tool_calls(text, "json", [CALC])
    assert reply.content == "Let me check." and [c.id for c in reply.calls] == ["call_0", "call_1"]
    assert [c.arguments["code"] for c in reply.calls] == ["1", "2"] and reply.failures == []
    assert_well_formed(text, reply)


# --- JSON specifics ------------------------------------------------------------------------------

def test_json_parameters_alias_and_string_arguments() -> None:
    assert parse_tool_calls(json_call("calc", {"code": "x"}, key="parameters"), "json", [CALC]).calls[0].arguments == {
        "code": "x"}
    # SGLang passes a string on as a JSON string, which no tool can take: not a call.
    as_string = parse_tool_calls(json_call("calc", json.dumps({"code": "x"})), "json", [CALC])
    assert as_string.calls == [] and kinds(as_string) == ["malformed_json"] and "string" in as_string.failures[0].message


def test_json_parameters_win_when_not_empty_as_in_sglang() -> None:
    both = '<tool_call>\n{"name": "calc", "parameters": {"code": "p"}, "arguments": {"code": "a"}}\n</tool_call>'
    assert parse_tool_calls(both, "json", [CALC]).calls[0].arguments == {"code": "p"}
    empty = '<tool_call>\n{"name": "calc", "parameters": {}, "arguments": {"code": "a"}}\n</tool_call>'
    assert parse_tool_calls(empty, "json", [CALC]).calls[0].arguments == {"code": "a"}


def test_json_without_arguments_runs_with_none_and_is_reported_tolerated() -> None:
    now = {"type": "function", "function": {"name": "now", "description": "time"}}
    reply = parse_tool_calls('<tool_call>\n{"name": "now"}\n</tool_call>', "json", [now])
    assert [(c.name, c.arguments) for c in reply.calls] == [("now", {})] and kinds(reply) == ["malformed_json"]
    assert reply.failures[0].tolerated and reply.failures[0].call_id == "call_0"
    strict = parse_tool_calls('<tool_call>\n{"name": "now"}\n</tool_call>', "json", [now], strict=True)
    assert strict.calls == [] and kinds(strict) == ["malformed_json"] and not strict.failures[0].tolerated


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "calc", "arguments": {"code": "1"}}</tool_call>',     # no newlines
    '<tool_call>\n{"name": "calc", "arguments": {"code": "1"}}</tool_call>',   # no newline before the closer
])
def test_json_block_not_framed_as_sglang_reads_it_is_not_a_call(text: str) -> None:
    reply = parse_tool_calls(text, "json", [CALC])
    assert reply.calls == [] and kinds(reply) == ["malformed_json"] and "SGLang" in reply.failures[0].message


def test_json_list_of_calls_in_one_block() -> None:
    text = '<tool_call>\n[{"name": "calc", "arguments": {"code": "1"}}, {"name": "calc", "arguments": {"code": "2"}}]\n</tool_call>'
    reply = parse_tool_calls(text, "json", [CALC])
    assert [c.arguments["code"] for c in reply.calls] == ["1", "2"]
    assert kinds(reply) == ["malformed_json", "malformed_json"] and all(f.tolerated for f in reply.failures)
    assert_well_formed(text, reply)


@pytest.mark.parametrize("body", [
    '{"name": "calc", "arguments": {"code": "1"},}',          # trailing comma
    "{'name': 'calc', 'arguments': {'code': '1'}}",             # Python literal
    '{"name": "calc", "arguments": {"code": "a\tb"}}',         # raw control character
    '{"name": "calc", "arguments": {"code": NaN}}',             # not JSON
    '{"name": "calc", "arguments": {"x": 1e999}}',              # overflows to inf
    '"calc"',                                                   # not an object
    '{"arguments": {"code": "1"}}',                              # no name
    '{"name": 5, "arguments": {}}',                              # name not a string
    '{"name": "calc", "arguments": [1, 2]}',                    # arguments not an object
    '{"name": "calc", "arguments": null}',
    '{"name": "calc", "arguments": "{not json"}',               # string that is not JSON
    '{"name": "calc", "arguments": "[1]"}',                     # JSON string of a non-object
])
def test_json_malformed(body: str) -> None:
    text = f"<tool_call>\n{body}\n</tool_call>"
    reply = parse_tool_calls(text, "json", [CALC])
    assert reply.calls == [] and kinds(reply) == ["malformed_json"]
    assert reply.failures[0].raw == text and reply.failures[0].span == (0, len(text))


def test_json_huge_number_is_malformed_not_a_crash() -> None:
    reply = parse_tool_calls('<tool_call>{"name": "calc", "arguments": {"code": ' + "9" * 6000 + "}}</tool_call>")
    assert kinds(reply) == ["malformed_json"]


# --- every failure kind, both formats --------------------------------------------------------------

@pytest.mark.parametrize("fmt, text", [
    ("json", json_call("nope", {"code": "1"})),
    ("xml", xml_call("nope", {"code": "1"})),
])
def test_unknown_tool(fmt: CallFormat, text: str) -> None:
    reply = parse_tool_calls(text, fmt, TOOLS)
    assert reply.calls == [] and kinds(reply) == ["unknown_tool"]
    assert reply.failures[0].tool_name == "nope" and "calc" in reply.failures[0].message
    anything = parse_tool_calls(text, fmt, None)
    assert [c.name for c in anything.calls] == ["nope"] and anything.failures == []


@pytest.mark.parametrize("fmt, text", [
    ("json", json_call("search", {"limit": 3})),
    ("xml", xml_call("search", {"limit": "3"})),
])
def test_missing_required_argument(fmt: CallFormat, text: str) -> None:
    reply = parse_tool_calls(text, fmt, TOOLS)
    assert reply.calls == [] and kinds(reply) == ["missing_required_argument"]
    assert reply.failures[0].argument == "query" and "'query'" in reply.failures[0].message


@pytest.mark.parametrize("fmt, text, arg, shown", [
    ("json", json_call("search", {"query": "q", "limit": "three"}), "limit", "'three'"),
    ("json", json_call("search", {"query": "q", "mode": "medium"}), "mode", "'medium'"),
    ("json", json_call("search", {"query": "q", "opts": {"lang": 1}}), "opts", "1"),
    ("xml", xml_call("search", {"query": "q", "limit": "three"}), "limit", "'three'"),
    ("xml", xml_call("search", {"query": "q", "mode": "medium"}), "mode", "'medium'"),
    ("xml", xml_call("search", {"query": "q", "opts": "{'lang': 1}"}), "opts", "1"),
    ("xml", xml_call("search", {"query": "q", "opts": "{broken"}), "opts", "'{broken'"),
    ("xml", xml_call("search", {"query": "q", "limit": "inf"}), "limit", "'inf'"),
])
def test_invalid_argument_type(fmt: CallFormat, text: str, arg: str, shown: str) -> None:
    reply = parse_tool_calls(text, fmt, TOOLS)
    assert reply.calls == [] and kinds(reply) == ["invalid_argument_type"]
    failure = reply.failures[0]
    assert failure.argument == arg and f"'{arg}'" in failure.message and shown in failure.message
    assert failure.tool_name == "search"


@pytest.mark.parametrize("fmt, text", [
    ("json", "<tool_call>\n\n</tool_call>"),
    ("json", json_call(" ", {})),
    ("xml", "<tool_call>\n</tool_call>"),
    ("xml", "<tool_call>\n<function=>\n</function>\n</tool_call>"),
])
def test_empty_call(fmt: CallFormat, text: str) -> None:
    reply = parse_tool_calls(text, fmt, TOOLS)
    assert reply.calls == [] and kinds(reply) == ["empty_call"]


@pytest.mark.parametrize("fmt, text, blank", [
    ("json", json_call("calc", {"code": "  \n"}), "  \n"),
    ("xml", xml_call("calc", {"code": ""}), ""),
])
def test_blank_required_arguments_run_as_sglang_runs_them(fmt: CallFormat, text: str, blank: str) -> None:
    reply = parse_tool_calls(text, fmt, TOOLS)
    assert [c.arguments for c in reply.calls] == [{"code": blank}] and kinds(reply) == ["empty_call"]
    assert reply.failures[0].tolerated
    strict = parse_tool_calls(text, fmt, TOOLS, strict=True)
    assert strict.calls == [] and kinds(strict) == ["empty_call"]


def test_unterminated_json() -> None:
    cut = '<tool_call>\n{"name": "calc", "arguments": {"co'
    reply = parse_tool_calls(cut, "json", [CALC])
    assert reply.calls == [] and kinds(reply) == ["unterminated"] and reply.failures[0].raw == cut
    # A complete body without its closer is not a call for SGLang's qwen25 parser either.
    complete_body = '<tool_call>\n{"name": "calc", "arguments": {"code": "1"}}\n'
    for strict in (False, True):
        reply = parse_tool_calls(complete_body, "json", [CALC], strict=strict)
        assert reply.calls == [] and kinds(reply) == ["unterminated"] and reply.failures[0].call_id is None
    after_complete = json_call("calc", {"code": "1"}) + "\n" + cut
    reply = parse_tool_calls(after_complete, "json", [CALC])
    assert [c.arguments for c in reply.calls] == [{"code": "1"}] and kinds(reply) == ["unterminated"]


def test_unterminated_json_block_runs_into_the_next_block_as_in_sglang() -> None:
    text = '<tool_call>\n{"name": "calc", "argu' + json_call("calc", {"code": "2"})
    reply = parse_tool_calls(text, "json", [CALC])
    assert reply.calls == [] and kinds(reply) == ["malformed_json"] and reply.failures[0].raw == text


@pytest.mark.parametrize("text, code", [
    ("<tool_call>\n<function=calc>\n<parameter=code>\nprint(1)\n", "print(1)"),        # truncated value
    ("<tool_call>\n<function=calc>\n<parameter=code>\nprint(1)\n</function>\n</tool_call>", "print(1)"),
    ("<tool_call>\n<function=calc>\n<parameter=code>\nx\n</parameter>\n</tool_call>", "x"),  # no </function>
    ("<tool_call>\n<function=calc>\n<parameter=code>\nx\n</parameter>\n</function>\n", "x"),  # no </tool_call>
])
def test_unterminated_xml_lenient_accepts_strict_rejects(text: str, code: str) -> None:
    lenient = parse_tool_calls(text, "xml", [CALC])
    assert [c.arguments for c in lenient.calls] == [{"code": code}]
    assert kinds(lenient) == ["unterminated"] and lenient.failures[0].call_id == "call_0"
    strict = parse_tool_calls(text, "xml", [CALC], strict=True)
    assert strict.calls == [] and kinds(strict) == ["unterminated"]


def test_xml_parameter_closed_by_the_next_parameter() -> None:
    text = "<tool_call>\n<function=search>\n<parameter=query>\ncats\n<parameter=limit>\n3\n</parameter>\n</function>\n</tool_call>"
    reply = parse_tool_calls(text, "xml", TOOLS)
    assert [c.arguments for c in reply.calls] == [{"query": "cats", "limit": 3}] and kinds(reply) == ["unterminated"]


def test_xml_header_cut_off_is_unterminated() -> None:
    for text in ["<tool_call>\n<function=cal", "<tool_call>\n<function=calc>\n<parameter=co"]:
        reply = parse_tool_calls(text, "xml", [CALC])
        assert "unterminated" in kinds(reply) and reply.calls == [], text


@pytest.mark.parametrize("text", [
    "<tool_call>\ncalc(code=1)\n</tool_call>",                                   # no <function=
    "<tool_call>\n<function=calc\n<parameter=code>\n1\n</parameter>\n</function>\n</tool_call>",  # bad name
])
def test_malformed_xml(text: str) -> None:
    reply = parse_tool_calls(text, "xml", [CALC])
    assert reply.calls == [] and kinds(reply) == ["malformed_xml"]


def test_xml_stray_text_and_bare_function_are_tolerated_but_reported() -> None:
    stray = "<tool_call>\n<function=calc>\nhmm\n<parameter=code>\n1\n</parameter>\n</function>\n</tool_call>"
    reply = parse_tool_calls(stray, "xml", [CALC])
    assert len(reply.calls) == 1 and kinds(reply) == ["malformed_xml"] and "hmm" in reply.failures[0].message
    assert parse_tool_calls(stray, "xml", [CALC], strict=True).calls == []
    # Without any <tool_call> in the turn SGLang reads no call; with an unterminated one it reads them all.
    bare = "Sure.\n<function=calc>\n<parameter=code>\n1\n</parameter>\n</function>"
    reply = parse_tool_calls(bare, "xml", [CALC])
    assert reply.calls == [] and reply.content == "Sure." and kinds(reply) == ["malformed_xml"]
    wrapped_later = parse_tool_calls(bare + "\n<tool_call>", "xml", [CALC])
    assert [c.arguments for c in wrapped_later.calls] == [{"code": "1"}] and wrapped_later.content == "Sure."
    assert set(kinds(wrapped_later)) == {"malformed_xml", "unterminated"}
    assert all(f.tolerated for f in wrapped_later.failures)


def test_xml_broken_closing_tag_stays_in_the_value_and_is_reported() -> None:
    for tag in ("</parameter1>", "</parameter_x>", "</parameter"):
        text = f"<tool_call>\n<function=calc>\n<parameter=code>\nx = 1\n{tag}\n</function>\n</tool_call>"
        reply = parse_tool_calls(text, "xml", [CALC])
        assert [c.arguments for c in reply.calls] == [{"code": f"x = 1\n{tag}"}], tag
        broken = [f for f in reply.failures if "broken" in f.message]
        assert len(broken) == 1 and broken[0].kind is K.MALFORMED_XML and broken[0].tolerated
        assert parse_tool_calls(text, "xml", [CALC], strict=True).calls == []


def test_xml_unterminated_last_block_after_a_complete_one_is_dropped() -> None:
    text = xml_call("calc", {"code": "1"}) + "\n<tool_call>\n<function=calc>\n<parameter=code>\n2\n"
    reply = parse_tool_calls(text, "xml", [CALC])
    assert [c.arguments for c in reply.calls] == [{"code": "1"}] and kinds(reply) == ["unterminated"]
    assert not reply.failures[0].tolerated


def test_xml_duplicate_parameter_is_reported_and_last_wins() -> None:
    text = "<tool_call>\n<function=calc>\n<parameter=code>\n1\n</parameter>\n<parameter=code>\n2\n</parameter>\n</function>\n</tool_call>"
    reply = parse_tool_calls(text, "xml", [CALC])
    assert [c.arguments for c in reply.calls] == [{"code": "2"}] and kinds(reply) == ["malformed_xml"]


def test_xml_several_functions_in_one_block() -> None:
    text = ("<tool_call>\n<function=calc>\n<parameter=code>\n1\n</parameter>\n</function>\n"
            "<function=calc>\n<parameter=code>\n2\n</parameter>\n</function>\n</tool_call>")
    reply = parse_tool_calls(text, "xml", [CALC])
    assert [c.arguments["code"] for c in reply.calls] == ["1", "2"] and reply.failures == []
    spans = [c.span for c in reply.calls]
    assert spans[0] is not None and spans[1] is not None and spans[0][1] == spans[1][0]
    assert spans[0][0] == 0 and spans[1][1] == len(text)


@pytest.mark.parametrize("fmt, call", [("json", json_call("calc", {"code": "1"})),
                                       ("xml", xml_call("calc", {"code": "1"}))])
def test_text_after_call(fmt: CallFormat, call: str) -> None:
    text = f"Checking.\n{call}\nThe answer is 1."
    reply = parse_tool_calls(text, fmt, [CALC])
    assert len(reply.calls) == 1 and kinds(reply) == ["text_after_call"]
    assert reply.failures[0].raw == "The answer is 1." and reply.content == "Checking.\n\nThe answer is 1."
    assert parse_tool_calls(f"{call}\n\n<|im_end|>", fmt, [CALC]).failures == []


@pytest.mark.parametrize("fmt, call", [("json", json_call("calc", {"code": "1"})),
                                       ("xml", xml_call("calc", {"code": "1"}))])
def test_too_many_calls(fmt: CallFormat, call: str) -> None:
    reply = parse_tool_calls("\n".join([call] * 3), fmt, [CALC], max_calls=2)
    assert [c.id for c in reply.calls] == ["call_0", "call_1"] and kinds(reply) == ["too_many_calls"]
    zero = parse_tool_calls(call, fmt, [CALC], max_calls=0)
    assert zero.calls == [] and kinds(zero) == ["too_many_calls"]


def test_failed_calls_do_not_consume_ids() -> None:
    text = json_call("nope", {}) + "\n" + json_call("calc", {"code": "1"})
    reply = parse_tool_calls(text, "json", [CALC])
    assert [(c.name, c.id) for c in reply.calls] == [("calc", "call_0")] and kinds(reply) == ["unknown_tool"]


# --- XML value handling ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    "def f():\n    return 1",           # indentation
    "\n    indented first line",        # a leading newline of the value itself
    "x = 1\n\n",                        # trailing newlines of the value itself
    "  keep  ",                          # surrounding spaces
    "",                                  # empty string
    "\n",                                # a lone newline
])
def test_exactly_one_framing_newline_is_stripped(value: str) -> None:
    reply = parse_tool_calls(xml_call("calc", {"code": value}), "xml")
    assert reply.calls[0].arguments == {"code": value}


def test_zip_code_stays_a_string() -> None:
    zip_tool = {"type": "function", "function": {"name": "geo", "parameters": {
        "type": "object", "properties": {"zip_code": {"type": "string"}}, "required": ["zip_code"]}}}
    text = xml_call("geo", {"zip_code": "03106"})
    assert parse_tool_calls(text, "xml", [zip_tool]).calls[0].arguments == {"zip_code": "03106"}
    assert parse_tool_calls(text, "xml").calls[0].arguments == {"zip_code": "03106"}
    as_json = json_call("geo", {"zip_code": "03106"})
    assert parse_tool_calls(as_json, "json", [zip_tool]).calls[0].arguments == {"zip_code": "03106"}


def test_python_repr_dict_from_qwen3_coder_render() -> None:
    text = xml_call("search", {"query": "q", "opts": str({"lang": "en"})})
    assert parse_tool_calls(text, "xml", TOOLS).calls[0].arguments == {"query": "q", "opts": {"lang": "en"}}


@pytest.mark.parametrize("raw", ["inf", "nan", "-Infinity", "1e999"])
def test_xml_non_finite_numbers_are_reported(raw: str) -> None:
    num_tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "number"}}}}}
    reply = parse_tool_calls(xml_call("f", {"x": raw}), "xml", [num_tool])
    assert reply.calls == [] and kinds(reply) == ["invalid_argument_type"] and repr(raw) in reply.failures[0].message


# --- every argument type round-trips through each format's rendering --------------------------------

@dataclass(frozen=True)
class Case:
    schema: dict[str, Any]
    value: Any
    expected_xml: Any  # what the XML formats parse back (None marks a rendering hazard documented below)


TYPE_CASES = {
    "multiline_code": Case({"type": "string"}, "def f(x):\n    if x:\n        return 1\n\n", "def f(x):\n    if x:\n        return 1\n\n"),
    "numeric_string": Case({"type": "string"}, "03106", "03106"),
    "non_ascii": Case({"type": "string"}, "héllo ✓ 日本", "héllo ✓ 日本"),
    "markup": Case({"type": "string"}, "a < b && c > \"d\" 'e'", "a < b && c > \"d\" 'e'"),
    "int": Case({"type": "integer"}, -42, -42),
    "float": Case({"type": "number"}, 0.5, 0.5),
    "integral_float": Case({"type": "number"}, 3.0, 3.0),
    "bool_true": Case({"type": "boolean"}, True, True),
    "bool_false": Case({"type": "boolean"}, False, False),
    "null_object": Case({"type": ["object", "null"]}, None, None),
    "object": Case({"type": "object"}, {"lang": "en", "n": 1, "ok": True, "z": None},
                   {"lang": "en", "n": 1, "ok": True, "z": None}),
    "array": Case({"type": "array"}, ["x", 1, [2.5]], ["x", 1, [2.5]]),
}


def _type_tool(case: Case) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"v": case.schema}, "required": ["v"]}}}


def _qwen3_render(value: Any) -> str:
    return json_call("f", {"v": value})


def _qwen3_coder_render(value: Any) -> str:
    return xml_call("f", {"v": value if isinstance(value, str) else str(value)})


def _qwen3_5_render(value: Any) -> str:
    text = value if isinstance(value, str) else (
        json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else str(value))
    return "<think>\n\n</think>\n\n" + xml_call("f", {"v": text})


@pytest.mark.parametrize("name", sorted(TYPE_CASES))
@pytest.mark.parametrize("fmt, render", [("json", _qwen3_render), ("xml", _qwen3_coder_render),
                                         ("xml", _qwen3_5_render)], ids=["qwen3", "qwen3_coder", "qwen3_5"])
def test_argument_types_round_trip_hand_rendered(name: str, fmt: CallFormat, render: Any) -> None:
    case = TYPE_CASES[name]
    reply = parse_tool_calls(render(case.value) + "<|im_end|>", fmt, [_type_tool(case)])
    assert reply.failures == []
    expected = case.value if fmt == "json" else case.expected_xml
    assert reply.calls[0].arguments == {"v": expected}
    assert type(reply.calls[0].arguments["v"]) is type(expected)


def test_rendered_none_for_a_string_parameter_stays_the_string_none() -> None:
    """The XML templates print None as ``None``, which is not ``null``: a documented round-trip hazard."""
    tool = _type_tool(Case({"type": "string"}, None, None))
    assert parse_tool_calls(_qwen3_coder_render(None), "xml", [tool]).calls[0].arguments == {"v": "None"}


@pytest.mark.parametrize("template", ["qwen3", "qwen3_coder", "qwen3_5"])
def test_argument_types_round_trip_through_shipped_templates(template: str) -> None:
    """Renders every argument type with the shipped template and parses the assistant turn back."""
    chat = ChatTemplate.from_name(template)
    fmt: CallFormat = "json" if template == "qwen3" else "xml"
    assert chat.tool_call_format == fmt
    for name, case in TYPE_CASES.items():
        call = {"type": "function", "function": {"name": "f", "arguments": {"v": case.value}}}
        messages = [{"role": "user", "content": "go"},
                    {"role": "assistant", "content": "", "tool_calls": [call]}]
        rendered = chat.render(messages, tools=[_type_tool(case)])
        completion = rendered[rendered.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):]
        reply = parse_tool_calls(completion, fmt, [_type_tool(case)])
        expected = case.value if fmt == "json" else case.expected_xml
        assert reply.failures == [], (template, name, completion)
        assert reply.calls[0].arguments == {"v": expected}, (template, name, completion)
        assert type(reply.calls[0].arguments["v"]) is type(expected), (template, name)


# --- token ids, options --------------------------------------------------------------------------

def test_parse_from_token_ids_keeps_special_tokens() -> None:
    from agentrl.testing import build_tokenizer

    tok = build_tokenizer()
    ids = tok.encode(Q35_TARGET, add_special_tokens=False)
    reply = parse_token_ids(ids, tok, "xml", [CALC])
    assert reply.reasoning == "Use code." and [c.arguments for c in reply.calls] == [{"code": "print(2**10)"}]
    assert reply.failures == []


def test_parse_token_ids_matches_the_template_parse_with_or_without_a_fast_backend() -> None:
    from agentrl.testing import build_tokenizer

    tok = build_tokenizer()
    ids = tok.encode(Q35_TARGET + "<|im_end|>", add_special_tokens=False)
    expected = ChatTemplate.from_name("qwen3_5", tokenizer=tok).parse(ids, [CALC])

    class DecodeOnly:  # a tokenizer with ``decode`` and nothing else (no Rust backend)
        def decode(self, token_ids: Any, **kwargs: Any) -> str:
            return str(tok.decode(token_ids, **kwargs))

    assert parse_token_ids(ids, tok, "xml", [CALC]) == expected
    assert parse_token_ids(ids, DecodeOnly(), "xml", [CALC]) == expected


def test_tools_may_be_objects_with_name_and_parameters() -> None:
    @dataclass
    class T:
        name: str
        parameters: dict[str, Any]

    tool = T("calc", CALC["function"]["parameters"])  # type: ignore[index]
    assert parse_tool_calls(json_call("calc", {}), "json", [tool]).failures[0].kind is K.MISSING_REQUIRED_ARGUMENT


@pytest.mark.parametrize("kwargs, error, match", [
    ({"format": "yaml"}, ValueError, "format"),
    ({"max_calls": -1}, ValueError, "max_calls"),
    ({"max_calls": True}, ValueError, "max_calls"),
    ({"tools": CALC}, TypeError, "tools"),
    ({"tools": [CALC, CALC]}, ValueError, r"tools\[1\].*duplicate"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, ValueError, r"tools\[0\].*name"),
    ({"tools": [42]}, TypeError, r"tools\[0\]"),
])
def test_bad_options_raise_clear_errors(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        parse_tool_calls("hi", **kwargs)


@pytest.mark.parametrize("parameters", [
    {"type": "object", "properties": {"a": {"type": 3}}},   # not a JSON schema
    {"type": "object", "properties": [1]},
    {"type": "object", "required": "a"},
    [1, 2],
    "a string",
])
def test_a_bad_schema_never_makes_the_parser_raise(parameters: Any) -> None:
    tool = {"name": "t", "parameters": parameters}
    for fmt, text in (("json", json_call("t", {"a": 1})), ("xml", xml_call("t", {"a": "1"}))):
        reply = parse_tool_calls(text, fmt, [tool])  # type: ignore[arg-type]
        assert [c.name for c in reply.calls] == ["t"], (fmt, parameters)


def test_type_aliases_in_schemas_convert_and_validate() -> None:
    tool = {"name": "t", "parameters": {"type": "object", "properties": {
        "n": {"type": "int"}, "x": {"type": "float"}, "s": {"type": "str"}, "b": {"type": "bool"},
        "d": {"type": "dict"}, "l": {"type": "list"}}, "required": ["n"]}}
    text = xml_call("t", {"n": "5", "x": "2", "s": "007", "b": "true", "d": '{"a": 1}', "l": "[1]"})
    reply = parse_tool_calls(text, "xml", [tool])
    assert reply.calls[0].arguments == {"n": 5, "x": 2, "s": "007", "b": True, "d": {"a": 1}, "l": [1]}
    assert reply.failures == []
    wrong = parse_tool_calls(json_call("t", {"n": "five"}), "json", [tool])
    assert wrong.calls == [] and kinds(wrong) == ["invalid_argument_type"]


def test_xml_boolean_coerced_to_false_as_sglang_does_is_tolerated() -> None:
    tool = {"name": "t", "parameters": {"type": "object", "properties": {"b": {"type": "boolean"}}}}
    reply = parse_tool_calls(xml_call("t", {"b": "yes"}), "xml", [tool])
    assert [c.arguments for c in reply.calls] == [{"b": False}] and kinds(reply) == ["invalid_argument_type"]
    assert reply.failures[0].tolerated and reply.failures[0].argument == "b"
    assert parse_tool_calls(xml_call("t", {"b": "yes"}), "xml", [tool], strict=True).calls == []


@pytest.mark.parametrize("written", ["null", "NULL", "Null"])
def test_xml_null_for_a_number_runs_with_none_as_sglang_serves_it_and_is_tolerated(written: str) -> None:
    """SGLang 0.5.23's qwen3_coder serves ``null`` as ``None`` for every type: the call runs (its tool
    decides), with a tolerated note; JSON ``null`` for a number stays a wrong type (a validating runner's)."""
    tool = {"name": "t", "parameters": {"type": "object", "properties": {"x": {"type": "number"}, "s": {"type": "string"}},
                                        "required": ["x"]}}
    reply = parse_tool_calls(xml_call("t", {"x": written, "s": "hi"}), "xml", [tool])
    assert [c.arguments for c in reply.calls] == [{"x": None, "s": "hi"}]
    [note] = reply.failures
    assert (note.kind, note.argument, note.tolerated, note.call_id) == (K.INVALID_ARGUMENT_TYPE, "x", True, "call_0")
    assert "served as null" in note.message
    assert parse_tool_calls(xml_call("t", {"x": written}), "xml", [tool], strict=True).calls == []
    # another defect of the same call still rejects it
    assert parse_tool_calls(xml_call("t", {"x": written, "s": "[1"}), "xml",
                            [{**tool, "parameters": {**tool["parameters"], "additionalProperties": False,
                                                     "properties": {"x": {"type": "number"}}}}]).calls == []
    assert parse_tool_calls(json_call("t", {"x": None}), "json", [tool]).calls == []


def test_text_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="text"):
        parse_tool_calls(b"<tool_call>", "json")  # type: ignore[arg-type]


def test_many_markers_parse_and_every_block_is_accounted_for() -> None:
    """Hostile input: thousands of unclosed tags; each one is reported, nothing raises."""
    text = "<tool_call><function=<parameter=" * 3000  # one unclosed block: one unreadable function for SGLang
    reply = parse_tool_calls(text, "xml", [CALC])
    assert reply.calls == [] and set(kinds(reply)) <= {"unterminated", "malformed_xml"}
    assert_well_formed(text, reply)
    text = "<tool_call><function=x></function></tool_call>" * 3000
    reply = parse_tool_calls(text, "xml", [CALC])
    assert reply.calls == [] and len({f.span for f in reply.failures}) == 3000 and set(kinds(reply)) == {"unknown_tool"}
    text = "<tool_call>\n{" * 3000
    reply = parse_tool_calls(text, "json", [CALC])
    assert reply.calls == [] and len(reply.failures) == 3000 and set(kinds(reply)) == {"unterminated"}


def test_json_tool_call_tag_inside_a_string_argument_does_not_split_the_call() -> None:
    text = json_call("calc", {"code": "print('<tool_call>')"})
    reply = parse_tool_calls(text, "json", [CALC])
    assert [c.arguments for c in reply.calls] == [{"code": "print('<tool_call>')"}] and reply.failures == []
    hostile = "<tool_call>{" * 2000 + "</tool_call>"
    reply = parse_tool_calls(hostile, "json", [CALC])
    assert reply.calls == [] and len(reply.failures) == 2000


@pytest.mark.parametrize("template", ["qwen3", "qwen3_coder", "qwen3_5"])
def test_content_reasoning_and_parallel_calls_round_trip_through_shipped_templates(template: str) -> None:
    chat = ChatTemplate.from_name(template)
    calls = [{"type": "function", "function": {"name": "calc", "arguments": {"code": "print(1)"}}},
             {"type": "function", "function": {"name": "search", "arguments": {"query": "cats", "limit": 3}}}]
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "Let me check both.", "reasoning_content": "Two tools.",
                 "tool_calls": calls}]
    rendered = chat.render(messages, tools=TOOLS)
    completion = rendered[rendered.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):]
    reply = parse_tool_calls(completion, chat.tool_call_format, TOOLS)
    assert reply.failures == [] and reply.content == "Let me check both."
    assert [(c.name, c.arguments, c.id) for c in reply.calls] == [
        ("calc", {"code": "print(1)"}, "call_0"), ("search", {"query": "cats", "limit": 3}, "call_1")]
    # Qwen3-Coder has no thinking; the two others render the reasoning of the last turn.
    assert reply.reasoning == (None if template == "qwen3_coder" else "Two tools.")


def test_xml_bad_function_does_not_hide_the_next_one() -> None:
    text = ("<tool_call>\n<function=ca<lc>\n</function>\n<function=calc>\n<parameter=code>\n1\n</parameter>\n"
            "</function>\n</tool_call>")
    reply = parse_tool_calls(text, "xml", [CALC])
    assert [c.arguments for c in reply.calls] == [{"code": "1"}]
    assert kinds(reply) == ["malformed_xml"] and reply.failures[0].call_id is None  # the bad header
    assert_well_formed(text, reply)
    assert len(parse_tool_calls(text, "xml", [CALC], strict=True).calls) == 1  # the good call has no defect


@pytest.mark.parametrize(("fmt", "text"), [
    ("json", '<tool_call>\n{"name": "search", "arguments": {"query": "\\ud800x"}}\n</tool_call>'),
    ("json", '<tool_call>\n{"name": "search", "arguments": {"query": "a", "\\udfff": 1}}\n</tool_call>'),
    ("xml", '<tool_call>\n<function=search>\n<parameter=query>\na\n</parameter>\n<parameter=opts>\n'
            '{"lang": "\\ud800"}\n</parameter>\n</function>\n</tool_call>'),
])
def test_a_lone_surrogate_escape_is_refused_not_passed_on(fmt: CallFormat, text: str) -> None:
    # "\ud800" is valid JSON text but no Unicode string: no UTF-8 file, tokenizer or server can carry it
    reply = parse_tool_calls(text, fmt, TOOLS)
    assert reply.calls == [] and len(reply.failures) == 1
    assert "lone surrogate" in reply.failures[0].message
    assert reply.failures[0].kind in (K.MALFORMED_JSON, K.INVALID_ARGUMENT_TYPE)
