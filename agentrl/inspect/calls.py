"""Each tool call of an episode with what came of it: arguments, result, failure kind, duration.

The conversation gives the calls (assistant messages' ``tool_calls``) and their results (the tool
messages that follow, matched by ``tool_call_id``, else by order). The environment's step info
(``Episode.env_info``, written by :meth:`Environment.step
<agentrl.environments.Environment.step>`) adds each call's failure kind and duration and the
reply's parse failures; an environment that logs nothing there still gets calls and results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat.types import Message

__all__ = ["CallView", "TurnCalls", "calls_by_message", "message_text"]


@dataclass(frozen=True)
class CallView:
    """One tool call: ``failure`` is a failure kind's name (None: it ran fine or nothing is known)."""

    name: str
    arguments: dict[str, Any]
    call_id: str | None = None
    result: str | None = None
    result_is_error: bool = False
    failure: str | None = None
    duration_s: float | None = None


@dataclass(frozen=True)
class TurnCalls:
    """The calls of one assistant message and the parse failures of that reply."""

    message_index: int
    calls: list[CallView] = field(default_factory=list)
    parse_failures: list[dict[str, Any]] = field(default_factory=list)


def message_text(message: Message) -> str:
    """A message's content as text: a string as is, ``None`` as empty, multimodal parts by their text."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [str(p.get("text", "")) if isinstance(p, Mapping) and p.get("type") == "text" else f"[{p.get('type', 'part')}]"
             if isinstance(p, Mapping) else str(p) for p in content]
    return "".join(parts)


def _results(messages: Sequence[Message], start: int) -> list[Message]:
    out = []
    for m in messages[start:]:
        if m.role != "tool":
            break
        out.append(m)
    return out


def _info_by_turn(env_info: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    by_turn: dict[int, Mapping[str, Any]] = {}
    for info in env_info:
        turn = info.get("turn")
        if isinstance(turn, int) and not isinstance(turn, bool):
            by_turn[turn] = info
    return by_turn


def _call_views(message: Message, results: list[Message], info: Mapping[str, Any]) -> list[CallView]:
    logged = [c for c in info.get("calls") or [] if isinstance(c, Mapping)]
    matched: list[Message | None] = []
    claimed: set[int] = set()
    for call in message.tool_calls:  # by call id first
        hit = next((j for j, m in enumerate(results) if call.id is not None and m.tool_call_id == call.id), None)
        matched.append(results[hit] if hit is not None else None)
        if hit is not None:
            claimed.add(hit)
    spare = iter([m for j, m in enumerate(results) if j not in claimed])
    matched = [m if m is not None else next(spare, None) for m in matched]  # then the rest in order
    views = []
    for i, call in enumerate(message.tool_calls):
        result = matched[i]
        log = next((c for c in logged if c.get("id") == call.id and c.get("name") == call.name), None)
        if log is None and i < len(logged):
            log = logged[i]
        failure = log.get("failure") if log else None
        duration = log.get("duration_s") if log else None
        views.append(CallView(
            name=call.name, arguments=dict(call.arguments), call_id=call.id,
            result=message_text(result) if result is not None else None,
            result_is_error=failure is not None or (result is not None and message_text(result).startswith("Error")),
            failure=str(failure) if failure else None,
            duration_s=float(duration) if isinstance(duration, int | float) else None))
    return views


def calls_by_message(messages: Sequence[Message], env_info: Sequence[Mapping[str, Any]] = ()) -> dict[int, TurnCalls]:
    """For each assistant message (by index) that made calls or had parse failures, its :class:`TurnCalls`."""
    by_turn = _info_by_turn(env_info)
    out: dict[int, TurnCalls] = {}
    turn = 0
    for index, message in enumerate(messages):
        if message.role != "assistant":
            continue
        turn += 1
        info = by_turn.get(turn, {})
        failures = [dict(f) for f in info.get("parse_failures") or [] if isinstance(f, Mapping)]
        if not message.tool_calls and not failures:
            continue
        calls = _call_views(message, _results(messages, index + 1), info)
        out[index] = TurnCalls(message_index=index, calls=calls, parse_failures=failures)
    return out
