"""Tool argument schemas: SGLang-style XML conversion, row by row, and JSON-schema validation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.chat import parse_tool_calls
from agentrl.chat.parse import CallFormat
from agentrl.chat.schema import (
    convert_xml_value,
    json_value,
    tool_name,
    tool_parameters,
    tool_properties,
    validate_arguments,
)
from agentrl.chat.types import FailureKind


def props(type_: Any) -> dict[str, Any]:
    return {"p": {"type": type_}}


# --- the SGLang conversion table (reference chat-formats §6.2), one row at a time -----------------

@pytest.mark.parametrize("type_", ["string", "integer", "number", "boolean", "object", "array", "weird"])
@pytest.mark.parametrize("raw", ["null", "NULL", "Null"])
def test_null_is_none_for_every_type(type_: str, raw: str) -> None:
    assert convert_xml_value(raw, "p", props(type_)) == (None, None)


def test_parameter_not_in_schema_stays_a_string() -> None:
    assert convert_xml_value("42", "other", props("integer")) == ("42", None)
    assert convert_xml_value("42", "p", {}) == ("42", None)


@pytest.mark.parametrize("type_", ["string", "str", "text", "varchar", "char", "enum", "STRING"])
def test_string_like_types_keep_the_text(type_: str) -> None:
    assert convert_xml_value("  12\n", "p", props(type_)) == ("  12\n", None)


@pytest.mark.parametrize("type_", ["integer", "int", "int64", "uint8", "long", "short", "unsigned"])
def test_integer_types(type_: str) -> None:
    assert convert_xml_value("-17", "p", props(type_)) == (-17, None)
    value, err = convert_xml_value("abc", "p", props(type_))
    assert value == "abc" and err is not None and "integer" in err and "'abc'" in err
    value, err = convert_xml_value("3.5", "p", props(type_))
    assert value == "3.5" and err is not None


@pytest.mark.parametrize("type_", ["number", "num", "float", "float32"])
def test_number_types(type_: str) -> None:
    assert convert_xml_value("0.5", "p", props(type_)) == (0.5, None)
    assert convert_xml_value("1e3", "p", props(type_)) == (1000.0, None)
    three, err = convert_xml_value("3", "p", props(type_))
    assert three == 3 and isinstance(three, int) and err is None
    three_f, _ = convert_xml_value("3.0", "p", props(type_))
    assert three_f == 3.0 and isinstance(three_f, float)
    big, _ = convert_xml_value("12345678901234567890123", "p", props(type_))
    assert big == int(float("12345678901234567890123"))  # through float(), as SGLang converts it
    value, err = convert_xml_value("twelve", "p", props(type_))
    assert value == "twelve" and err is not None and "number" in err


@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "NaN", "Infinity", "1e999"])
@pytest.mark.parametrize("type_", ["number", "float"])
def test_non_finite_numbers_fall_back_to_the_string(raw: str, type_: str) -> None:
    value, err = convert_xml_value(raw, "p", props(type_))
    assert value == raw and err is not None and "finite" in err


def test_inf_for_an_integer_falls_back_to_the_string() -> None:
    value, err = convert_xml_value("inf", "p", props("integer"))
    assert value == "inf" and err is not None


def test_huge_integer_text_never_raises() -> None:
    raw = "9" * 10_000  # above Python's int-string conversion limit
    for type_ in ("integer", "number", "object", "weird"):
        value, _ = convert_xml_value(raw, "p", props(type_))
        assert value == raw


@pytest.mark.parametrize("type_", ["boolean", "bool"])
def test_boolean_types(type_: str) -> None:
    for raw, expected in [("true", True), ("True", True), ("TRUE", True), ("false", False), ("False", False)]:
        assert convert_xml_value(raw, "p", props(type_)) == (expected, None)
    for raw in ("yes", " true"):  # SGLang reads anything else as false (no stripping); the error says so
        value, err = convert_xml_value(raw, "p", props(type_))
        assert value is False and err is not None and "boolean" in err


def test_binary_is_a_string_after_sglang_rewrites_the_alias() -> None:
    assert convert_xml_value("true", "p", props("binary")) == ("true", None)


@pytest.mark.parametrize("type_", ["object", "dict", "dictionary"])
def test_object_types_json_then_python_literal(type_: str) -> None:
    assert convert_xml_value('{"lang": "en", "n": 1}', "p", props(type_)) == ({"lang": "en", "n": 1}, None)
    # Qwen3-Coder renders dicts with str(): Python repr, single quotes, True/None.
    assert convert_xml_value("{'lang': 'en', 'ok': True, 'x': None}", "p", props(type_)) == (
        {"lang": "en", "ok": True, "x": None}, None)
    value, err = convert_xml_value("{broken", "p", props(type_))
    assert value == "{broken" and err is not None and "object" in err


@pytest.mark.parametrize("type_", ["array", "arr", "list", "list[int]"])
def test_array_types(type_: str) -> None:
    assert convert_xml_value('["x", "y"]', "p", props(type_)) == (["x", "y"], None)
    assert convert_xml_value("['x', 'y']", "p", props(type_)) == (["x", "y"], None)
    assert convert_xml_value("(1, 2)", "p", props(type_)) == ([1, 2], None)  # tuples become lists
    value, err = convert_xml_value("[1,", "p", props(type_))
    assert value == "[1," and err is not None and "array" in err


def test_container_values_json_cannot_carry_fall_back() -> None:
    for raw in ["{1, 2}", "b'x'", "[1e999]", "[NaN]", "1j"]:
        value, err = convert_xml_value(raw, "p", props("object"))
        assert value == raw and err is not None, raw
    # Keys become strings on the way through JSON, as the tool receives them from SGLang.
    assert convert_xml_value("{1: 'a'}", "p", props("object")) == ({"1": "a"}, None)


def test_other_types_use_literal_eval_with_string_fallback() -> None:
    assert convert_xml_value("[1, 2]", "p", props("weird")) == ([1, 2], None)
    assert convert_xml_value("42", "p", props("weird")) == (42, None)
    assert convert_xml_value("hello world", "p", props("weird")) == ("hello world", None)
    value, err = convert_xml_value("{1, 2}", "p", props("weird"))  # a set: JSON cannot carry it
    assert value == "{1, 2}" and err is not None
    assert convert_xml_value("42", "p", props("tuple")) == (42, None)  # tuple is an alias of array


@pytest.mark.parametrize("type_", ["number", "float"])
def test_an_integer_beyond_2_53_for_a_number_arrives_rounded_with_a_note(type_: str) -> None:
    """SGLang 0.5.23 reads a ``number`` through float(); the value changes, so it is said."""
    value, err = convert_xml_value("9007199254740993", "p", props(type_))
    assert value == 9007199254740992 and isinstance(value, int)
    assert err is not None and "9007199254740992" in err and "integer" in err
    assert convert_xml_value("-18446744073709551615", "p", props(type_))[0] == -(2**64)
    assert convert_xml_value("9007199254740992", "p", props(type_)) == (2**53, None)  # exact in a float: no note
    assert convert_xml_value("9007199254740993", "p", props("integer")) == (2**53 + 1, None)


def test_zip_code_stays_a_string() -> None:
    schema = {"zip_code": {"type": "string"}}
    assert convert_xml_value("03106", "zip_code", schema) == ("03106", None)
    assert convert_xml_value("03106", "zip_code", {}) == ("03106", None)


def test_nullable_and_union_types() -> None:
    assert convert_xml_value("5", "p", props(["integer", "null"])) == (5, None)
    assert convert_xml_value("5", "p", {"p": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}) == (5, None)
    assert convert_xml_value("03106", "p", props(["integer", "string"])) == (3106, None)  # first non-null type
    assert convert_xml_value("abc", "p", props(["integer", "string"]))[0] == "abc"
    assert convert_xml_value("2.5", "p", {"p": {"anyOf": [{"type": "number"}, {"type": "string"}]}}) == ("2.5", None)
    assert convert_xml_value("2", "p", {"p": {"enum": [1, 2, 3]}}) == (2, None)
    assert convert_xml_value("2", "p", {"p": {"enum": ["1", "2"]}}) == ("2", None)
    assert convert_xml_value("7", "p", {"p": {}}) == ("7", None)
    assert convert_xml_value("7", "p", {"p": "not a schema"}) == ("7", None)


def test_code_with_indentation_survives() -> None:
    code = "def f():\n    return 1\n\n"
    assert convert_xml_value(code, "p", props("string")) == (code, None)


# --- validation --------------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "code": {"type": "string"},
        "n": {"type": "integer"},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "opts": {"type": "object", "properties": {"lang": {"type": "string"}}, "required": ["lang"]},
    },
    "required": ["code", "n"],
}


def test_valid_arguments_have_no_failures() -> None:
    assert validate_arguments("calc", {"code": "x", "n": 1, "mode": "fast", "opts": {"lang": "en"}}, SCHEMA) == []


def test_missing_required_argument_names_it() -> None:
    failures = validate_arguments("calc", {"n": 1}, SCHEMA)
    assert [(f.kind, f.argument) for f in failures] == [(FailureKind.MISSING_REQUIRED_ARGUMENT, "code")]
    assert "'code'" in failures[0].message and "string" in failures[0].message
    assert failures[0].tool_name == "calc"


def test_wrong_type_names_argument_value_and_expectation() -> None:
    (f,) = validate_arguments("calc", {"code": "x", "n": "seven"}, SCHEMA)
    assert f.kind is FailureKind.INVALID_ARGUMENT_TYPE and f.argument == "n"
    assert "'n'" in f.message and "'seven'" in f.message and "integer" in f.message


def test_bool_is_not_an_integer() -> None:
    (f,) = validate_arguments("calc", {"code": "x", "n": True}, SCHEMA)
    assert f.kind is FailureKind.INVALID_ARGUMENT_TYPE and f.argument == "n"


def test_enum_violation() -> None:
    (f,) = validate_arguments("calc", {"code": "x", "n": 1, "mode": "medium"}, SCHEMA)
    assert f.kind is FailureKind.INVALID_ARGUMENT_TYPE and f.argument == "mode"
    assert "'medium'" in f.message and "fast" in f.message and "slow" in f.message


def test_nested_schema_failure_reports_the_top_level_argument_and_path() -> None:
    (f,) = validate_arguments("calc", {"code": "x", "n": 1, "opts": {"lang": 5}}, SCHEMA)
    assert f.kind is FailureKind.INVALID_ARGUMENT_TYPE and f.argument == "opts"
    assert "['lang']" in f.message and "5" in f.message and "string" in f.message
    (g,) = validate_arguments("calc", {"code": "x", "n": 1, "opts": {}}, SCHEMA)
    assert g.argument == "opts" and "lang" in g.message


def test_missing_and_invalid_together_one_failure_per_argument() -> None:
    failures = validate_arguments("calc", {"n": "x", "mode": 3}, SCHEMA)
    kinds = sorted((f.kind.value, f.argument) for f in failures)
    assert kinds == [("invalid_argument_type", "mode"), ("invalid_argument_type", "n"),
                     ("missing_required_argument", "code")]


def test_additional_properties_false() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    (f,) = validate_arguments("t", {"a": 1, "zz": 2}, schema)
    assert f.kind is FailureKind.INVALID_ARGUMENT_TYPE and f.argument == "zz" and "'a'" in f.message


def test_nullable_true_accepts_null_at_every_level() -> None:
    """OpenAPI's ``nullable: true``, read as SGLang reads it: null is allowed, other types are not."""
    schema = {"type": "object", "nullable": True, "required": ["x"],
              "properties": {"x": {"type": "number", "nullable": True}, "y": {"type": "number"},
                             "e": {"type": "string", "enum": ["a"], "nullable": True},
                             "o": {"type": "object", "properties": {"z": {"type": "int", "nullable": True}}}}}
    assert validate_arguments("f", {"x": None, "e": None, "o": {"z": None}}, schema) == []
    assert [f.argument for f in validate_arguments("f", {"x": None, "y": None}, schema)] == ["y"]
    assert [f.argument for f in validate_arguments("f", {"x": "abc"}, schema)] == ["x"]
    assert [f.kind for f in validate_arguments("f", {}, schema)] == [FailureKind.MISSING_REQUIRED_ARGUMENT]


