"""The token bridge: what to append after a sampled assistant turn, checked by the prefix property.

Sampled ids are kept verbatim (token in, token out). The environment's reply (tool results or a
new user turn) is turned into ids from *messages*, never from decoded text:

1. ``P`` = render of the conversation so far, which ends with the parsed assistant message, cut
   right after that message's turn close (``<|im_end|>``);
2. ``N`` = render of the conversation plus the new messages, with the generation prompt;
3. if ``N`` starts with ``P``, the segment ``N[len(P):]`` is tokenised on its own (it starts right
   after a special token and ends before sampled text, so no BPE merge crosses either edge) and
   appended. It starts with the ``\\n`` the template writes after ``<|im_end|>``, which the model
   never samples.

If the sampled ids do not end with the turn-close id (the turn stopped on ``</tool_call>`` or hit
the length limit), a synthetic turn close is returned first as a separate ``scaffold`` piece:
never sampled, loss mask 0.

When ``N`` does not start with ``P`` the template is not append-only for this step (a new user
query strips earlier reasoning in Qwen3/Qwen3.5, Qwen3 drops an empty think block once a turn is no
longer last, a template rewrites history). The result then says so, with the ids of the full
render, so the caller can fork a new sequence from them or re-render; nothing is appended
silently. The bridge records nothing itself: the caller counts metrics from ``outcome``, and
from ``control_tokens`` / ``notes`` (control-token strings in the new environment text, which
tokenise as the control tokens unless the template escapes them: a tolerated diagnostic).

Whether the sampled ids re-render identically (``history_matches``, ``SAMPLED_TEXT_DIFFERS``) is
judged true to the bytes, never on decoded text alone: ids equal to the render's own ids match
(environment text a tokenizer normalises, such as decomposed Unicode, included), ids that spell
the render's bytes match, and ids whose bytes are not valid UTF-8 never match the U+FFFD their
decoded text shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Literal

from agentrl._enum import NamedEnum
from agentrl._ids import CheckedIds
from agentrl.chat._jinja import normalize_messages, normalize_tools

if TYPE_CHECKING:
    from agentrl.chat.template import ChatTemplate

__all__ = ["BridgeOutcome", "BridgePiece", "BridgeResult", "BridgeSession", "PieceKind", "bridge_turn"]

PieceKind = Literal["scaffold", "tool", "user"]


class BridgeOutcome(NamedEnum):
    """How the next prompt can be built from the tokens so far."""

    APPEND = "append"
    """The prefix property holds: append ``pieces`` after the sampled ids; the result is the full render."""
    NOT_APPEND_ONLY = "not_append_only"
    """The full render rewrites the history: fork a new sequence from ``full_render_ids`` or re-render."""
    SAMPLED_TEXT_DIFFERS = "sampled_text_differs"
    """(:class:`BridgeSession` only) The prefix property holds for the messages, but the sampled turn does
    not re-render to the text the model wrote (key order, spacing, ``true`` vs ``True``...). ``pieces``
    are still correct to append after the sampled ids (token-in, token-out), but the next prompt is
    then not the full render: ``full_render_ids`` holds that one."""


@dataclass(frozen=True)
class BridgePiece:
    """Ids to append, their text, and where they come from (``scaffold`` / ``tool`` / ``user``)."""

    ids: tuple[int, ...]
    kind: PieceKind
    text: str


@dataclass(frozen=True)
class BridgeResult:
    """The outcome of one bridge step.

    - ``outcome``: :class:`BridgeOutcome`; ``prefix_ok`` is True exactly when it is ``APPEND``.
    - ``pieces``: for ``APPEND``, what to append in order: an optional synthetic turn close
      (``scaffold``) and the environment segment (``tool`` when every new message is a tool
      result, else ``user``). Empty for ``NOT_APPEND_ONLY``.
    - ``turn_closed``: whether the sampled ids already ended with the turn-close id.
    - ``reason``: a human-readable explanation (where the renders diverge, when they do).
    - ``full_render_ids``: ids of the full render with the generation prompt, set for
      ``NOT_APPEND_ONLY`` (the sequence to fork from) and in audit mode.
    - ``history_matches``: audit mode only (and every :class:`BridgeSession` step): whether the given
      ids spell exactly ``P`` (after the synthetic turn close), true to the bytes (module doc), i.e.
      the sampled text re-renders identically from the parsed message. None when not audited.
    - ``control_tokens``: how many control-token strings (``<|im_end|>``, ``<|im_start|>``...) the new
      environment messages hold; ``notes`` says which, and whether they were escaped (tolerated).
    """

    outcome: BridgeOutcome
    pieces: tuple[BridgePiece, ...]
    prefix_ok: bool
    turn_closed: bool
    reason: str
    full_render_ids: tuple[int, ...] | None = None
    history_matches: bool | None = None
    control_tokens: int = 0
    notes: tuple[str, ...] = ()

    @property
    def ids(self) -> list[int]:
        """All pieces' ids concatenated (empty unless the outcome is ``APPEND``)."""
        if len(self.pieces) == 1:
            return list(self.pieces[0].ids)
        return list(chain.from_iterable(piece.ids for piece in self.pieces))


