"""The OpenAI wire format of the proxy: what a request may hold (and the 400 for what it may not),
and replies the real ``openai`` client's types read back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from _proxy_support import ADD
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import agentrl.proxy
from agentrl.proxy import Reply, RequestError, parse_request
from agentrl.proxy._wire import ParseMemo, _message, completion, stream_events


def test_public_surface_is_pinned() -> None:
    assert set(agentrl.proxy.__all__) == {
        "Agent", "AgentEpisode", "AgentRunner", "ChatRequest", "ProxyConfig", "ProxyServer", "ProxySession", "Reply",
        "RequestError", "SessionError", "check_agent", "parse_request"}
    for name in agentrl.proxy.__all__:
        assert getattr(agentrl.proxy, name) is not None


def test_a_request_with_everything_the_proxy_serves() -> None:
    req = parse_request({
        "model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "1+2"}, {"type": "text", "text": "?"}]},
                                   {"role": "assistant", "content": None, "tool_calls": [
                                       {"id": "c1", "type": "function", "function": {"name": "add",
                                                                                    "arguments": '{"a": 1, "b": 2}'}}]},
                                   {"role": "tool", "tool_call_id": "c1", "content": "3"}],
        "tools": [ADD], "tool_choice": "auto", "temperature": 0.5, "top_p": 0.9, "max_tokens": 10,
        "max_completion_tokens": 7, "stop": "END", "stream": True, "stream_options": {"include_usage": True},
        "n": 1, "user": "u", "parallel_tool_calls": True, "seed": 3})
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[1].content == "1+2 ?"  # text parts joined with a space, as SGLang joins them
    assert req.messages[2].tool_calls[0].arguments == {"a": 1, "b": 2}
    assert (req.temperature, req.top_p, req.max_tokens, req.stop) == (0.5, 0.9, 7, ("END",))
    assert req.stream and req.include_usage and req.render_tools == [ADD] and not req.forced


def test_tool_turns_as_openai_allows_them() -> None:
    """Several calls answered in any order, a result without an id, a request ending on a call."""
    two = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "add", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}
    user = {"role": "user", "content": "x"}
    for tail in ([{"role": "tool", "tool_call_id": "b", "content": "1"}, {"role": "tool", "tool_call_id": "a", "content": "2"},
                  user], [{"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}, user], []):
        assert len(parse_request({"messages": [user, two, *tail]}).messages) == 2 + len(tail)
    with pytest.raises(RequestError, match=r"tool_call_ids \['b'\]"):  # one of two answered
        parse_request({"messages": [user, two, {"role": "tool", "tool_call_id": "a", "content": "1"}, user]})


def test_tool_choice_none_renders_no_tools_and_a_named_choice_renders_only_that_tool() -> None:
    other = {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}], "tools": [ADD, other]}
    assert parse_request({**base, "tool_choice": "none"}).render_tools is None
    named = parse_request({**base, "tool_choice": {"type": "function", "function": {"name": "mul"}}})
    assert named.forced and named.named and named.render_tools == [other]
    assert parse_request({**base, "tool_choice": "required"}).forced


CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"messages": []}, "messages", "non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "expected one of"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]", "text parts only"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": "{bad"}}]}]},
     "messages[0]", "JSON object string"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n", "expected 1"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs", "not served"),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}, "response_format",
     "text"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"1": 2}}, "logit_bias", "not supported"),
    ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 0.5}, "presence_penalty", "expected 0"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature", "[0, 2]"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}, "stop", "up to 4"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice", "without tools"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [ADD],
      "tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice", "not in tools"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]}, "tools[0]", "function"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [ADD, ADD]}, "tools", "unique"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {
        "name": "add", "parameters": '{"type": "object"}'}}]}, "tools[0].function.parameters", "JSON-schema object"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "3"}]},
     "messages[1].role", "must answer a preceding assistant message with 'tool_calls'"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "I add."},
                   {"role": "tool", "tool_call_id": "c1", "content": "3"}]},
     "messages[2].role", "must answer a preceding assistant message"),
    ({"messages": [{"role": "user", "content": "x"}, CALLED, {"role": "user", "content": "well?"}]},
     "messages[2].role", "no 'tool' message answers before this 'user' message (tool_call_ids ['c1'])"),
    ({"messages": [{"role": "user", "content": "x"}, CALLED, {"role": "tool", "tool_call_id": "c9", "content": "3"}]},
     "messages[2].tool_call_id", "expected one of the ids of messages[1].tool_calls ['c1']"),
])
def test_a_request_the_proxy_cannot_honour_is_a_400_naming_the_field(body: dict[str, Any], param: str,
                                                                      says: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_request(body)
    assert info.value.status == 400 and info.value.param == param and says in info.value.message


REPLY = Reply(response_id="chatcmpl-x", created=1, model="m", content="", reasoning="think",
              calls=(("call_1", "add", {"a": 1, "b": 2}),), finish_reason="tool_calls", prompt_tokens=10,
              completion_tokens=5, cached_tokens=2)


def test_a_reply_is_a_chat_completion_the_openai_types_read() -> None:
    parsed = ChatCompletion.model_validate(orjson.loads(completion(REPLY)))
    message = parsed.choices[0].message
    assert message.content is None and message.tool_calls is not None
    assert message.tool_calls[0].id == "call_1" and message.tool_calls[0].function.arguments == '{"a": 1, "b": 2}'
    assert parsed.choices[0].finish_reason == "tool_calls"
    assert parsed.usage is not None and (parsed.usage.prompt_tokens, parsed.usage.total_tokens) == (10, 15)
    assert (message.model_extra or {}).get("reasoning_content") == "think"


def test_a_streamed_reply_is_chunks_then_done() -> None:
    events = stream_events(REPLY, include_usage=True).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [ChatCompletionChunk.model_validate(orjson.loads(e.removeprefix(b"data: "))) for e in events[:-2]]
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert calls and calls[0] is not None and calls[0][0].function is not None
    assert calls[0][0].function.name == "add"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


# -- a session's parse memo ------------------------------------------------------------------------
OPENING = [{"role": "system", "content": "You add."}, {"role": "user", "content": "1+2?"}]


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the messages ``parse_request`` parses (rather than carries over)."""
    parsed: list[int] = []
    original = agentrl.proxy._wire._message

    def message(raw: Any, i: int) -> Any:
        parsed.append(i)
        return original(raw, i)

    monkeypatch.setattr(agentrl.proxy._wire, "_message", message)
    return parsed


