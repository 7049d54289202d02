"""Context policies: what an episode does when its next request would not fit.

An episode that runs for many turns outgrows the context window. Without a policy (``none``, the
default) it ends ``context_budget`` at the first request that does not fit. With one, the agent loop
(and the agent proxy, for a harness's sessions) asks the policy for a shorter conversation whenever
the next request's prompt would pass the policy's ``trigger``, and the episode goes on in a **new
sequence** of the same rollout, started from the render of that conversation
(``fork_reason = compaction``). Earlier sequences keep their sampled tokens and are trained like any
other: a compaction is a fork, so batching, the loss and the viewer need no new concept.

The ready policies, each a small frozen dataclass:

- :class:`Window`: keep the opening (system prompt and task), drop the oldest turns, keep the last
  ones (at most ``keep_turns``);
- :class:`ElideToolOutput`: keep every message, but replace the oldest tool results (never those of
  the last ``keep_turns`` turns) by a stub, ``[output of call c3 elided, 1,234 tokens]``;
- :class:`Summarize`: the policy itself is asked to summarise its progress (a fixed ``instruction``,
  appended as a user turn); the summary is a sampled turn, trained in the sequence it was sampled in
  (history + instruction), and the episode continues in a new sequence from the opening plus the
  summary. With ``summarizer`` (an async function of the conversation) a separate model writes the
  summary instead: its text enters the new sequence as environment tokens, never trained.

**Thresholds.** ``trigger``: compact when the next request's prompt would hold more tokens than this;
an int is a token count, a float in (0, 1] a fraction of the episode's context (the smaller of the
engine's ``context_length`` and the environment's ``max_context_tokens``). ``target`` (hysteresis):
how far :class:`Window` and :class:`ElideToolOutput` compact, an int token count or a float fraction of
the trigger (default 0.5: about half). Compacting to half the trigger starts a new sequence every
~K/2 turns rather than on every turn once the window is full, which keeps the tokens a rollout trains
on within about twice its unique tokens (``bench/bench_long_horizon.py`` measures it).

**Writing your own.** Subclass :class:`ContextPolicy` (a frozen dataclass; ``trigger`` and ``target``
come with it) and implement ``async compact(view) -> Rewrite | AskSummary | None``: the
:class:`ContextView` holds the sequence's conversation (the environment's reply that did not fit at
its end), how many leading messages are the episode's opening, the token counts and a ``count``
function that renders a conversation as the next request would. Return a :class:`Rewrite` (the new
sequence's conversation), an :class:`AskSummary` (and implement ``after_summary``), or ``None`` when
there is nothing to compact (the episode then ends ``context_budget`` once a request no longer fits).

Example::

    class Quiz(Environment):
        default_context_policy = Window(trigger=0.75, keep_turns=8)

    env = Quiz(row, context_policy=Summarize(trigger=3000, max_tokens=256))   # per instance
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from agentrl.chat.types import Message

__all__ = [
    "CONTEXT_POLICIES",
    "AskSummary",
    "ContextPolicy",
    "ContextView",
    "ElideToolOutput",
    "Rewrite",
    "Summarize",
    "Window",
    "context_policy",
    "elision_stub",
    "turn_spans",
]

DEFAULT_INSTRUCTION = ("Your context is nearly full. Summarize your progress so far: every fact you found that "
                       "the task still needs, and what is left to do.")
DEFAULT_SUMMARY_PREFIX = "Summary of the earlier turns:\n"
_STUB = re.compile(r"^\[output of call .* elided, [\d,]+ tokens\]$")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def turn_spans(messages: Sequence[Message], opening: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each turn after the first ``opening`` messages: an assistant message and the
    tool/user messages that answer it. Messages between the opening and the first assistant message
    (a summary that opened the sequence) form a turn of their own."""
    starts = [i for i in range(opening, len(messages)) if messages[i].role == "assistant"]
    if opening < len(messages) and (not starts or starts[0] > opening):
        starts.insert(0, opening)
    return [(s, e) for s, e in zip(starts, [*starts[1:], len(messages)], strict=True)]