def _env_kind(new_msgs: list[dict[str, Any]]) -> PieceKind:
    return "tool" if all(m.get("role") == "tool" for m in new_msgs) else "user"


def _divergence(short: str, long: str) -> str:
    i = 0
    limit = min(len(short), len(long))
    while i < limit and short[i] == long[i]:
        i += 1
    lo = max(0, i - 30)
    return (f"the render with the new messages differs from the history at character {i}: "
            f"{short[lo:i + 40]!r} became {long[lo:i + 40]!r}")


def _control_fields(template: ChatTemplate, added: list[dict[str, Any]]) -> dict[str, Any]:
    """``control_tokens`` and ``notes`` of a result, for the new environment messages ``added``."""
    found = template.count_control_tokens(added)
    if not found:
        return {}
    listed = ", ".join(f"{token!r} x{n}" for token, n in sorted(found.items()))
    if template.escape_control_tokens:
        how = "rendered escaped (escape_control_tokens=True), so they tokenise as plain text"
    else:
        how = ("tokenised as the control tokens themselves, as apply_chat_template and serving tokenise them; "
               "ChatTemplate(escape_control_tokens=True) escapes them")
    return {"control_tokens": sum(found.values()), "notes": (f"environment text holds control tokens ({listed}): {how}",)}


def _spells(template: ChatTemplate, ids: Sequence[int], text: str) -> bool:
    """Whether ``ids`` are ``text``, true to the bytes: its own ids, or ids spelling its UTF-8 bytes."""
    if list(ids) == template.tokenize(text):
        return True  # exact, even where the tokenizer normalises the text (NFC) before splitting it
    spelled = template.token_bytes(ids)
    if spelled is not None:
        return spelled == text.encode("utf-8")
    decoded = template.decode(ids)  # bytes unknown: a U+FFFD may hide invalid bytes, so it never matches
    return decoded == text and "\ufffd" not in decoded


def _decodes_cleanly(template: ChatTemplate, ids: Sequence[int], decoded: str) -> bool:
    """Whether ``decoded`` (``template.decode(ids)``) holds exactly the bytes ``ids`` spell: no invalid
    UTF-8 turned into U+FFFD. Decoded text without U+FFFD always does."""
    if "\ufffd" not in decoded:
        return True
    spelled = template.token_bytes(ids)
    if spelled is not None:
        return spelled == decoded.encode("utf-8")
    return list(ids) == template.tokenize(decoded)


def _history_prefix(template: ChatTemplate, history: list[dict[str, Any]], tools: Sequence[Any] | None,
                    template_kwargs: dict[str, Any]) -> str:
    """``P``: the history render cut right after the last assistant message's turn close."""
    rendered = template.render(history, tools, add_generation_prompt=False, **template_kwargs)
    cut = rendered.rfind(template.turn_close)
    if cut < 0:
        raise ValueError(f"bridge: the render of messages has no {template.turn_close!r}; template "
                         f"{template.name!r} does not close assistant turns with it")
    return rendered[:cut + len(template.turn_close)]


