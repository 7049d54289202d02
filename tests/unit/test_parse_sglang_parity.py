"""Differential test: agentrl's tool-call parser against SGLang's own detectors, as an oracle.

For each format (``json``: SGLang parser ``qwen25``; ``xml``: ``qwen3_coder``) a hypothesis
corpus of valid calls, the hand-written classes of the parity issues, random corruptions of
valid calls and generated argument classes (integers near 2**53 and 2**64, ``null`` for nullable
and non-nullable numbers, non-numeric text for numbers, drifted parameter end markers) goes
through both parsers, and so do SGLang's own test cases for those classes (transcribed below).
The calls that *run* must be the same, with the same argument values:

- SGLang side: ``FunctionCallParser.parse_non_stream`` on tools whose schemas went through
  SGLang's own type-alias rewrite (as its server does), arguments decoded from the JSON it
  serves, kept when the tool exists and the arguments pass the tool's schema (what a tool runner
  that validates, like ``agentrl.tools.FunctionTool``, lets through), with ``nullable: true``
  read as SGLang's own grammar reads it and, in the XML format, ``null`` passing for every declared
  parameter (``qwen3_coder`` serves it as ``None`` whatever the type: the call is made);
- the content SGLang's server answers (the text before the first call) against
  ``ParsedReply.served_content()``;
- agentrl side: ``parse_tool_calls(...).calls`` with the same tools, default options.

Two deliberate differences (docs/chat.md) are counted apart, never compared: SGLang's parser
raising (it then serves no call of the turn) and non-finite numbers in served arguments. The
agreement figures are printed at the end of the module (``pytest -s``) as one ``RESULT`` line:
per format over everything compared, per generated class, and for SGLang's own cases (with how
many of their expectations, written for SGLang newer than 0.5.23, the pinned 0.5.23 itself misses).
SGLang is a test-only oracle: the module skips when it is not installed.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

fcp = pytest.importorskip("sglang.srt.function_call.function_call_parser")
protocol = pytest.importorskip("sglang.srt.entrypoints.openai.protocol")
sglang_utils = pytest.importorskip("sglang.srt.function_call.utils")
sglang_grammar = pytest.importorskip("sglang.srt.function_call.response_template_structural_tag")
jsonschema = pytest.importorskip("jsonschema")

from agentrl.chat import parse_tool_calls  # noqa: E402
from agentrl.chat.parse import CallFormat  # noqa: E402

logging.getLogger("sglang").setLevel(logging.CRITICAL)


def _tool(name: str, properties: dict[str, Any] | None, required: list[str] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if required:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": name, "parameters": params}}


TOOLS = [
    _tool("calc", {"code": {"type": "string"}}, ["code"]),
    _tool("search", {"query": {"type": "string"}, "limit": {"type": "integer"}, "score": {"type": "number"},
                     "exact": {"type": "boolean"}, "mode": {"type": "string", "enum": ["fast", "slow"]},
                     "opts": {"type": "object"}, "tags": {"type": "array"}}, ["query"]),
    _tool("alias", {"n": {"type": "int"}, "x": {"type": "float"}, "s": {"type": "str"}, "b": {"type": "bool"},
                    "d": {"type": "dict"}, "l": {"type": "list"}}),
    _tool("union", {"u": {"type": ["integer", "string"]}, "maybe": {"type": ["integer", "null"]},
                    "any": {"anyOf": [{"type": "number"}, {"type": "string"}]}, "e": {"enum": [1, 2, 3]},
                    "opt": {"type": "integer"}}),
    {"type": "function", "function": {"name": "now", "description": "no parameters"}},
]
# Tools of the generated argument classes and of SGLang's own cases; the corpus draws from TOOLS only.
NUM = _tool("num", {"n": {"type": "number"}, "f": {"type": "float"}, "i": {"type": "integer"},
                    "nn": {"type": ["number", "null"]}, "on": {"type": "number", "nullable": True},
                    "an": {"anyOf": [{"type": "number"}, {"type": "null"}]}, "note": {"type": "string"}})
WEATHER = _tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}, ["city"])
ALL_TOOLS = [*TOOLS, NUM, WEATHER]
FORMATS: list[CallFormat] = ["json", "xml"]


# --- the oracle -------------------------------------------------------------------------------

def _served_tools() -> list[dict[str, Any]]:
    tools = copy.deepcopy(ALL_TOOLS)
    for t in tools:
        if t["function"].get("parameters") is not None:
            sglang_utils.normalize_json_schema_types(t["function"]["parameters"])
    return tools


def _runner_validator(params: dict[str, Any], null_served: bool) -> Any:
    """The validating tool runner, reading each argument's schema as SGLang's grammar does (``nullable``).
    ``null_served``: the XML format, whose ``null`` SGLang serves as ``None`` for every parameter type:
    the call is made (the tool then decides), so ``null`` passes for every declared parameter."""
    props = params.get("properties") or {}
    read = {k: sglang_grammar._json_value_schema(v, params) for k, v in props.items()}
    if null_served:
        read = {k: {"anyOf": [v, {"type": "null"}]} for k, v in read.items()}
    checked = {**params, "properties": read}
    return jsonschema.Draft202012Validator(checked if props else params)


SERVED = _served_tools()
PARSERS = {fmt: fcp.FunctionCallParser([protocol.Tool(**t) for t in SERVED], name)
           for fmt, name in (("json", "qwen25"), ("xml", "qwen3_coder"))}
VALIDATORS = {fmt: {t["function"]["name"]: _runner_validator(t["function"].get("parameters") or {}, fmt == "xml")
                    for t in SERVED} for fmt in ("json", "xml")}


class OracleRaised(Exception):
    """SGLang's parser failed on the turn (it then serves the turn with no call)."""