@dataclass(frozen=True)
class ContextView:
    """What a policy sees when the next request of a sequence would pass its trigger.

    - ``messages``: the sequence's conversation, ending with ``pending`` messages (the environment's
      reply) that have not been sent yet;
    - ``opening``: how many leading messages are the episode's opening (system prompt, task): kept;
    - ``tokens``: the next request's prompt length with the pending messages; ``trigger`` and
      ``target``: the policy's thresholds in tokens; ``context``: the episode's context (None: none);
    - ``count(messages)``: the prompt length of a conversation rendered as a request (tools listed,
      generation prompt added); ``count_text(text)``: the tokens of a piece of text on its own.
    """

    messages: tuple[Message, ...]
    opening: int
    pending: int
    tokens: int
    trigger: int
    target: int
    context: int | None
    count: Callable[[Sequence[Message]], int]
    count_text: Callable[[str], int]

    def turns(self) -> list[tuple[int, int]]:
        """The turns after the opening (:func:`turn_spans`)."""
        return turn_spans(self.messages, self.opening)


@dataclass(frozen=True)
class Rewrite:
    """The conversation a new sequence starts from. ``kept``: the indices of ``view.messages`` it keeps
    verbatim, in order (its provenance); ``note``: what the policy did, recorded in the new sequence's
    ``info["compaction"]`` (plain JSON values)."""

    messages: tuple[Message, ...]
    kept: tuple[int, ...] = ()
    note: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AskSummary:
    """Ask the policy model for a summary: ``instruction`` is appended as a user turn and the model's
    reply (at most ``max_tokens``) is the summary, a trained turn of the current sequence."""

    instruction: Message
    max_tokens: int


@dataclass(frozen=True)
class ContextPolicy(ABC):
    """Base of the context policies (module doc). ``trigger``: token count (int) or fraction of the
    context (float in (0, 1]); ``target``: token count (int) or fraction of the trigger (float in (0, 1))."""

    name: ClassVar[str] = "custom"
    trigger: int | float = 0.75
    target: int | float = 0.5

    def __post_init__(self) -> None:
        kind = type(self).__name__
        if not _is_number(self.trigger) or (isinstance(self.trigger, int) and self.trigger < 2) or \
                (isinstance(self.trigger, float) and not 0.0 < self.trigger <= 1.0):
            raise ValueError(f"{kind}.trigger: got {self.trigger!r}; expected a token count >= 2 (int) or a "
                             "fraction of the context in (0, 1] (float)")
        if not _is_number(self.target) or (isinstance(self.target, int) and self.target < 1) or \
                (isinstance(self.target, float) and not 0.0 < self.target < 1.0):
            raise ValueError(f"{kind}.target: got {self.target!r}; expected a token count >= 1 (int) or a "
                             "fraction of the trigger in (0, 1) (float)")
        if isinstance(self.trigger, int) and isinstance(self.target, int) and self.target >= self.trigger:
            raise ValueError(f"{kind}.target: got {self.target}; expected fewer tokens than trigger={self.trigger}")

    def thresholds(self, context: int | None) -> tuple[int, int]:
        """``(trigger, target)`` in tokens for an episode whose context is ``context``."""
        kind = type(self).__name__
        if isinstance(self.trigger, float):
            if context is None:
                raise ValueError(f"{kind}.trigger={self.trigger} is a fraction of the context, but the episode has "
                                 "no context length (engines.context_length or max_context_tokens); expected a token "
                                 "count")
            trigger = max(2, math.floor(self.trigger * context))
        else:
            trigger = self.trigger
        if context is not None:
            trigger = min(trigger, context)
        target = max(1, math.floor(self.target * trigger)) if isinstance(self.target, float) else self.target
        return trigger, min(target, trigger - 1)

    def options(self) -> dict[str, Any]:
        """The policy's settings as plain values (what a config file would say), for the record."""
        out: dict[str, Any] = {"policy": self.name}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value if value is None or isinstance(value, (int, float, str, bool)) else repr(value)
        return out

    @abstractmethod
    async def compact(self, view: ContextView) -> Rewrite | AskSummary | None:
        """The new sequence's conversation, a request for a summary, or None (nothing to compact)."""

    def after_summary(self, view: ContextView, summary: str, carried: Sequence[Message] = ()) -> Rewrite:
        """The conversation after a summary (policies that return :class:`AskSummary`). ``carried``: the
        last turn and the environment's reply, when they were not part of what was summarised."""
        raise NotImplementedError(f"{type(self).__name__}.after_summary: a policy that asks for a summary must "
                                  "say what the next sequence starts from")