def bridge_turn(template: ChatTemplate, token_ids: Sequence[int], messages: Sequence[Any],
                new_messages: Sequence[Any], *, tools: Sequence[Any] | None = None, audit: bool = False,
                **template_kwargs: Any) -> BridgeResult:
    """Bridges one environment step.

    ``token_ids``: the conversation so far as ids (prompt plus the sampled assistant turn,
    verbatim). ``messages``: the same conversation as messages, ending with the parsed assistant
    message. ``new_messages``: the environment's reply (tool results and/or a user turn).
    ``tools`` and ``template_kwargs`` must be those the prompt was rendered with.

    Returns a :class:`BridgeResult`. With ``APPEND``, ``token_ids + result.ids`` is the next prompt
    and equals a full render whenever ``token_ids`` decodes to the history's render (check that
    with ``audit=True``, which also fills ``full_render_ids``). Raises ``ValueError`` for input
    that cannot be bridged (no new messages, history not ending with an assistant message, no
    tokenizer) and :class:`~agentrl.chat.template.ChatTemplateError` where the template raises.
    """
    history = normalize_messages(messages)
    if history[-1].get("role") != "assistant":
        raise ValueError(f"bridge: messages[-1] must be the parsed assistant message, got role="
                         f"{history[-1].get('role')!r}")
    if isinstance(new_messages, (str, bytes)) or len(new_messages) == 0:
        raise ValueError(f"bridge: new_messages: expected at least one tool or user message, got {new_messages!r:.80}")
    added = normalize_messages(new_messages)
    close_id = template.turn_close_id
    ids = [int(t) for t in token_ids]
    turn_closed = bool(ids) and ids[-1] == close_id
    control = _control_fields(template, added)

    prefix = _history_prefix(template, history, tools, template_kwargs)
    full = template.render(history + added, tools, add_generation_prompt=True, **template_kwargs)
    full_ids = tuple(template.tokenize(full)) if audit else None
    history_matches: bool | None = None
    if audit:
        history_matches = _spells(template, ids if turn_closed else [*ids, close_id], prefix)

    if not full.startswith(prefix):
        return BridgeResult(BridgeOutcome.NOT_APPEND_ONLY, (), prefix_ok=False, turn_closed=turn_closed,
                            reason=_divergence(prefix, full),
                            full_render_ids=full_ids if full_ids is not None else tuple(template.tokenize(full)),
                            history_matches=history_matches, **control)
    pieces = _pieces(template, turn_closed, full[len(prefix):], _env_kind(added))
    reason = "prefix property holds" + ("" if turn_closed else "; synthetic turn close added (not sampled)")
    return BridgeResult(BridgeOutcome.APPEND, pieces, prefix_ok=True, turn_closed=turn_closed,
                        reason=reason, full_render_ids=full_ids, history_matches=history_matches, **control)


def _pieces(template: ChatTemplate, turn_closed: bool, segment: str, kind: PieceKind) -> tuple[BridgePiece, ...]:
    pieces: list[BridgePiece] = []
    if not turn_closed:
        pieces.append(BridgePiece((template.turn_close_id,), "scaffold", template.turn_close))
    pieces.append(BridgePiece(tuple(template.tokenize(segment)), kind, segment))
    return tuple(pieces)


