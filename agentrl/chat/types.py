"""Message types shared by templates, parsers, tools and environments.

Messages use the OpenAI chat shape on the outside (``to_dict``/``from_dict``) and are plain,
picklable dataclasses inside. Tool-call arguments are always a ``dict``: OpenAI clients carry them
as a JSON string, which the Qwen XML templates either reject or silently drop, so ``from_dict``
decodes such strings once at the boundary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from agentrl._enum import NamedEnum

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
# Keys a message dict may carry its reasoning under, in the order the first non-None one wins
# (Hugging Face templates read ``reasoning_content`` first, then ``thinking``).
REASONING_KEYS: tuple[str, ...] = ("reasoning_content", "thinking", "reasoning")


class FailureKind(NamedEnum):
    """Every way a model's tool use can fail, by name. Parse failures come first, then tool failures."""

    # Raised by the tool-call parser (agentrl.chat.parse_tool_calls).
    MALFORMED_JSON = "malformed_json"
    MALFORMED_XML = "malformed_xml"
    UNKNOWN_TOOL = "unknown_tool"
    UNTERMINATED = "unterminated"
    MISSING_REQUIRED_ARGUMENT = "missing_required_argument"
    INVALID_ARGUMENT_TYPE = "invalid_argument_type"
    EMPTY_CALL = "empty_call"
    TEXT_AFTER_CALL = "text_after_call"
    TOO_MANY_CALLS = "too_many_calls"
    # Raised while running a tool (agentrl.tools).
    TOOL_ERROR = "tool_error"
    TOOL_TIMEOUT = "tool_timeout"
    SANDBOX_ERROR = "sandbox_error"


@dataclass
class ToolCall:
    """One parsed call: the tool's name, its arguments as a mapping, and an optional call id."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    # Where the parser found the call in the completion text (start, end); not part of equality.
    span: tuple[int, int] | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            out["id"] = self.id
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        """Accepts the OpenAI shape (``{"function": {"name", "arguments"}}``) or a flat ``{"name", "arguments"}``."""
        if not isinstance(data, dict):
            raise TypeError(f"tool_calls entry: expected an object, got {type(data).__name__}: {data!r:.200}")
        fn = data.get("function", data)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tool_calls entry: expected a 'name' string, got {data!r:.200}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"tool_calls[{fn['name']!r}].arguments: expected a JSON object string, got {args!r:.200} ({exc})"
                ) from exc
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ValueError(
                f"tool_calls[{fn['name']!r}].arguments: expected an object, got {type(args).__name__}: {args!r:.200}"
            )
        call_id = data.get("id")
        return cls(name=fn["name"], arguments=args, id=call_id if isinstance(call_id, str) else None)


@dataclass
class Message:
    """One chat message (system, user, assistant or tool).

    ``content`` may be ``None`` (rendered as undefined, as Hugging Face does) or a list of
    multimodal parts. ``reasoning_content`` is the text inside ``<think>`` for assistant messages.
    """

    role: Role
    content: str | list[dict[str, Any]] | None = ""
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Message.role: expected one of {ROLES}, got {self.role!r}")

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI-shaped dict; keys whose value is None (and empty ``tool_calls``) are left out."""
        out: dict[str, Any] = {"role": self.role}
        if self.content is not None:
            out["content"] = self.content
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | Message) -> Message:
        if isinstance(data, Message):
            return data
        if not isinstance(data, dict):
            raise TypeError(f"message: expected an object, got {type(data).__name__}: {data!r:.200}")
        role = data.get("role")
        if role not in ROLES:
            raise ValueError(f"message.role: expected one of {ROLES}, got {role!r}")
        calls = data.get("tool_calls") or []
        if not isinstance(calls, list):
            raise ValueError(f"message.tool_calls: expected a list, got {type(calls).__name__}")
        reasoning = next((data[k] for k in REASONING_KEYS if data.get(k) is not None), None)
        return cls(
            role=cast(Role, role),
            content=data.get("content", ""),
            reasoning_content=reasoning,
            tool_calls=[ToolCall.from_dict(c) for c in calls],
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
        )


def as_message_dicts(messages: list[Message] | list[dict[str, Any]] | list[Any]) -> list[dict[str, Any]]:
    """A mix of :class:`Message` objects and dicts as the plain OpenAI-shaped dicts a template renders.

    The same normalisation :meth:`ChatTemplate.render` applies (``normalize_messages``): keys whose
    value is None dropped, reasoning aliases resolved into ``reasoning_content`` and ``thinking``.
    """
    from agentrl.chat._jinja import normalize_messages  # _jinja imports this module

    return normalize_messages(messages)


@dataclass
class ToolCallFailure:
    """A tool call the parser could not accept: its kind, a short message and the raw text span."""

    kind: FailureKind
    message: str
    raw: str = ""
    span: tuple[int, int] = (0, 0)
    tool_name: str | None = None
    # The argument the failure is about (missing_required_argument, invalid_argument_type).
    argument: str | None = None
    # Set when the call was accepted anyway (a defect SGLang's parser lets through): the call's id.
    call_id: str | None = None
    # True for a defect that does not stop the call (or, text after a call, the turn) from being what
    # SGLang would serve: counted and shown, but by default it changes neither the conversation nor
    # the reward (an environment's FailurePolicy may still act on its kind). Never set by strict parsing.
    tolerated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "message": self.message, "raw": self.raw, "span": list(self.span),
                "tool_name": self.tool_name, "argument": self.argument, "call_id": self.call_id,
                "tolerated": self.tolerated}


@dataclass
class ParsedReply:
    """A parsed assistant turn: text outside calls, reasoning, accepted calls and typed failures.

    ``message_content`` is ``content`` with the text of every call the parser rejected left where the
    model wrote it (``None`` when nothing was rejected: then it equals ``content``). The conversation
    keeps it, so the model (and a reward reading ``messages``) sees its own failed call next turn.
    """

    content: str
    reasoning: str | None = None
    calls: list[ToolCall] = field(default_factory=list)
    failures: list[ToolCallFailure] = field(default_factory=list)
    message_content: str | None = None
    # The turn's text outside reasoning, call blocks included, and the part of it SGLang serves as
    # content with its tool parser on; stripped (None: equals ``content``). See :meth:`served_content`.
    text: str | None = field(default=None, compare=False)
    served: str | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return not self.failures

    def served_content(self, tool_parser: bool = True) -> str:
        """The ``content`` SGLang's OpenAI server answers for this turn (docs/chat.md, "Serving parity").

        With its tool-call parser on (the request lists tools and ``tool_choice`` is not ``none``): the
        text before the format's first call marker (``<tool_call>\\n`` for JSON, ``<tool_call>`` for
        XML); what follows a call, or a call that does not parse, is not served. With the parser off:
        the whole text outside reasoning, call blocks included. Stripped at its ends, as ``content``."""
        if tool_parser:
            return self.content if self.served is None else self.served
        return self.content if self.text is None else self.text

    def to_message(self) -> Message:
        """The assistant message the model wrote: accepted calls as ``tool_calls``, every other piece of
        text (a rejected call included) as content. It re-renders to the sampled text whenever the
        model wrote the template's own layout, so the bridge needs no fork after a failed call."""
        content = self.content if self.message_content is None else self.message_content
        return Message(role="assistant", content=content, reasoning_content=self.reasoning,
                       tool_calls=list(self.calls))