def _check_keep(kind: str, keep_turns: int | None, low: int) -> None:
    if keep_turns is not None and (isinstance(keep_turns, bool) or not isinstance(keep_turns, int)
                                   or keep_turns < low):
        raise ValueError(f"{kind}.keep_turns: got {keep_turns!r}; expected None or an int >= {low}")


@dataclass(frozen=True)
class Window(ContextPolicy):
    """Keep the opening and the last turns: as many as fit in ``target`` tokens, at most ``keep_turns``
    (``None``: no cap), always the last one (it holds the environment's new reply)."""

    name: ClassVar[str] = "window"
    keep_turns: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_keep(type(self).__name__, self.keep_turns, 1)

    async def compact(self, view: ContextView) -> Rewrite | None:
        spans = view.turns()
        if len(spans) < 2:
            return None  # only the last turn: nothing may go
        most = len(spans) - 1 if self.keep_turns is None else min(self.keep_turns, len(spans) - 1)
        head = list(range(view.opening))

        def kept(k: int) -> list[int]:
            return head + list(range(spans[-k][0], len(view.messages)))

        lo, hi = 1, most  # the largest k whose conversation fits the target (k = 1 when none does)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if view.count([view.messages[i] for i in kept(mid)]) <= view.target:
                lo = mid
            else:
                hi = mid - 1
        indices = kept(lo)
        return Rewrite(tuple(view.messages[i] for i in indices), tuple(indices),
                       {"dropped_turns": len(spans) - lo, "kept_turns": lo,
                        "dropped_messages": len(view.messages) - len(indices)})


def elision_stub(message: Message, tokens: int) -> str:
    """The text that replaces an elided tool result: ``[output of call c3 (read) elided, 1,234 tokens]``
    (the call's id and the tool's name, where the message has them)."""
    who = message.tool_call_id or "?"
    name = f" ({message.name})" if message.name else ""
    return f"[output of call {who}{name} elided, {tokens:,} tokens]"


@dataclass(frozen=True)
class ElideToolOutput(ContextPolicy):
    """Replace the oldest tool results by a stub (:func:`elision_stub`), oldest first, until the
    conversation fits ``target``; the results of the last ``keep_turns`` turns are never elided."""

    name: ClassVar[str] = "elide_tool_output"
    keep_turns: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_keep(type(self).__name__, self.keep_turns, 1)

    async def compact(self, view: ContextView) -> Rewrite | None:
        spans = view.turns()
        protected = spans[-self.keep_turns][0] if len(spans) >= self.keep_turns else view.opening
        candidates = [i for i in range(view.opening, protected) if view.messages[i].role == "tool"
                      and isinstance(view.messages[i].content, str) and not _STUB.match(str(view.messages[i].content))]
        if not candidates:
            return None
        messages = list(view.messages)
        elided: list[int] = []
        need = view.tokens - view.target
        for i in candidates:
            text = str(messages[i].content)
            size = view.count_text(text)
            stub = elision_stub(messages[i], size)
            messages[i] = Message(role="tool", content=stub, tool_call_id=messages[i].tool_call_id,
                                  name=messages[i].name)
            elided.append(i)
            need -= size - view.count_text(stub)
            if need <= 0 and view.count(messages) <= view.target:
                break
        kept = tuple(i for i in range(len(messages)) if i not in set(elided))
        return Rewrite(tuple(messages), kept, {"elided_messages": elided, "elided_calls": [
            view.messages[i].tool_call_id or view.messages[i].name for i in elided]})


