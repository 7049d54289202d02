"""The Hugging Face-equivalent Jinja environment behind ChatTemplate (any model's own template)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.utils.chat_template_utils import render_jinja_template

import agentrl.chat
from agentrl.chat import ChatTemplate, ChatTemplateError
from agentrl.testing import build_tokenizer

# A template using every environment feature a model's own template may rely on.
FEATURES = """{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}
{%- if m.role == 'skip' %}{% continue %}{% endif -%}
{%- set ns.n = ns.n + 1 -%}
{{ ns.n }}:{{ m.role }}:{% generation %}{{ m.content }}{% endgeneration %}|{{ m.meta | tojson }}|{{ m.meta | tojson(indent=1) }}
{%- if m.role == 'stop' %}{% break %}{% endif %}
{% endfor -%}
{{ tools | tojson }}{{ dict(a=1) | tojson }}{% if add_generation_prompt %}<gen>{% endif %}{{ extra }}"""
_TEMPLATE_WITH_TOKENIZER = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
MESSAGES = [{"role": "user", "content": "a < b & 'c'", "meta": {"z": 1, "a": "数", "h": "<b>"}},
            {"role": "skip", "content": "x", "meta": {}},
            {"role": "stop", "content": "  keep  ", "meta": {"k": [1, 2]}},
            {"role": "user", "content": "never", "meta": {}}]


def _hf(template: str, **kw: Any) -> str:
    return str(render_jinja_template([MESSAGES], chat_template=template, **kw)[0][0])


@pytest.mark.parametrize("gp", [True, False])
def test_environment_matches_transformers(gp: bool) -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "é & <x>"}}]
    mine = ChatTemplate(FEATURES, name="features", tool_call_format="json")
    expected = _hf(FEATURES, tools=tools, add_generation_prompt=gp, extra="!")
    assert mine.render(MESSAGES, tools, add_generation_prompt=gp, extra="!") == expected
    assert '"z": 1, "a": "数", "h": "<b>"' in expected  # insertion order, no escaping, non-ASCII kept


def test_raise_exception_becomes_chat_template_error() -> None:
    tpl = ChatTemplate("{{ raise_exception('bad conversation: ' ~ messages|length) }}", name="strict")
    with pytest.raises(ChatTemplateError, match="bad conversation: 1"):
        tpl.render([{"role": "user", "content": "x"}])


def test_namespace_refuses_private_names_and_sandbox_blocks_internals() -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% set ns = namespace(a=1) %}{% set ns._x = 2 %}{{ ns._x }}").render([{"role": "user"}])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}").render([{"role": "user"}])
    with pytest.raises(ChatTemplateError):  # the environment is immutable: no in-place list/dict changes
        ChatTemplate("{{ messages.append(1) }}").render([{"role": "user"}])


def test_remembered_attribute_verdicts_still_refuse() -> None:
    """The sandbox remembers its verdict per (type, attribute): asked again, it refuses again, and an
    object whose ``__class__`` is not its type is judged afresh."""
    for _ in range(2):
        with pytest.raises(ChatTemplateError):
            ChatTemplate("{{ messages.append(1) }}").render([{"role": "user"}])
        with pytest.raises(ChatTemplateError):
            ChatTemplate("{{ ''.__class__.__subclasses__() }}").render([{"role": "user"}])
    ok = ChatTemplate("{{ messages[0]['content'].upper() }}|{{ messages[0]['content'].startswith('h') }}")
    assert ok.render([{"role": "user", "content": "hi"}]) == ok.render([{"role": "user", "content": "hi"}]) == "HI|True"

    from agentrl.chat._jinja import compile_template

    class Shifty:
        """Claims to be a list when told to (as proxies and mocks may)."""

        def __init__(self, disguised: bool) -> None:
            self.disguised = disguised

        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return list if self.disguised else Shifty

        def append(self, item: object) -> None: ...

    env = compile_template("{{ x }}").environment
    plain, disguised = Shifty(False), Shifty(True)
    assert env.is_safe_attribute(plain, "append", plain.append) is True  # remembered for Shifty
    assert env.is_safe_attribute(disguised, "append", disguised.append) is False  # judged as the list it claims


def test_strftime_now_and_trailing_newline() -> None:
    out = ChatTemplate("{{ strftime_now('%Y') }}\n").render([{"role": "user"}])
    assert len(out) == 4 and out.isdigit()  # keep_trailing_newline is off, as in transformers


def test_from_tokenizer_uses_its_template_and_special_tokens() -> None:
    tok = build_tokenizer(chat_template="{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}")
    tpl = ChatTemplate.from_tokenizer(tok)
    assert tpl.render([{"role": "user", "content": "hi"}]) == "hi<|im_end|>"
    assert tpl.tool_call_format == "json" and tpl.turn_close == "<|im_end|>"
    assert tpl.encode([{"role": "user", "content": "hi"}]) == tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=True, return_dict=False)


def test_public_surface() -> None:
    for name in agentrl.chat.__all__:
        assert getattr(agentrl.chat, name) is not None
    assert {"ChatTemplate", "ChatTemplateError", "BridgeOutcome", "BridgeResult", "BridgePiece", "BridgeSession",
            "bridge_turn", "TEMPLATE_NAMES", "detect_tool_call_format", "Message", "ToolCall"} <= set(agentrl.chat.__all__)


@settings(max_examples=100, deadline=None)
@given(text=st.lists(st.sampled_from([*"ab c\n\t数é<>|_/", "<|im_end|>", "<tool_call>", "</think>"]), max_size=60)
       .map("".join))
def test_tokenize_and_decode_match_the_tokenizer(text: str) -> None:
    tpl = _TEMPLATE_WITH_TOKENIZER
    assert tpl.tokenize(text) == tpl.tokenizer.encode(text, add_special_tokens=False)
    ids = tpl.tokenize(text)
    assert tpl.decode(ids) == tpl.tokenizer.decode(ids, skip_special_tokens=False)


def test_as_message_dicts_is_what_the_template_renders() -> None:
    tpl = ChatTemplate.from_name("qwen3")
    mixed: list[Any] = [{"role": "user", "content": "Hi", "name": None},
                        agentrl.chat.Message("assistant", "Hello", reasoning_content="because")]
    dicts = agentrl.chat.as_message_dicts(mixed)
    assert dicts == [{"role": "user", "content": "Hi"},
                     {"role": "assistant", "content": "Hello", "reasoning_content": "because", "thinking": "because"}]
    assert tpl.render(dicts) == tpl.render(mixed)
