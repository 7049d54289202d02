"""Recognising the proxy's own replies in a request, and where a request continues a sequence.

Harnesses rarely send the history back byte for byte: they drop ``reasoning_content``,
re-serialise tool-call JSON, trim stop strings, or (smolagents) turn the calls into text. An
assistant message of a request is recognised as one of the proxy's replies (:class:`Issued`) when:

1. it carries the reply's response id (a non-standard ``id`` key some clients keep), or
2. its ``tool_calls`` ids are exactly the call ids the proxy issued for that reply (unguessable,
   so no other message carries them), or
3. every call id the proxy issued for the reply appears in its text (the calls re-serialised as
   text), or
4. its content equals the reply's content (stripped; a ``<think>`` block written into the content
   is left out) and its calls are the reply's calls by name and arguments.

A recognised reply stands for its sampled ids: nothing of it is re-tokenised. Every other message
must equal what the sequence holds (role, content, calls by name and arguments, ``tool_call_id``,
``name``). :func:`match` says how a request relates to one sequence; the session tries its
sequences newest first and forks when none matches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.chat.types import Message
from agentrl.proxy._wire import ChatRequest, Reply, same_calls

__all__ = ["Issued", "Match", "match", "recognised_by"]


@dataclass
class Issued:
    """One reply the proxy issued: its ids as the harness saw them, the parsed message the sequence's
    history holds (with the issued call ids), the turn's sampled ids, and the reply itself (for a retry)."""

    reply: Reply
    message: Message
    ids: tuple[int, ...]
    call_ids: tuple[str, ...] = field(init=False)
    # the request message last recognised as this reply: (message, raw, how). A harness resends its
    # history with every request and the session's parse memo hands back the same objects for the
    # same JSON, so each echo of a reply is judged once.
    seen: tuple[Message, dict[str, Any], str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.call_ids = tuple(cid for cid, _, _ in self.reply.calls)

    def recognise(self, raw: dict[str, Any], message: Message) -> str | None:
        """:func:`recognised_by`, remembered for the last message it recognised (the same objects again)."""
        seen = self.seen
        if seen is not None and seen[0] is message and seen[1] is raw:
            return seen[2]
        how = recognised_by(raw, message, self)
        if how is not None:
            self.seen = (message, raw, how)
        return how


def _text(content: Any) -> str:
    return content if isinstance(content, str) else ""


def _visible(text: str) -> str:
    """The content without a reasoning block written into it, stripped."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.strip()


def recognised_by(raw: dict[str, Any], message: Message, issued: Issued) -> str | None:
    """How the request message (``raw`` as sent, ``message`` parsed) is recognised as ``issued``
    (``response_id``, ``call_ids``, ``call_ids_in_text``, ``content``), or None."""
    if message.role != "assistant":
        return None
    if raw.get("id") == issued.reply.response_id:
        return "response_id"
    sent_ids = [c.id for c in message.tool_calls]
    if issued.call_ids and sorted(i for i in sent_ids if i) == sorted(issued.call_ids) and None not in sent_ids:
        return "call_ids"
    text = _text(message.content)
    if issued.call_ids and all(cid in text for cid in issued.call_ids):
        return "call_ids_in_text"
    if _visible(text) == issued.reply.content.strip() and same_calls(message.tool_calls, issued.message.tool_calls):
        return "content"
    return None


def _same(a: Message, b: Message) -> bool:
    return (a.role == b.role and _text(a.content) == _text(b.content) and a.tool_call_id == b.tool_call_id
            and a.name == b.name and (a.reasoning_content or None) == (b.reasoning_content or None)
            and same_calls(a.tool_calls, b.tool_calls))


@dataclass(frozen=True)
class Match:
    """How a request relates to a sequence.

    - ``extend``: it is the sequence's history (its last message the proxy's reply) plus ``new``
      messages: bridge them;
    - ``repeat``: it is the request that produced the sequence's last reply, again (a retry, or a
      second sample of the same prompt);
    - ``pending``: it is the sequence's history, which has no reply yet (the last attempt failed or
      was aborted part way): generate (continue the partial turn);
    - ``none``: it does not continue this sequence; ``reason`` says where it departs.
    """

    kind: Literal["extend", "repeat", "pending", "none"]
    new: tuple[Message, ...] = ()
    reason: str = ""
    recognised: tuple[str, ...] = ()


def match(history: list[Message], owners: list[Issued | None], tools: list[dict[str, Any]] | None,
          request: ChatRequest) -> Match:
    """How ``request`` relates to a sequence whose messages are ``history`` (``owners[i]`` the issued
    reply that ``history[i]`` is, else None) and whose prompt listed ``tools``."""
    if request.render_tools != tools:
        return Match("none", reason="the request lists other tools (or another tool_choice) than the sequence's prompt")
    sent = request.messages
    how: list[str] = []
    for i, (held, owner) in enumerate(zip(history, owners, strict=True)):
        if i >= len(sent):
            if i == len(history) - 1 and owner is not None:
                return Match("repeat", recognised=tuple(how))
            return Match("none", reason=f"the request has {len(sent)} messages; the sequence's history holds "
                                        f"{len(history)} (history cut)")
        if owner is not None:
            by = owner.recognise(request.raw[i], sent[i])
            if by is None:
                return Match("none", reason=f"messages[{i}] is not the proxy's reply {owner.reply.response_id} "
                                            "(no issued id, other content or calls)")
            how.append(by)
        elif sent[i] is not held and not _same(sent[i], held):  # the parse memo's own object: the same message
            return Match("none", reason=f"messages[{i}] ({sent[i].role}) differs from the sequence's history "
                                        "(rewritten)")
    new = tuple(sent[len(history):])
    if not new:
        if owners and owners[-1] is not None:
            return Match("none", reason="nothing follows the proxy's last reply")
        return Match("pending", recognised=tuple(how))
    if not owners or owners[-1] is None:
        return Match("none", reason="the sequence's last turn has no reply, and the request adds messages after it")
    return Match("extend", new=new, recognised=tuple(how))
