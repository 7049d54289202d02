"""The OpenAI Chat Completions wire format of the proxy: requests in, replies and stream chunks out.

:func:`parse_request` turns a request body into a typed :class:`ChatRequest` or raises
:class:`RequestError` naming the field, the value and what was expected (served as HTTP 400 in
OpenAI's error shape). Accepted: ``messages`` (``system``/``developer``/``user``/``assistant``/
``tool``; content a string, ``null`` or a list of text parts, joined with a space as SGLang joins
them for string-content templates), ``tools`` (functions), ``tool_choice`` (``auto``, ``none``,
``required``, a named function), ``temperature``, ``top_p``, ``max_tokens``,
``max_completion_tokens``, ``stop``, ``stream`` with ``stream_options.include_usage``, ``n`` = 1,
and keys that change nothing here (``model``, ``user``, ``metadata``, ``store``,
``parallel_tool_calls``, ``service_tier``, ``seed``). A key that would change the answer in a
way the proxy cannot honour (``logprobs``, ``response_format`` other than text, ``logit_bias``,
penalties, ``n`` > 1, images, legacy ``functions``) is a 400, never silently ignored; so is what
OpenAI refuses itself: a tool whose ``parameters`` is not an object, and tool turns out of order
(:func:`check_tool_turns`).

:func:`completion` and :func:`stream_events` build the answer from a :class:`Reply`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from agentrl.chat.types import Message, ToolCall

__all__ = ["ChatRequest", "ParseMemo", "Reply", "RequestError", "check_tool_turns", "completion", "error_body",
           "parse_request", "stream_events"]

# json.dumps builds a new encoder for every call whose options differ from the defaults: one for the
# arguments string of every call the proxy returns, with json.dumps's spelling ({"a": 1}).
_ARGUMENTS_JSON = json.JSONEncoder(ensure_ascii=False)
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_PLAIN_KEYS = frozenset(("model", "messages", "tools"))
_REFUSED = ("logit_bias", "functions", "function_call", "audio", "modalities", "prediction", "web_search_options")


class RequestError(ValueError):
    """A request the proxy refuses: ``status`` (400 unless said), the ``param`` at fault, an error ``code``."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


@dataclass(frozen=True)
class ChatRequest:
    """One parsed request. ``messages`` as :class:`Message` (tool-call arguments decoded to dicts),
    ``raw`` the request's messages as sent (its ``tool_calls`` ids and content are what recognises the
    proxy's own replies), ``tool_choice`` is ``"auto"``, ``"none"``, ``"required"`` or a function name."""

    messages: list[Message]
    raw: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"
    named: bool = False  # tool_choice names one function (``tool_choice`` holds its name)
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def render_tools(self) -> list[dict[str, Any]] | None:
        """The tools the prompt lists, as SGLang renders them: none under ``tool_choice="none"``, only
        the named one under a named choice."""
        if not self.tools or self.tool_choice == "none":
            return None
        if self.named:
            return [t for t in self.tools if t["function"]["name"] == self.tool_choice]
        return self.tools

    @property
    def forced(self) -> bool:
        """Whether the reply must be a tool call (``required`` or a named function)."""
        return self.named or self.tool_choice == "required"


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise RequestError(f"{key}: got {value!r}; expected a number in [{lo:g}, {hi:g}]", param=key)
    return float(value)