@pytest.mark.parametrize("fmt, text", [
    ("json", '<tool_call>\n{"name": "f", "arguments": {"x": null}}\n</tool_call>'),
    ("xml", "<tool_call>\n<function=f>\n<parameter=x>\nnull\n</parameter>\n</function>\n</tool_call>"),
])
def test_null_for_a_nullable_number_runs_the_call(fmt: CallFormat, text: str) -> None:
    nullable = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "number", "nullable": True}}}}}]
    reply = parse_tool_calls(text, fmt, nullable)
    assert [(c.name, c.arguments) for c in reply.calls] == [("f", {"x": None})] and reply.failures == []
    plain = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "number"}}}}}]
    other = parse_tool_calls(text, fmt, plain)
    assert [f.kind for f in other.failures] == [FailureKind.INVALID_ARGUMENT_TYPE]
    if fmt == "json":  # a wrong-typed JSON value: refused
        assert other.calls == [] and not other.failures[0].tolerated
    else:  # SGLang's qwen3_coder serves an XML null for every type: the call runs, the note is tolerated
        assert [c.arguments for c in other.calls] == [{"x": None}] and other.failures[0].tolerated


def test_empty_or_missing_schema_accepts_anything() -> None:
    assert validate_arguments("t", {"anything": object()}, {}) == []
    assert validate_arguments("t", {"anything": 1}, None) == []


