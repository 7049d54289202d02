"""``check_conversation``: the one definition of a well-formed conversation and tool list.

:meth:`ChatTemplate.render` is deliberately as lenient as Hugging Face's ``apply_chat_template``
(byte parity): it renders whatever dicts it is given. Code that *accepts* a conversation from a
user — ``agentrl render``, the agent loop's opening — checks it here first, so both refuse the same
inputs with the same messages:

- every message is a :class:`~agentrl.chat.types.Message` (a known role; tool-call arguments an
  object or a JSON object string);
- a ``tool`` message follows an assistant turn (directly or after other tool messages): a tool
  result with no assistant turn to answer is refused;
- every tool is an OpenAI function tool, ``{"type": "function", "function": {"name": ..., "parameters":
  {...}}}`` (or an object with ``to_openai()``): templates print tools verbatim, so a flat schema would
  reach the model in a shape it was not trained on.

Errors are ``ValueError`` naming the index and what was expected.

Example::

    messages, tools = check_conversation(data["messages"], data.get("tools"))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.chat._jinja import normalize_tools
from agentrl.chat.types import Message

__all__ = ["check_conversation", "check_tools"]


def check_tools(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """The tools as OpenAI function dicts, each checked for the ``function`` wrapper, a name and an
    object ``parameters``; ``None`` stays ``None``."""
    try:
        normalized = normalize_tools(tools)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    if normalized is None:
        return None
    for i, tool in enumerate(normalized):
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, Mapping):
            raise ValueError(f"tools[{i}]: expected an OpenAI tool {{'type': 'function', 'function': {{'name': ..., "
                             f"'parameters': {{...}}}}}}, got an object with keys {sorted(tool)} (wrap a flat schema "
                             "in 'function')")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}].function.name: expected a non-empty string, got {fn.get('name')!r:.80}")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise ValueError(f"tools[{i}].function.parameters: expected a JSON-schema object, got "
                             f"{type(params).__name__}")
    return normalized


def check_conversation(messages: Sequence[Any], tools: Sequence[Any] | None = None) -> tuple[
        list[Message], list[dict[str, Any]] | None]:
    """Checks a conversation (``Message`` objects or OpenAI-style dicts) and its tools; returns them
    as ``Message`` objects and OpenAI tool dicts. Raises ``ValueError`` naming the first problem."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages: expected a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages: expected at least one message, got an empty list")
    out: list[Message] = []
    for i, raw in enumerate(messages):
        try:
            message = Message.from_dict(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"messages[{i}]: {exc}") from None
        if message.role == "tool" and (not out or out[-1].role not in ("assistant", "tool")):
            before = out[-1].role if out else "nothing"
            raise ValueError(f"messages[{i}]: a tool message must answer an assistant turn, but it follows {before}")
        out.append(message)
    return out, check_tools(tools)