def follow_up(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """The harness's next request, decoded afresh as the server decodes every body: the history, the
    reply as the client got it, a tool result."""
    sent = orjson.loads(completion(reply))["choices"][0]["message"]
    return orjson.loads(orjson.dumps({**body, "messages": [*body["messages"], sent, {
        "role": "tool", "tool_call_id": reply.calls[0][0], "content": "3"}]}))


def test_a_resent_history_is_parsed_once_and_comes_back_as_the_same_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = counting(monkeypatch)
    memo = ParseMemo()
    body = {"model": "m", "messages": OPENING, "tools": [ADD]}
    first = parse_request(orjson.loads(orjson.dumps(body)), memo)
    memo.replied(REPLY)
    second_body = follow_up(body, REPLY)
    second = parse_request(second_body, memo)
    assert parsed == [0, 1, 3]  # the opening once, then only the tool result: the echoed reply is known
    assert all(a is b for a, b in zip(first.messages, second.messages[:2], strict=True))
    assert second.tools is first.tools
    # the echo stands for what parsing the reply's message gives, as the sequence's history holds it
    echoed, again = second.messages[2], _message(second_body["messages"][2], 2)[0]
    assert echoed == again and echoed.tool_calls[0].id == "call_1" and echoed.reasoning_content == "think"
    third = parse_request(orjson.loads(orjson.dumps(second_body)), memo)  # a retry: the same request again
    assert parsed == [0, 1, 3] and all(a is b for a, b in zip(second.messages, third.messages, strict=True))


def test_a_rewritten_history_is_parsed_anew_and_nothing_stale_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = counting(monkeypatch)
    memo = ParseMemo()
    body = {"messages": OPENING, "tools": [ADD]}
    parse_request(orjson.loads(orjson.dumps(body)), memo)
    memo.replied(REPLY)
    changed = follow_up(body, REPLY)
    changed["messages"][1]["content"] = "2+2?"  # the harness rewrote the question
    changed["messages"][2]["content"] = "I will add."  # and the reply it echoes
    changed["tools"] = [{"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}]
    req = parse_request(changed, memo)
    assert [m.content for m in req.messages[:3]] == ["You add.", "2+2?", "I will add."]
    assert parsed == [0, 1, 1, 2, 3]  # a departing request: each message parsed or found by its JSON (the first)
    assert req.tools is not None and req.tools[0]["function"]["name"] == "mul"
    rolled_back = orjson.loads(orjson.dumps(body))  # back to the first request: found by its JSON, not reparsed
    assert [m.content for m in parse_request(rolled_back, memo).messages] == ["You add.", "1+2?"]
    assert parsed == [0, 1, 1, 2, 3]


@pytest.mark.parametrize("reply", [
    REPLY,
    Reply(response_id="r", created=1, model="m", content="3", reasoning=None, calls=(), finish_reason="stop",
          prompt_tokens=1, completion_tokens=1),
    Reply(response_id="r", created=1, model="m", content="Let me add.", reasoning="a\nb",
          calls=(("call_a", "add", {"a": 1, "b": [2, {"c": None}]}), ("call_b", "mul", {})),
          finish_reason="tool_calls", prompt_tokens=1, completion_tokens=1),
    Reply(response_id="r", created=1, model="m", content="", reasoning=None, calls=(), finish_reason="length",
          prompt_tokens=1, completion_tokens=1),
])
def test_a_replys_echo_is_exactly_what_parsing_its_message_gives(reply: Reply) -> None:
    sent, message = reply.echo()
    assert sent == reply.message()
    assert (message, sent) == _message(orjson.loads(orjson.dumps(sent)), 0)