def test_invalid_schema_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"tool 'bad'.*not a valid JSON schema"):
        validate_arguments("bad", {"a": 1}, {"type": "object", "properties": {"a": {"type": 12}}})


def test_deep_nesting_does_not_raise() -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    failures = validate_arguments("t", {"a": deep}, {"type": "object", "properties": {"a": {"type": "array"}}})
    assert all(f.kind is FailureKind.INVALID_ARGUMENT_TYPE for f in failures)


# --- tool dict helpers -------------------------------------------------------------------------

CALC = {"type": "function", "function": {"name": "calc", "description": "Run python.", "parameters":
        {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}


def test_tool_helpers_openai_and_flat() -> None:
    assert tool_name(CALC) == "calc"
    assert tool_properties(CALC) == ({"code": {"type": "string"}}, ["code"])
    flat = {"name": "now", "description": "time"}
    assert tool_name(flat) == "now" and tool_parameters(flat) == {} and tool_properties(flat) == ({}, [])


@pytest.mark.parametrize("bad, field", [
    ({"type": "function", "function": {"description": "x"}}, "function.name"),
    ({"type": "function", "function": "calc"}, "tool.function"),
    ({"name": "t", "parameters": [1]}, "function.parameters"),
    ({"name": "t", "parameters": {"properties": {}, "required": "code"}}, "parameters.required"),
])
def test_tool_helpers_reject_bad_tools(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        tool_properties(bad)
    with pytest.raises(TypeError, match="tool"):
        tool_name("calc")  # type: ignore[arg-type]


def test_json_value() -> None:
    assert json_value({"a": (1, [2.5, None])}) == {"a": [1, [2.5, None]]}
    for bad in [float("nan"), {1: 2}, {1, 2}, b"x", 1j]:
        with pytest.raises(ValueError):
            json_value(bad)


# --- properties --------------------------------------------------------------------------------

TYPE_NAMES = ["string", "integer", "int32", "number", "float", "boolean", "object", "array", "dict", "list",
              "null", "weird", ["integer", "null"], ["integer", "string"]]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=1000, deadline=None, database=None)
@given(raw=st.text(max_size=30) | st.sampled_from(["inf", "nan", "1e999", "{'a': (1, 2)}", "[1,", "None", "TRUE"]),
       type_=st.sampled_from(TYPE_NAMES))
def test_convert_never_raises_and_returns_json_or_the_raw_string(raw: str, type_: Any) -> None:
    value, err = convert_xml_value(raw, "p", props(type_))
    assert err is None or isinstance(err, str)
    assert value is False or value == raw or json_value(value) == value  # the text, a coerced false, or JSON


@settings(max_examples=200, deadline=None, database=None)
@given(arguments=st.dictionaries(st.sampled_from(["code", "n", "mode", "opts", "other"]), json_values, max_size=5))
def test_validate_never_raises_and_names_real_arguments(arguments: dict[str, Any]) -> None:
    for f in validate_arguments("calc", arguments, SCHEMA):
        assert f.kind in (FailureKind.MISSING_REQUIRED_ARGUMENT, FailureKind.INVALID_ARGUMENT_TYPE)
        assert f.argument is not None and f.argument in SCHEMA["properties"]  # type: ignore[operator]
        assert (f.argument in arguments) == (f.kind is FailureKind.INVALID_ARGUMENT_TYPE)
