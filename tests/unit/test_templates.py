"""ChatTemplate rendering: golden vectors, official-template renders, Hugging Face parity, errors, inputs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import chat_golden as g
import pytest

from agentrl.chat import ChatTemplate, ChatTemplateError, Message, ToolCall, detect_tool_call_format
from agentrl.testing import build_tokenizer

FORMATS = {"qwen3": "Q3", "qwen3_coder": "QC", "qwen3_5": "Q35"}
OFFICIAL = json.loads((Path(__file__).parent.parent / "data" / "chat_templates_official.json").read_text("utf-8"))


def vec(prefix: str, name: str) -> str:
    return str(getattr(g, f"{prefix}_{name}"))


# -- golden vectors (reference section 4) -----------------------------------------------------------
@pytest.mark.parametrize("name", FORMATS)
def test_golden_full_render(name: str) -> None:
    x = FORMATS[name]
    assert ChatTemplate.from_name(name).render(g.MSGS, tools=[g.CALC]) == vec(x, "HEADER") + vec(x, "BODY")


@pytest.mark.parametrize("name", FORMATS)
def test_golden_generation_prompt(name: str) -> None:
    x = FORMATS[name]
    rendered = ChatTemplate.from_name(name).render(g.MSGS[:1], tools=[g.CALC], add_generation_prompt=True)
    assert rendered == vec(x, "GEN_PROMPT")


@pytest.mark.parametrize("name", FORMATS)
def test_golden_tool_segment_and_prefix(name: str) -> None:
    x = FORMATS[name]
    tpl = ChatTemplate.from_name(name)
    after_tool = tpl.render(g.MSGS[:3], tools=[g.CALC], add_generation_prompt=True)
    assert after_tool == vec(x, "GEN_PROMPT") + vec(x, "TARGET") + vec(x, "TOOL_SEGMENT")
    assert tpl.render(g.MSGS, tools=[g.CALC]).startswith(after_tool)


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_golden_q3b_thinking_is_dropped_after_a_new_query(name: str) -> None:
    tpl = ChatTemplate.from_name(name)
    hi = [{"role": "user", "content": "Hi"}, {"role": "assistant", "reasoning_content": "think A", "content": "Hello"}]
    assert tpl.render(hi).endswith("<|im_start|>assistant\n<think>\nthink A\n</think>\n\nHello<|im_end|>\n")
    more = tpl.render([*hi, {"role": "user", "content": "More"}])
    assert "<|im_start|>assistant\nHello<|im_end|>\n" in more and "think A" not in more
    bare = tpl.render([hi[0], {"role": "assistant", "content": "Hello"}])
    assert bare.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n")


# -- every section-2 case, against the official templates' renders ------------------------------------
def _record_id(record: dict[str, Any]) -> str:
    return f"{record['case']}-{record['variant']}"


@pytest.mark.parametrize("record", OFFICIAL["records"], ids=_record_id)
@pytest.mark.parametrize("name", FORMATS)
def test_matches_official_template(name: str, record: dict[str, Any]) -> None:
    tpl = ChatTemplate.from_name(name)
    expected = record["expected"][name]
    call = (record["messages"], record["tools"], record["add_generation_prompt"])
    if "error" in expected:
        with pytest.raises(ChatTemplateError):
            tpl.render(*call, **record["template_kwargs"])
    else:
        assert tpl.render(*call, **record["template_kwargs"]) == expected["output"]


def test_fixture_covers_the_section_2_items() -> None:
    cases = {r["case"] for r in OFFICIAL["records"]}
    assert {"no_tools_no_system", "no_tools_system", "tools_system", "parallel_calls", "multiple_turns",
            "consecutive_tool_results", "all_argument_types", "reasoning_before_and_after_last_query",
            "second_user_query_after_tool_round", "non_ascii", "special_chars_in_descriptions",
            "no_user_query", "system_not_first", "unknown_role", "json_string_arguments"} <= cases
    variants = {r["variant"] for r in OFFICIAL["records"]}
    assert variants == {"gen_off", "gen_on", "thinking_on", "thinking_off"}


# -- spelled-out rules, for readability of failures -------------------------------------------------
ARGS = {"code": "def f():\n    return 1\n", "n": 5, "x": 0.5, "ok": True, "none": None, "obj": {"lang": "en", "n": 1},
        "arr": ["x", "y"], "zip": "03106"}


def _call_turn(name: str) -> str:
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "reasoning_content": "r",
             "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": ARGS}}]}]
    return ChatTemplate.from_name(name).render(msgs)


def test_qwen3_json_arguments_keep_order_types_and_escapes() -> None:
    assert ('<tool_call>\n{"name": "calc", "arguments": {"code": "def f():\\n    return 1\\n", "n": 5, "x": 0.5, '
            '"ok": true, "none": null, "obj": {"lang": "en", "n": 1}, "arr": ["x", "y"], "zip": "03106"}}\n'
            '</tool_call><|im_end|>') in _call_turn("qwen3")


def test_qwen3_5_xml_values() -> None:
    out = _call_turn("qwen3_5")
    assert "<parameter=code>\ndef f():\n    return 1\n\n</parameter>\n" in out
    for shown in ("5", "0.5", "True", "None", '{"lang": "en", "n": 1}', '["x", "y"]', "03106"):
        assert f">\n{shown}\n</parameter>" in out


def test_qwen3_coder_xml_values_are_python_str() -> None:
    out = _call_turn("qwen3_coder")
    for shown in ("True", "None", "{'lang': 'en', 'n': 1}", "['x', 'y']", "03106"):
        assert f">\n{shown}\n</parameter>" in out


def test_tojson_keeps_non_ascii_and_html_characters() -> None:
    tool = {"type": "function", "function": {"name": "q", "description": "a < b & 'c' \"d\" 数", "parameters": {}}}
    out = ChatTemplate.from_name("qwen3").render([{"role": "user", "content": "x"}], tools=[tool])
    assert '"description": "a < b & \'c\' \\"d\\" 数"' in out


def test_enable_thinking_false_prefills_an_empty_block() -> None:
    msgs = [{"role": "user", "content": "x"}]
    assert ChatTemplate.from_name("qwen3").render(msgs, add_generation_prompt=True, enable_thinking=False) \
        .endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert ChatTemplate.from_name("qwen3_5").render(msgs, add_generation_prompt=True).endswith("assistant\n<think>\n")


# -- inputs -----------------------------------------------------------------------------------------
def test_message_objects_and_none_values() -> None:
    tpl = ChatTemplate.from_name("qwen3")
    objs = [Message("user", "2**10?"), Message("assistant", "", reasoning_content="Use code.",
                                                 tool_calls=[ToolCall("calc", {"code": "print(2**10)"})]),
            Message("tool", "1024", tool_call_id=None), Message("assistant", "\\boxed{1024}", reasoning_content="Done.")]
    assert tpl.render(objs, tools=[g.CALC]) == g.Q3_HEADER + g.Q3_BODY
    # content=None is dropped (undefined to the template), never rendered as the text "None".
    with_none = [{"role": "user", "content": "hi", "name": None}, {"role": "assistant", "content": None}]
    assert "None" not in tpl.render(with_none)


def test_reasoning_aliases() -> None:
    tpl = ChatTemplate.from_name("qwen3")
    base = [{"role": "user", "content": "Hi"}]
    for key in ("reasoning_content", "thinking", "reasoning"):
        out = tpl.render([*base, {"role": "assistant", "content": "Hello", key: "because"}])
        assert out.endswith("<think>\nbecause\n</think>\n\nHello<|im_end|>\n"), key


def test_message_and_renderer_pick_the_same_reasoning_alias() -> None:
    """With both ``thinking`` and ``reasoning`` set, ``Message.from_dict`` and the renderer agree on ``thinking``."""
    tpl = ChatTemplate.from_name("qwen3")
    base = [{"role": "user", "content": "Hi"}]
    reply = {"role": "assistant", "content": "Hello", "reasoning": "second", "thinking": "first"}
    assert Message.from_dict(reply).reasoning_content == "first"
    out = tpl.render([*base, reply])
    assert out.endswith("<think>\nfirst\n</think>\n\nHello<|im_end|>\n")
    assert tpl.render([*base, Message.from_dict(reply)]) == out


@dataclasses.dataclass
class _Note:
    role: str
    content: str


class _ToolObject:
    def to_openai(self) -> dict[str, Any]:
        return g.CALC


def test_dataclass_messages_and_tool_objects() -> None:
    out = ChatTemplate.from_name("qwen3").render([_Note("user", "2**10?")], tools=[_ToolObject()],
                                                  add_generation_prompt=True)
    assert out == g.Q3_GEN_PROMPT


@pytest.mark.parametrize("bad, field", [([], "messages"), ("hello", "messages"), ([object()], "messages[0]"),
                                        ([{"role": "user", "content": {1, 2}}], "messages[0].content")])
def test_bad_messages_name_the_field(bad: Any, field: str) -> None:
    with pytest.raises((TypeError, ValueError), match=field.replace("[", r"\[").replace("]", r"\]")):
        ChatTemplate.from_name("qwen3").render(bad)


def test_bad_tools_name_the_field() -> None:
    with pytest.raises(TypeError, match=r"tools\[1\]"):
        ChatTemplate.from_name("qwen3").render([{"role": "user", "content": "x"}], tools=[g.CALC, 42])


def test_unknown_template_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="qwen3_coder"):
        ChatTemplate.from_name("llama")


# -- Hugging Face parity on the local tokenizer -------------------------------------------------------
PARITY_RECORDS = [r for r in OFFICIAL["records"] if r["variant"] in ("gen_off", "gen_on")]


@pytest.mark.parametrize("name", FORMATS)
def test_parity_with_apply_chat_template(name: str, tok: Any) -> None:
    source = ChatTemplate.from_name(name).source
    hf = build_tokenizer(chat_template=source)
    mine = ChatTemplate.from_name(name, tokenizer=tok)
    own = ChatTemplate.from_tokenizer(hf)
    assert own.tool_call_format == mine.tool_call_format == ("json" if name == "qwen3" else "xml")
    compared = 0
    for record in PARITY_RECORDS:
        kwargs = {"tools": record["tools"], "add_generation_prompt": record["add_generation_prompt"]}
        try:
            expected = hf.apply_chat_template(record["messages"], tokenize=False, **kwargs)
        except Exception:
            with pytest.raises(ChatTemplateError):
                mine.render(record["messages"], **kwargs)
            continue
        assert mine.render(record["messages"], **kwargs) == expected == own.render(record["messages"], **kwargs)
        ids = hf.apply_chat_template(record["messages"], tokenize=True, return_dict=False, **kwargs)
        assert mine.encode(record["messages"], **kwargs) == list(ids)
        compared += 1
    assert compared >= 20


def test_detect_tool_call_format() -> None:
    assert detect_tool_call_format(ChatTemplate.from_name("qwen3").source) == "json"
    assert detect_tool_call_format(ChatTemplate.from_name("qwen3_5").source) == "xml"
    assert detect_tool_call_format("{{ '<parameter=' }}") == "xml"


# -- stops -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FORMATS)
def test_stop_tokens_resolved_by_string(name: str, tok: Any) -> None:
    tpl = ChatTemplate.from_name(name, tokenizer=tok)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    call_close = tok.convert_tokens_to_ids("</tool_call>")
    assert tpl.stop_strings() == ("<|im_end|>",)
    assert tpl.stop_token_ids() == (im_end,)
    assert tpl.stop_strings(one_call_per_turn=True) == ("<|im_end|>", "</tool_call>")
    assert tpl.stop_token_ids(one_call_per_turn=True) == (im_end, call_close)
    assert tpl.turn_close_id == im_end


def test_stop_token_ids_need_a_tokenizer() -> None:
    with pytest.raises(ValueError, match="needs a tokenizer"):
        ChatTemplate.from_name("qwen3").stop_token_ids()


def test_turn_close_id_needs_a_tokenizer_and_a_turn_close() -> None:
    class _NoEos:
        special_tokens_map: dict[str, str] = {}  # noqa: RUF012

    with pytest.raises(ValueError, match="needs a tokenizer"):
        _ = ChatTemplate.from_name("qwen3").turn_close_id
    with pytest.raises(ValueError, match="cannot tell which token closes a turn"):
        _ = ChatTemplate("{{ messages[0].content }}", tokenizer=_NoEos()).turn_close_id


def test_tokenizer_without_the_turn_close_token_is_rejected() -> None:
    class _Plain:
        special_tokens_map: dict[str, str] = {}  # noqa: RUF012

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text]

    with pytest.raises(ValueError, match="not a single token"):
        ChatTemplate.from_name("qwen3", tokenizer=_Plain())


def test_real_tool_objects_render_like_their_schema() -> None:
    from agentrl.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    msgs = [{"role": "user", "content": "1+2?"}]
    for name in FORMATS:
        tpl = ChatTemplate.from_name(name)
        assert tpl.render(msgs, tools=[add]) == tpl.render(msgs, tools=[add.schema()])
        assert "add" in tpl.render(msgs, tools=[add])