def _tokens(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(f"{key}: got {value!r}; expected an integer >= 1", param=key)
        return value
    return None


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(f"stop: got {stop!r:.120}; expected a non-empty string or a list of up to 4 of them",
                           param="stop")
    return tuple(stop)


def _content(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise RequestError(f"{where}: got {type(value).__name__}; expected a string, null or a list of text parts",
                           param=where)
    texts = []
    for i, part in enumerate(value):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type") in ("text", "input_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise RequestError(f"{where}[{i}]: a {kind!r} part; expected text parts only (the proxy serves text "
                               "models)", param=f"{where}[{i}]")
    return " ".join(texts)  # as SGLang joins text parts for a string-content template


def _message(raw: Any, i: int) -> tuple[Message, dict[str, Any]]:
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise RequestError(f"{where}: got {type(raw).__name__}; expected a message object", param=where)
    role = _ROLES.get(raw.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise RequestError(f"{where}.role: got {raw.get('role')!r}; expected one of {sorted(_ROLES)}",
                           param=f"{where}.role")
    plain: dict[str, Any] = {"role": role, "content": _content(raw.get("content"), f"{where}.content")}
    for key in ("tool_call_id", "name", "reasoning_content"):
        if raw.get(key) is not None:
            if not isinstance(raw[key], str):
                raise RequestError(f"{where}.{key}: got {raw[key]!r:.80}; expected a string", param=f"{where}.{key}")
            plain[key] = raw[key]
    calls = raw.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise RequestError(f"{where}.tool_calls: expected a list on an assistant message", param=f"{where}.tool_calls")
        plain["tool_calls"] = calls
    try:
        message = Message.from_dict(plain)
    except (TypeError, ValueError) as exc:
        raise RequestError(f"{where}: {exc}", param=where) from None
    kept = dict(raw)
    kept["content"] = plain["content"]
    return message, kept


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise RequestError(f"tools: got {type(tools).__name__}; expected a list of function tools", param="tools")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type", "function") != "function" or not isinstance(fn, Mapping) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"tools[{i}]: got {tool!r:.120}; expected {{\"type\": \"function\", \"function\": "
                               "{\"name\": ..., \"parameters\": {...}}}", param=f"tools[{i}]")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise RequestError(f"tools[{i}].function.parameters: got {type(params).__name__} {params!r:.80}; expected "
                               "a JSON-schema object (or left out)", param=f"tools[{i}].function.parameters")
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    names = [str(t["function"]["name"]) for t in out]
    if len(set(names)) != len(names):
        raise RequestError(f"tools: names {names} repeat; expected unique tool names", param="tools")
    return out or None


def check_tool_turns(messages: Sequence[Message]) -> None:
    """OpenAI's rules for tool turns, which it answers with a 400: a ``tool`` message answers a call of
    the assistant message before it (directly or after other tool messages; by ``tool_call_id`` when
    both carry ids), and every call of an assistant message is answered before a message of another
    role follows. (An assistant message with calls may end the request.)"""
    asked = -1  # the assistant message whose calls are open
    unanswered: list[str | None] = []
    for i, message in enumerate(messages):
        if message.role != "tool":
            if unanswered:
                named = [c for c in unanswered if c is not None]
                raise RequestError(f"messages[{i}]: the assistant message messages[{asked}] has 'tool_calls' that no "
                                   f"'tool' message answers before this {message.role!r} message"
                                   + (f" (tool_call_ids {named})" if named else ""), param=f"messages[{i}].role")
            calls = message.tool_calls
            asked = i if calls and message.role == "assistant" else -1
            if asked >= 0:
                unanswered = [c.id for c in calls]
            continue
        if asked < 0:
            raise RequestError(f"messages[{i}]: a 'tool' message must answer a preceding assistant message with "
                               "'tool_calls'; none is open here", param=f"messages[{i}].role")
        cid = message.tool_call_id
        if cid in unanswered:
            unanswered.remove(cid)
            continue
        ids = sorted(c.id for c in messages[asked].tool_calls if c.id is not None)
        if cid is not None and ids and cid not in ids:
            raise RequestError(f"messages[{i}].tool_call_id: got {cid!r:.80}; expected one of the ids of "
                               f"messages[{asked}].tool_calls {ids}", param=f"messages[{i}].tool_call_id")
        if unanswered:
            unanswered.pop(0)


def _tool_choice(body: Mapping[str, Any], tools: list[dict[str, Any]] | None) -> tuple[str, bool]:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto", False
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise RequestError("tool_choice: 'required' without tools; expected a non-empty tools list",
                               param="tool_choice")
        return str(choice), False
    fn = choice.get("function") if isinstance(choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise RequestError(f"tool_choice: got {choice!r:.120}; expected 'auto', 'none', 'required' or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")
    if name not in {t["function"]["name"] for t in tools or []}:
        raise RequestError(f"tool_choice: function {name!r} is not in tools", param="tool_choice")
    return name, True


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for key in _REFUSED:
        if body.get(key) is not None:
            raise RequestError(f"{key}: not supported by the agentrl proxy; expected it left out", param=key)
    if body.get("n") not in (None, 1):
        raise RequestError(f"n: got {body.get('n')!r}; expected 1 (one choice per request)", param="n")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise RequestError("logprobs: not served (agentrl records them itself); expected false or left out",
                           param="logprobs")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, Mapping) or fmt.get("type") != "text"):
        raise RequestError(f"response_format: got {fmt!r:.120}; expected {{\"type\": \"text\"}} or left out",
                           param="response_format")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise RequestError(f"{key}: got {body.get(key)!r}; expected 0 or left out (penalties would change "
                               "the sampled distribution the trainer scores)", param=key)


class ParseMemo:
    """One session's parsing state: what the last request's messages parsed to, and the reply issued to it.

    A harness resends its whole history with every request: most of a request is the previous request
    (compared as decoded JSON, in C), then the proxy's reply to it (when the harness echoes the message
    :func:`completion` returned unchanged), then one or two new messages. Only those are parsed, and
    the messages carried over are the same objects as before, which is what lets
    :func:`agentrl.proxy._history.match` and :class:`~agentrl.proxy._history.Issued` judge each of them
    once. A request that departs from the last one (a fork, a retry after a rewrite) is parsed through
    ``cache``: each message keyed by its JSON, parsed once per session.

    Decoded JSON compares by value, so ``1``, ``1.0`` and ``true`` are equal in it: a message the
    harness resends with only such a change counts as resent unchanged. (Message fields are strings;
    only a tool call's arguments given as an object rather than a JSON string could differ so.)
    """

    __slots__ = ("cache", "echo", "kept", "messages", "raw", "tools", "tools_raw")

    def __init__(self) -> None:
        self.raw: list[Any] = []  # the last request's messages, as decoded
        self.messages: list[Message] = []  # ... as parsed (read-only)
        self.kept: list[dict[str, Any]] = []  # ... as ChatRequest.raw holds them
        self.echo: tuple[dict[str, Any], Message] | None = None  # the reply to it: as sent, as parsed
        self.tools_raw: Any = None
        self.tools: list[dict[str, Any]] | None = None
        self.cache: dict[bytes, tuple[Message, dict[str, Any]]] = {}

    def replied(self, reply: Reply) -> None:
        """The proxy answered the last request with ``reply``."""
        self.echo = reply.echo()


def _keyed(raw: Any, i: int, cache: dict[bytes, tuple[Message, dict[str, Any]]]) -> tuple[Message, dict[str, Any]]:
    try:
        key = orjson.dumps(raw)
    except TypeError:
        return _message(raw, i)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = _message(raw, i)
    return hit


def _messages(raw_messages: list[Any], memo: ParseMemo | None) -> tuple[list[Message], list[dict[str, Any]]]:
    """Each message parsed, and as kept; with a session's ``memo``, only what the last request and its
    reply do not already account for (see :class:`ParseMemo`)."""
    if memo is None:
        parsed = [_message(m, i) for i, m in enumerate(raw_messages)]
        return [m for m, _ in parsed], [r for _, r in parsed]
    n = len(memo.raw)
    if n and len(raw_messages) >= n and raw_messages[:n] == memo.raw:
        messages, kept = memo.messages[:], memo.kept[:]
        echo = memo.echo
        if echo is not None and n < len(raw_messages) and raw_messages[n] == echo[0]:
            messages.append(echo[1])
            kept.append(echo[0])
            n += 1
        for i in range(n, len(raw_messages)):
            message, raw = _message(raw_messages[i], i)
            messages.append(message)
            kept.append(raw)
    else:
        cache = memo.cache
        parsed = [_keyed(m, i, cache) for i, m in enumerate(raw_messages)]
        messages, kept = [m for m, _ in parsed], [r for _, r in parsed]
    memo.raw, memo.messages, memo.kept, memo.echo = raw_messages[:], messages, kept, None
    return messages, kept


def parse_request(body: Any, memo: ParseMemo | None = None) -> ChatRequest:
    """The :class:`ChatRequest` of a decoded JSON body; raises :class:`RequestError` (see the module doc).
    ``memo``: one session's parsing state (:class:`ParseMemo`); the messages and tools must then be
    treated as read-only, and so must ``body`` (the memo compares the next request with it; the server
    parses a freshly decoded body each time)."""
    if not isinstance(body, Mapping):
        raise RequestError(f"body: got {type(body).__name__}; expected a JSON object")
    plain = body.keys() <= _PLAIN_KEYS
    if not plain:
        _refuse_unsupported(body)
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise RequestError("messages: expected a non-empty list of messages", param="messages")
    messages, kept = _messages(raw_messages, memo)
    check_tool_turns(messages)
    if memo is None:
        tools = _tools(body)
    else:
        sent_tools = body.get("tools")
        if sent_tools is None or sent_tools != memo.tools_raw:
            memo.tools, memo.tools_raw = _tools(body), sent_tools
        tools = memo.tools
    model = body.get("model")
    if plain:  # every option at its default (most harnesses' requests): nothing else to read
        return ChatRequest(messages=messages, raw=kept, tools=tools, model=model if isinstance(model, str) else None)
    choice, named = _tool_choice(body, tools)
    options = body.get("stream_options")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise RequestError(f"chat_template_kwargs: got {kwargs!r:.80}; expected an object", param="chat_template_kwargs")
    return ChatRequest(
        messages=messages, raw=kept, tools=tools, tool_choice=choice, named=named,
        temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 1e-9, 1.0),
        max_tokens=_tokens(body), stop=_stop(body), stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, Mapping) and options.get("include_usage")),
        model=model if isinstance(model, str) else None, template_kwargs=dict(kwargs or {}))