def served(text: str, fmt: CallFormat) -> tuple[str, list[tuple[str, Any]]]:
    """The content SGLang serves for ``text`` (stripped), and the calls a validating tool runner would run."""
    try:
        normal, items = PARSERS[fmt].parse_non_stream(text)
    except Exception as exc:  # qwen25 lets AttributeError/ValueError/TypeError out of detect_and_parse
        raise OracleRaised(type(exc).__name__) from exc
    if fmt == "xml" and not items and "<tool_call>" in text and normal == text:
        raise OracleRaised("qwen3_coder caught its own exception")  # its except branch returns the text whole
    runnable = []
    for item in items:
        args = json.loads(item.parameters)
        validator = VALIDATORS[fmt].get(item.name)
        if validator is not None and isinstance(args, dict) and validator.is_valid(args):
            runnable.append((item.name, args))
    return normal.strip(), runnable


def served_calls(text: str, fmt: CallFormat) -> list[tuple[str, Any]]:
    """The calls SGLang serves for ``text`` that a validating tool runner would run."""
    return served(text, fmt)[1]


def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    return False


STATS: dict[str, Counter[str]] = {fmt: Counter() for fmt in FORMATS}
CLASS_STATS: dict[str, Counter[str]] = {}  # "<format>/<generated class>" or "sglang_own"


def compare(text: str, fmt: CallFormat, group: str | None = None) -> list[tuple[str, Any]] | None:
    """Records one example in ``STATS`` (and ``CLASS_STATS[group]``) and fails on any disagreement
    outside the deliberate ones. Returns the calls both sides run, or None for a deliberate difference."""
    counters = [STATS[fmt], *([CLASS_STATS.setdefault(group, Counter())] if group else [])]

    def count(key: str, value: bool = True) -> None:
        for c in counters:
            c[key] += value

    count("examples")
    try:
        content, expected = served(text, fmt)
    except OracleRaised:
        count("deliberate/sglang_raises")
        return None
    if any(_non_finite(args) for _, args in expected):
        count("deliberate/non_finite")
        return None
    reply = parse_tool_calls(text, fmt, ALL_TOOLS)
    got = [(c.name, c.arguments) for c in reply.calls]
    count("compared")
    count("with_calls", bool(expected))
    count("calls_agree", [n for n, _ in got] == [n for n, _ in expected])
    count("arguments_agree", got == expected)
    count("content_agrees", reply.served_content() == content)
    assert got == expected, f"{fmt}: agentrl {got!r} != SGLang {expected!r} on {text!r}"
    assert reply.served_content() == content, f"{fmt}: content {reply.served_content()!r} != SGLang {content!r} on {text!r}"
    return got


@pytest.fixture(scope="module", autouse=True)
def report_agreement() -> Iterator[None]:
    yield
    summary: dict[str, Any] = {fmt: dict(sorted(c.items())) for fmt, c in STATS.items()}
    summary["classes"] = {group: dict(sorted(c.items())) for group, c in sorted(CLASS_STATS.items())}
    print("\nRESULT " + json.dumps({"sglang_parity": summary}, sort_keys=True))