class BridgeSession:
    """The bridge for one episode, with one full render per turn instead of two.

    It keeps the text its token buffer decodes to (the prompt's render, then each sampled turn's
    decoded ids and each appended segment). Each :meth:`step` renders the conversation with the new
    messages once and checks that it starts with that text, which is a stronger check than
    :func:`bridge_turn`'s: it proves the next prompt *is* the full render, sampled text included.
    Only when it fails does it render the history alone, to tell a template that rewrites history
    (``NOT_APPEND_ONLY``) from a sampled turn that re-renders differently (``SAMPLED_TEXT_DIFFERS``).

    Single-use and not thread-safe: one session per episode, steps in order. After a step whose
    outcome is not ``APPEND`` the session is closed; fork a new one from ``full_render_ids``.

    Example::

        session = BridgeSession(template, messages, tools=tools)      # messages: the opening conversation
        ids = session.prompt_ids
        ...                                                           # sample `out` from ids, parse it
        result = session.step(out, parsed.to_message(), env_messages)
        if result.outcome is BridgeOutcome.APPEND:
            ids += out + result.ids
    """

    def __init__(self, template: ChatTemplate, messages: Sequence[Any], *, tools: Sequence[Any] | None = None,
                 **template_kwargs: Any) -> None:
        self.template = template
        self.tools = normalize_tools(tools)
        self.template_kwargs = template_kwargs
        self.messages: list[dict[str, Any]] = normalize_messages(messages)
        self._text = template.render_normalized(self.messages, self.tools, add_generation_prompt=True,
                                                **template_kwargs)
        self.prompt_ids: Sequence[int] = template.tokenize(self._text)  # read-only: a cached opening's ids are shared
        self.closed = False

    @classmethod
    def from_render(cls, template: ChatTemplate, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    text: str, prompt_ids: Sequence[int], **template_kwargs: Any) -> BridgeSession:
        """A session whose opening was rendered and tokenised before (a hit of :class:`agentrl.rollout.OpeningCache`).

        ``messages`` and ``tools`` must be normalised (``normalize_messages`` / ``normalize_tools``) and
        ``text`` / ``prompt_ids`` must be their render with the generation prompt and its ids: the
        session copies them, so one cached opening serves many episodes.
        """
        session = cls.__new__(cls)
        session.template = template
        session.tools = tools
        session.template_kwargs = template_kwargs
        session.messages = list(messages)
        session._text = text
        # checked ids are an immutable tuple: shared as they are; anything else is copied
        session.prompt_ids = prompt_ids if type(prompt_ids) is CheckedIds else list(prompt_ids)
        session.closed = False
        return session

    @property
    def text(self) -> str:
        """What the token buffer decodes to after the last successful step: the full render of the conversation
        so far, ending with the generation prompt (``prompt_ids`` decode to it before the first step)."""
        return self._text

    def step(self, sampled_ids: Sequence[int], assistant: Any, new_messages: Sequence[Any]) -> BridgeResult:
        """Bridges one turn: ``sampled_ids`` verbatim from the engine, ``assistant`` the parsed reply as a
        message, ``new_messages`` the environment's reply. See :class:`BridgeOutcome`."""
        if self.closed:
            raise ValueError("BridgeSession.step: the session ended with a non-append outcome; start a new one")
        tpl = self.template
        (reply,) = normalize_messages([assistant])
        if reply.get("role") != "assistant":
            raise ValueError(f"BridgeSession.step: assistant: expected role 'assistant', got {reply.get('role')!r}")
        if isinstance(new_messages, (str, bytes)) or len(new_messages) == 0:
            raise ValueError(f"BridgeSession.step: new_messages: expected at least one message, got {new_messages!r:.80}")
        added = normalize_messages(new_messages)
        ids = list(map(int, sampled_ids))
        turn_closed = bool(ids) and ids[-1] == tpl.turn_close_id
        control = _control_fields(tpl, added)
        decoded = tpl.decode(ids)
        turn = decoded if turn_closed else decoded + tpl.turn_close  # what the buffer gains: the sampled turn
        history = [*self.messages, reply]
        full = tpl.render_normalized(history + added, self.tools, add_generation_prompt=True, **self.template_kwargs)
        kind = _env_kind(added)
        clean = _decodes_cleanly(tpl, ids, decoded)
        seen_len = len(self._text) + len(turn)
        # full starts with self._text + turn, checked in place: the long text is not copied to check it
        if full.startswith(self._text) and full.startswith(turn, len(self._text)) and clean:
            segment = full[seen_len:]
            self.messages = history + added
            self._text = full
            reason = "next prompt equals the full render" + ("" if turn_closed else "; synthetic turn close added")
            return BridgeResult(BridgeOutcome.APPEND, _pieces(tpl, turn_closed, segment, kind), prefix_ok=True,
                                turn_closed=turn_closed, reason=reason, history_matches=True, **control)
        self.closed = True
        seen = self._text + turn
        full_ids = tuple(tpl.tokenize(full))
        prefix = _history_prefix(tpl, history, self.tools, self.template_kwargs)
        if not full.startswith(prefix):
            return BridgeResult(BridgeOutcome.NOT_APPEND_ONLY, (), prefix_ok=False, turn_closed=turn_closed,
                                reason=_divergence(prefix, full), full_render_ids=full_ids,
                                history_matches=clean and seen == prefix, **control)
        why = (_divergence(seen, prefix) if seen != prefix else "its bytes are not valid UTF-8; they decode to "
               "U+FFFD, which the parsed message re-renders as other bytes")
        return BridgeResult(BridgeOutcome.SAMPLED_TEXT_DIFFERS, _pieces(tpl, turn_closed, full[len(prefix):], kind),
                            prefix_ok=True, turn_closed=turn_closed, reason="the sampled turn re-renders differently: "
                            + why, full_render_ids=full_ids, history_matches=False, **control)