SummaryWriter = Callable[[Sequence[Message]], Awaitable[str]]
"""A separate summariser: the conversation in, the summary's text out (e.g. a call to another model)."""


@dataclass(frozen=True)
class Summarize(ContextPolicy):
    """The policy summarises its own progress (module doc).

    - ``instruction``: the user turn that asks for the summary; ``max_tokens``: the summary's budget;
    - ``prefix``: what precedes the summary in the user message that opens the next sequence;
    - ``train_summary``: ``False`` masks the summary turn out of the loss (a control: the summary is
      then sampled but never trained);
    - ``summarizer``: an async ``(messages) -> str`` that writes the summary instead of the policy; its
      text is environment tokens of the next sequence (nothing of it is trained).
    """

    name: ClassVar[str] = "summarize"
    instruction: str = DEFAULT_INSTRUCTION
    max_tokens: int = 256
    prefix: str = DEFAULT_SUMMARY_PREFIX
    train_summary: bool = True
    summarizer: SummaryWriter | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            raise ValueError(f"Summarize.instruction: got {self.instruction!r}; expected a non-empty string")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"Summarize.max_tokens: got {self.max_tokens!r}; expected an int >= 1")
        if not isinstance(self.prefix, str):
            raise ValueError(f"Summarize.prefix: got {self.prefix!r}; expected a string")
        if not isinstance(self.train_summary, bool):
            raise ValueError(f"Summarize.train_summary: got {self.train_summary!r}; expected true or false")
        if self.summarizer is not None and not callable(self.summarizer):
            raise ValueError(f"Summarize.summarizer: got {self.summarizer!r}; expected None or an async function "
                             "(messages) -> str")

    async def compact(self, view: ContextView) -> Rewrite | AskSummary:
        if self.summarizer is None:
            return AskSummary(Message(role="user", content=self.instruction), self.max_tokens)
        text = await self.summarizer(view.messages)
        if not isinstance(text, str):
            raise TypeError(f"Summarize.summarizer returned {type(text).__name__}; expected the summary as a str")
        rewrite = self.after_summary(view, text)
        return Rewrite(rewrite.messages, rewrite.kept, {**rewrite.note, "summarizer": "separate"})

    def after_summary(self, view: ContextView, summary: str, carried: Sequence[Message] = ()) -> Rewrite:
        opening = view.messages[:view.opening]
        message = Message(role="user", content=self.prefix + summary.strip())
        return Rewrite((*opening, message, *carried), tuple(range(view.opening)),
                       {"summary": summary.strip(), "carried_messages": len(carried)})


CONTEXT_POLICIES: dict[str, type[ContextPolicy] | None] = {
    "none": None, "window": Window, "elide_tool_output": ElideToolOutput, "summarize": Summarize}
"""The policies a config file can name (``environment.context.policy``); ``none`` is no policy."""


def context_policy(name: str, **settings: Any) -> ContextPolicy | None:
    """The policy called ``name`` with ``settings`` (its dataclass fields); ``none`` gives None. An unknown
    name or setting raises ``ValueError`` naming it and what is accepted."""
    if name not in CONTEXT_POLICIES:
        raise ValueError(f"context policy {name!r}: unknown; expected one of {', '.join(map(repr, CONTEXT_POLICIES))}")
    cls = CONTEXT_POLICIES[name]
    if cls is None:
        if settings:
            raise ValueError(f"context policy 'none' takes no settings; got {', '.join(sorted(settings))}")
        return None
    accepted = [f.name for f in fields(cls) if f.init and f.name != "summarizer"]
    unknown = sorted(set(settings) - set(accepted))
    if unknown:
        raise ValueError(f"context policy {name!r}: unknown setting(s) {', '.join(unknown)}; expected some of "
                         f"{', '.join(accepted)}")
    return cls(**settings)