# --- the corpus ------------------------------------------------------------------------------

safe_text = st.text(st.characters(codec="utf-8", exclude_characters="<>"), max_size=20)
json_scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=6)
json_data = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "string": st.text(max_size=30) | st.sampled_from(["", "03106", "null", "True", "[1, 2]", "def f():\n    x"]),
    "integer": st.integers(-10**9, 10**9), "number": finite | st.integers(-1000, 1000), "boolean": st.booleans(),
    "object": st.dictionaries(st.text(max_size=5), json_data, max_size=3), "array": st.lists(json_data, max_size=3),
    "union": st.integers(-99, 99) | safe_text, "null": st.none(), "enum": st.sampled_from([1, 2, 3]),
}
KIND_OF = {"code": "string", "query": "string", "limit": "integer", "score": "number", "exact": "boolean",
           "mode": "string", "opts": "object", "tags": "array", "n": "integer", "x": "number", "s": "string",
           "b": "boolean", "d": "object", "l": "array", "u": "union", "maybe": "integer", "any": "union",
           "e": "enum", "opt": "integer"}


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    tool = draw(st.sampled_from(TOOLS))["function"]
    props = tool.get("parameters", {}).get("properties", {})
    names = draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
    required = tool.get("parameters", {}).get("required", [])
    args = {n: draw(VALUES[KIND_OF[n]]) for n in [*required, *[n for n in names if n not in required]]}
    return tool["name"], args


def render(fmt: CallFormat, call: tuple[str, dict[str, Any]]) -> str:
    """One call as Qwen3 (JSON) or Qwen3-Coder/Qwen3.5 (XML) render it."""
    name, args = call
    if fmt == "json":
        return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args, ensure_ascii=False)}}}\n</tool_call>'
    params = "".join(f"<parameter={k}>\n{json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v}"
                     f"\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


@st.composite
def turns(draw: st.DrawFn, fmt: CallFormat) -> str:
    prefix = draw(st.sampled_from(["", "Let me check.\n", "Sure.\n\n"]))
    body = "\n".join(render(fmt, c) for c in draw(st.lists(calls(), min_size=1, max_size=3)))
    return prefix + body + draw(st.sampled_from(["", "\n", "\nDone."]))


FRAGMENTS = ["<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>", "<function=", "<function=calc>",
             "</function>", "<parameter=", "<parameter=code>", "</parameter>", "</parameter1>", "</parameter",
             "</parameter_x>", "\n", " ", "{", "}", "[", "]", '"', ",", ":", "null", "NaN", "1e999", "True",
             '"arguments": ', '"parameters": {}', "'", "<", ">", "="]


@st.composite
def corrupted(draw: st.DrawFn, fmt: CallFormat) -> str:
    text = draw(turns(fmt))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "truncate", "duplicate"]))
        if op == "insert":
            text = text[:i] + draw(st.sampled_from(FRAGMENTS)) + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 12)):]
        elif op == "truncate":
            text = text[:i]
        else:
            text = text[:i] + text[i:i + draw(st.integers(1, 30))] + text[i:]
    return text