# -- replies ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reply:
    """One answer as the harness sees it: ids issued by the proxy, the text, calls, how it ended, usage."""

    response_id: str
    created: int
    model: str
    content: str
    reasoning: str | None
    calls: tuple[tuple[str, str, dict[str, Any]], ...]  # (call id, name, arguments)
    finish_reason: str  # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content if (self.content or not self.calls) else None}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.calls:
            msg["tool_calls"] = [{"id": cid, "type": "function",
                                  "function": {"name": name, "arguments": _ARGUMENTS_JSON.encode(args)}}
                                 for cid, name, args in self.calls]
        return msg

    def echo(self) -> tuple[dict[str, Any], Message]:
        """:meth:`message`, and what :func:`parse_request` parses it back to (built, not parsed: the
        arguments are the parsed call's own, which the JSON of :meth:`message` spells)."""
        sent = self.message()
        return sent, Message("assistant", sent["content"], reasoning_content=self.reasoning or None,
                             tool_calls=[ToolCall(name, args, cid) for cid, name, args in self.calls])

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def completion(reply: Reply) -> bytes:
    """The non-streaming ``chat.completion`` body."""
    return orjson.dumps({"id": reply.response_id, "object": "chat.completion", "created": reply.created,
                         "model": reply.model, "choices": [{"index": 0, "message": reply.message(), "logprobs": None,
                                                            "finish_reason": reply.finish_reason}],
                         "usage": reply.usage()})


def stream_events(reply: Reply, include_usage: bool) -> bytes:
    """The whole server-sent event stream of a streamed reply (the turn is sampled first, then sent):
    a role chunk, reasoning, content, one chunk per tool call, the finish chunk, usage when asked, ``[DONE]``."""
    head = {"id": reply.response_id, "object": "chat.completion.chunk", "created": reply.created, "model": reply.model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    if reply.reasoning:
        out.append(chunk({"reasoning_content": reply.reasoning}))
    if reply.content:
        out.append(chunk({"content": reply.content}))
    for i, (cid, name, args) in enumerate(reply.calls):
        out.append(chunk({"tool_calls": [{"index": i, "id": cid, "type": "function", "function": {
            "name": name, "arguments": _ARGUMENTS_JSON.encode(args)}}]}))
    out.append(chunk({}, reply.finish_reason))
    if include_usage:
        out.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": reply.usage()}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> bytes:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


def same_calls(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two lists of calls are the same calls by name and arguments (ids and JSON spelling aside)."""
    if len(a) != len(b):
        return False
    return all(x.name == y.name and x.arguments == y.arguments for x, y in zip(a, b, strict=True))
