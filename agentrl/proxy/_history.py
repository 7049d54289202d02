"""Recognising the proxy's own replies in a request, and where a request continues a sequence.

Harnesses rarely send the history back byte for byte: they drop ``reasoning_content``,
re-serialise tool-call JSON, trim stop strings, or (smolagents) turn the calls into text. An
assistant message of a request is recognised as one of the proxy's replies (:class:`Issued`) when
it names the reply and says what the reply said:

1. it carries the reply's response id (a non-standard ``id`` key some clients keep), or its
   ``tool_calls`` ids are exactly the call ids the proxy issued for that reply (unguessable, so no
   other message carries them), *and* it is the reply as served (:func:`as_served`): the same
   content (stripped; a ``<think>`` block written into the content is left out), the same calls
   by name and arguments (compared decoded, so any JSON spelling), and the same reasoning unless
   it was dropped; or
2. every call id the proxy issued for the reply appears in its text (the calls re-serialised as
   text), with each call's name and the reply's content; or
3. without ids, it is the reply as served (:func:`as_served`).

A message that carries a reply's ids but not what the reply said was edited by the harness: it is
not the reply, so the request matches no sequence and forks (the engine then sees the edit).

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

__all__ = ["Issued", "Match", "as_served", "carries_ids", "match", "recognised_by"]


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


def as_served(message: Message, reply: Reply) -> bool:
    """Whether the assistant ``message`` says what ``reply`` said: its content (stripped, a ``<think>``
    block written into it left out), its calls by name and arguments, its reasoning unless dropped."""
    if _visible(_text(message.content)) != reply.content.strip():
        return False
    if message.reasoning_content and message.reasoning_content.strip() != (reply.reasoning or "").strip():
        return False
    calls = message.tool_calls
    if len(calls) != len(reply.calls):
        return False
    return all(c.name == name and c.arguments == args for c, (_, name, args) in zip(calls, reply.calls, strict=True))


def carries_ids(raw: dict[str, Any], message: Message, issued: Issued) -> str | None:
    """How the request message names ``issued`` by the ids the proxy issued: ``response_id``, ``call_ids``,
    ``call_ids_in_text``; or None."""
    if message.role != "assistant":
        return None
    if raw.get("id") == issued.reply.response_id:
        return "response_id"
    if issued.call_ids:
        sent_ids = [c.id for c in message.tool_calls]
        if None not in sent_ids and sorted(i for i in sent_ids if i) == sorted(issued.call_ids):
            return "call_ids"
        text = _text(message.content)
        if all(cid in text for cid in issued.call_ids):
            return "call_ids_in_text"
    return None


def recognised_by(raw: dict[str, Any], message: Message, issued: Issued) -> str | None:
    """How the request message (``raw`` as sent, ``message`` parsed) is recognised as ``issued``
    (``response_id``, ``call_ids``, ``call_ids_in_text``, ``content``: see the module doc), or None."""
    if message.role != "assistant":
        return None
    named = carries_ids(raw, message, issued)
    if named == "call_ids_in_text":
        text, reply = _text(message.content), issued.reply
        said = reply.content.strip() in text and all(name in text for _, name, _ in reply.calls)
        return named if said else None
    if as_served(message, issued.reply):
        return named or "content"
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
                if carries_ids(request.raw[i], sent[i], owner) is not None:
                    return Match("none", reason=f"messages[{i}] carries the ids of the proxy's reply "
                                                f"{owner.reply.response_id} but not what it said (content, "
                                                "reasoning or calls edited)")
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