# The classes the parity issue names, one case or more each (both formats where they apply).
CLASSES: dict[str, list[tuple[CallFormat, str]]] = {
    "no_arguments_key": [("json", '<tool_call>\n{"name": "now"}\n</tool_call>'),
                         ("json", '<tool_call>\n{"name": "calc"}\n</tool_call>'),
                         ("json", '<tool_call>\n{"name": "now", "parameters": {}}\n</tool_call>')],
    "broken_closing_tag": [("xml", f"<tool_call>\n<function=calc>\n<parameter=code>\nx = 1\n{tag}\n</function>\n"
                                   "</tool_call>") for tag in ("</parameter1>", "</parameter_x>", "</parameter")],
    "empty_string_value": [("xml", "<tool_call>\n<function=calc>\n<parameter=code>\n\n</parameter>\n</function>\n"
                                   "</tool_call>"),
                           ("json", '<tool_call>\n{"name": "calc", "arguments": {"code": ""}}\n</tool_call>')],
    "null_optional": [("xml", "<tool_call>\n<function=union>\n<parameter=maybe>\nnull\n</parameter>\n</function>\n"
                              "</tool_call>"),
                      ("xml", "<tool_call>\n<function=union>\n<parameter=opt>\nnull\n</parameter>\n</function>\n"
                              "</tool_call>"),
                      ("json", '<tool_call>\n{"name": "union", "arguments": {"maybe": null}}\n</tool_call>')],
    "null_for_number": [("xml", "<tool_call>\n<function=num>\n<parameter=n>\nnull\n</parameter>\n<parameter=i>\nNULL\n"
                                "</parameter>\n</function>\n</tool_call>")],
    "union_values": [("xml", f"<tool_call>\n<function=union>\n<parameter={p}>\n{v}\n</parameter>\n</function>\n"
                             "</tool_call>") for p, v in [("u", "03106"), ("u", "abc"), ("u", "7"), ("any", "2.5"),
                                                          ("any", "x"), ("e", "2")]],
    "alias_types": [("xml", "<tool_call>\n<function=alias>\n" + "".join(
        f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in [("n", "5"), ("x", "2"), ("s", "007"), ("b", "true"),
                                                             ("d", '{"a": 1}'), ("l", "[1, 2]")])
        + "</function>\n</tool_call>"),
        ("xml", "<tool_call>\n<function=alias>\n<parameter=b>\nyes\n</parameter>\n</function>\n</tool_call>"),
        ("json", '<tool_call>\n{"name": "alias", "arguments": {"n": 5, "x": 2.5, "d": {}}}\n</tool_call>')],
    "text_after_call": [("json", render("json", ("calc", {"code": "1"})) + "\nThe answer is 2."),
                        ("xml", render("xml", ("calc", {"code": "1"})) + "\nThe answer is 2.")],
    "unterminated_after_complete": [
        ("json", render("json", ("calc", {"code": "1"})) + '\n<tool_call>\n{"name": "calc", "argu'),
        ("xml", render("xml", ("calc", {"code": "1"})) + "\n<tool_call>\n<function=calc>\n<parameter=code>\n2")],
    "missing_final_closer": [
        ("json", render("json", ("calc", {"code": "1"}))[:-len("\n</tool_call>")]),
        ("xml", render("xml", ("calc", {"code": "1"}))[:-len("</tool_call>")]),
        ("xml", render("xml", ("calc", {"code": "1"}))[:-len("</function>\n</tool_call>")])],
    "framing": [("json", '<tool_call>{"name": "calc", "arguments": {"code": "1"}}</tool_call>'),
                ("json", '<tool_call>\n{"name": "calc", "arguments": {"code": "</tool_call>"}}\n</tool_call>'),
                ("json", '<tool_call>\n[{"name": "calc", "arguments": {"code": "1"}}, {"name": "now"}]\n</tool_call>'),
                ("xml", "<function=calc>\n<parameter=code>\n1\n</parameter>\n</function>"),
                ("xml", "<tool_call>\n<function=calc >\n<parameter=code>\n1\n</parameter>\n</function>\n</tool_call>")],
    # a turn cut right after the opening marker: its own newline makes it a call start for the JSON format
    "bare_opening_marker": [("json", "Sure.\n\n<tool_call>\n"), ("json", "Sure.\n\n<tool_call>"),
                            ("xml", "Sure.\n\n<tool_call>\n"), ("xml", "Sure.\n\n<tool_call>")],
}
CLASS_CASES = [(name, fmt, text) for name, cases in CLASSES.items() for fmt, text in cases]


@pytest.mark.parametrize("name, fmt, text", CLASS_CASES, ids=[f"{n}-{f}-{i}" for i, (n, f, _) in enumerate(CLASS_CASES)])
def test_issue_classes_agree_with_sglang(name: str, fmt: CallFormat, text: str) -> None:
    compare(text, fmt)


CORPUS = settings(max_examples=800, deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("fmt", FORMATS)
@settings(CORPUS, max_examples=150)
@given(data=st.data())
def test_valid_calls_agree_with_sglang(fmt: CallFormat, data: st.DataObject) -> None:
    text = data.draw(turns(fmt))
    compare(text, fmt)
    assert parse_tool_calls(text, fmt, TOOLS).calls or not served_calls(text, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@CORPUS
@given(data=st.data())
def test_corrupted_calls_agree_with_sglang(fmt: CallFormat, data: st.DataObject) -> None:
    compare(data.draw(corrupted(fmt)), fmt)


# --- generated argument classes: numbers near 2**53 and 2**64, null, non-numeric text, drifted markers --

NUMERIC = ["n", "f", "i", "nn", "on", "an"]  # number, float alias, integer, and three ways to say "nullable"
NEAR = st.builds(lambda base, offset, sign: sign * (base + offset), st.sampled_from([2**53, 2**63, 2**64]),
                 st.integers(-3, 3), st.sampled_from([1, -1]))
NON_NUMERIC = st.sampled_from(["abc", "2026-01-15", "1,5", "12abc", "1_000", " 7 ", "+3", "0x10", "1e3", "", "true",
                               "[1]", "½", "١٢٣", "3 apples", "NULL!"]) | safe_text
MARKERS = ["</parameter1>", "</parameter_function>", "</parameter", "</parameter_x>", "</parameters>",
           "</parameter2>", "</param>", "</parameter >"]


def _xml_call(params: list[tuple[str, str]], tail: str = "</function>") -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function=num>\n{body}{tail}\n</tool_call>"


@st.composite
def class_value(draw: st.DrawFn, cls: str, fmt: CallFormat) -> tuple[str, str]:
    """One numeric-class argument of ``num``: its name and its text in ``fmt``."""
    name = draw(st.sampled_from(NUMERIC))
    if cls == "big_integer":
        return name, str(draw(NEAR))
    if cls == "null":
        return name, "null" if fmt == "json" else draw(st.sampled_from(["null", "NULL", "Null"]))
    text = draw(NON_NUMERIC)
    return name, json.dumps(text, ensure_ascii=False) if fmt == "json" else text


@st.composite
def drifted_call(draw: st.DrawFn) -> str:
    """A ``note`` value followed by a drifted end marker: before the next parameter, before ``</function>``,
    or inside a value that a real ``</parameter>`` closes."""
    value, marker = draw(safe_text), draw(st.sampled_from(MARKERS))
    where = draw(st.sampled_from(["next_parameter", "function_end", "closed"]))
    if where == "closed":
        return _xml_call([("note", f"{value}{marker}"), ("n", "3")])
    rest = "<parameter=n>\n3\n</parameter>\n</function>" if where == "next_parameter" else "</function>"
    return f"<tool_call>\n<function=num>\n<parameter=note>\n{value}\n{marker}\n{rest}\n</tool_call>"


CLASS_NAMES = {"json": ["big_integer", "null", "non_numeric"], "xml": ["big_integer", "null", "non_numeric", "drifted_marker"]}


@st.composite
def class_turns(draw: st.DrawFn, fmt: CallFormat) -> tuple[str, str]:
    """A turn of one or two ``num`` calls whose arguments all come from one generated class."""
    cls = draw(st.sampled_from(CLASS_NAMES[fmt]))
    blocks = []
    for _ in range(draw(st.integers(1, 2))):
        if cls == "drifted_marker":
            blocks.append(draw(drifted_call()))
            continue
        params = dict(draw(st.lists(class_value(cls, fmt), min_size=1, max_size=3)))
        if fmt == "json":
            args = ", ".join(f'"{k}": {v}' for k, v in params.items())
            blocks.append(f'<tool_call>\n{{"name": "num", "arguments": {{{args}}}}}\n</tool_call>')
        else:
            blocks.append(_xml_call(list(params.items())))
    return cls, "\n".join(blocks)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(CORPUS, max_examples=400)
@given(data=st.data())
def test_generated_argument_classes_agree_with_sglang(fmt: CallFormat, data: st.DataObject) -> None:
    cls, text = data.draw(class_turns(fmt))
    compare(text, fmt, group=f"{fmt}/{cls}")


# SGLang's own detector tests for these classes, transcribed: upstream's MalformedParameterEnd cases
# (test/registered/function_call, for SGLang newer than 0.5.23) and the examples the parity issue
# took from them. ``upstream`` is what those tests expect; SGLang 0.5.23 (the oracle, and the version
# agentrl matches) keeps drifted markers in the value and reads a ``number`` through float().
def _weather(city_block: str) -> str:
    return ("<tool_call>\n<function=get_weather>\n"
            f"<parameter=city>\n{city_block}\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


SGLANG_OWN: list[tuple[str, CallFormat, str, dict[str, Any] | None]] = [
    *[(f"drifted_end_marker{m}", "xml", _weather(f"Shanghai\n{m}"), {"city": "Shanghai", "days": 3})
      for m in ("</parameter1>", "</parameter_function>", "</parameter")],
    ("well_formed_value", "xml", _weather("Shanghai\n</parameter>"), {"city": "Shanghai", "days": 3}),
    ("angle_brackets_in_value", "xml", _weather("a <b>tag</b> city\n</parameter>"),
     {"city": "a <b>tag</b> city", "days": 3}),
    *[(f"closed_value_ending_like_a_marker{i}", "xml", _weather(f"{v}\n</parameter>"), {"city": v, "days": 3})
      for i, v in enumerate(["<config>\n  <p>1</p>\n</parameters>", "x </parameterList>"])],
    ("long_whitespace_unclosed", "xml", _weather("a" + " " * 100_000 + "b"), {"city": "a" + " " * 100_000 + "b", "days": 3}),
    ("number_beyond_2**53", "xml", _xml_call([("n", "9007199254740993")]), {"n": 9007199254740993}),
    ("number_beyond_2**53", "json", '<tool_call>\n{"name": "num", "arguments": {"n": 9007199254740993}}\n</tool_call>',
     {"n": 9007199254740993}),
    ("null_for_nullable_number", "xml", _xml_call([("on", "null")]), {"on": None}),
    ("null_for_nullable_number", "json", '<tool_call>\n{"name": "num", "arguments": {"on": null}}\n</tool_call>',
     {"on": None}),
    ("non_numeric_for_number", "xml", _xml_call([("n", "2026-01-15")]), {"n": "2026-01-15"}),
    ("non_numeric_for_number", "json", '<tool_call>\n{"name": "num", "arguments": {"n": "2026-01-15"}}\n</tool_call>',
     {"n": "2026-01-15"}),
]


@pytest.mark.parametrize("name, fmt, text, upstream", SGLANG_OWN,
                         ids=[f"{n}-{f}-{i}" for i, (n, f, _, _) in enumerate(SGLANG_OWN)])
def test_sglang_own_cases_agree_with_sglang_0_5_23(name: str, fmt: CallFormat, text: str,
                                                    upstream: dict[str, Any] | None) -> None:
    compare(text, fmt, group="sglang_own")
    _, served = PARSERS[fmt].parse_non_stream(text)
    upstream_holds = [json.loads(item.parameters) for item in served] == [upstream]
    CLASS_STATS["sglang_own"]["upstream_expectation_missed_by_0.5.23"] += not upstream_holds


# The deliberate differences (docs/chat.md), each shown on a case: SGLang serves a non-finite
# number or, when its parser raises, no call of the turn; agentrl rejects just the offending call.
CLEAN = render("json", ("calc", {"code": "1"}))
DELIBERATE: list[tuple[str, CallFormat, str]] = [
    ("non_finite", "json", '<tool_call>\n{"name": "search", "arguments": {"query": "q", "score": NaN}}\n</tool_call>'),
    ("non_finite", "xml", "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=score>\n"
                          "inf\n</parameter>\n</function>\n</tool_call>"),
    ("sglang_raises", "json", '<tool_call>\n"just a string"\n</tool_call>\n' + CLEAN),
    ("sglang_raises", "json", '<tool_call>\n{"name": ["calc"], "arguments": {}}\n</tool_call>\n' + CLEAN),
    ("sglang_raises", "xml", "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=opts>\n"
                             "{1, 2}\n</parameter>\n</function>\n</tool_call>\n" + render("xml", ("calc", {"code": "1"}))),
]


@pytest.mark.parametrize("kind, fmt, text", DELIBERATE, ids=[f"{k}-{f}-{i}" for i, (k, f, _) in enumerate(DELIBERATE)])
def test_deliberate_differences(kind: str, fmt: CallFormat, text: str) -> None:
    reply = parse_tool_calls(text, fmt, TOOLS)
    if kind == "non_finite":
        assert any(_non_finite(args) for _, args in served_calls(text, fmt))
        assert reply.calls == [] and reply.failures and not any(f.tolerated for f in reply.failures)
    else:
        with pytest.raises(OracleRaised):
            served_calls(text, fmt)
        assert [(c.name, c.arguments) for c in reply.calls] == [("calc", {"code": "1"})]
        assert any(not f.tolerated and f.call_id is None for f in reply.failures)
