"""``ChatTemplate``: render conversations exactly as Hugging Face does, encode them, know when a turn ends.

A ``ChatTemplate`` wraps one Jinja chat template: one of the three shipped with agentrl
(``qwen3``: Qwen3 hybrid thinking with JSON tool calls; ``qwen3_5``: Qwen3.5 with XML tool calls;
``qwen3_coder``: Qwen3-Coder with XML tools and calls) or any Hugging Face tokenizer's own
template. Rendering uses the same Jinja environment and input normalisation as
``apply_chat_template`` (see :mod:`agentrl.chat._jinja`), so the text is byte-identical to it.

It also owns the token boundary of a multi-turn episode: :meth:`ChatTemplate.bridge` returns the
ids to append after a sampled assistant turn (see :mod:`agentrl.chat.bridge`), and
:meth:`ChatTemplate.stop_token_ids` / :meth:`ChatTemplate.stop_strings` say where a generation
turn ends. Token ids are always resolved by string from the tokenizer, never hard-coded.

Control tokens in environment text (``<|im_end|>`` in a tool result) tokenise as the control tokens
themselves, as under ``apply_chat_template`` and in serving; ``escape_control_tokens=True`` renders
them escaped in every non-assistant message instead (:mod:`agentrl.chat._control`, docs/chat.md).

Instances are immutable after construction and safe to share between threads.

Example::

    from agentrl.chat import ChatTemplate
    from agentrl.testing import build_tokenizer

    tpl = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
    prompt = tpl.render([{"role": "user", "content": "2**10?"}], tools=[calc_schema], add_generation_prompt=True)
    ids = tpl.encode([{"role": "user", "content": "2**10?"}], add_generation_prompt=True)
    stop = tpl.stop_token_ids()              # (id of <|im_end|>,)
"""

from __future__ import annotations

import importlib.resources
from collections import Counter
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import jinja2

from agentrl.chat._bytes import TokenBytes
from agentrl.chat._control import ControlTokens
from agentrl.chat._jinja import compile_template, normalize_messages, normalize_tools

if TYPE_CHECKING:
    from agentrl.chat.bridge import BridgeResult
    from agentrl.chat.types import ParsedReply

__all__ = ["TEMPLATE_NAMES", "ChatTemplate", "ChatTemplateError", "ToolCallFormat", "detect_tool_call_format"]

ToolCallFormat = Literal["json", "xml"]
TEMPLATE_NAMES: tuple[str, ...] = ("qwen3", "qwen3_5", "qwen3_coder")
_SHIPPED_FORMATS: dict[str, ToolCallFormat] = {"qwen3": "json", "qwen3_5": "xml", "qwen3_coder": "xml"}
_QWEN_TURN_CLOSE = "<|im_end|>"
_QWEN_CALL_CLOSE = "</tool_call>"
# Errors a template can raise while rendering (raise_exception, undefined values, bad operand types).
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, AttributeError, IndexError, KeyError,
                  ZeroDivisionError, OverflowError)


def _fast_backend(tokenizer: Any) -> Any:
    """The Rust backend of a fast tokenizer with no truncation or padding configured, else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(backend, "truncation", None) is not None or \
            getattr(backend, "padding", None) is not None:
        return None
    return backend


def decode_keeping_special_tokens(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """``tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)``,
    through a fast tokenizer's Rust backend when it has one (same text, without the Python wrapper).

    Padding ids (``>= len(tokenizer)``: rows a checkpoint adds beyond the tokenizer, which the
    engine can sample) have no text and decode to nothing, with every kind of tokenizer (the Rust
    backend skips them itself)."""
    backend = _fast_backend(tokenizer)
    if backend is not None:
        return str(backend.decode(list(token_ids), skip_special_tokens=False))
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else None  # a bare decoder: nothing to filter by
    ids = [t for t in token_ids if size is None or 0 <= t < size]
    return str(tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))


class ChatTemplateError(ValueError):
    """The template refused the conversation (it raised, as the same template would under Hugging Face)."""


def _check_unicode(text: str) -> None:
    """Raises :class:`ChatTemplateError` when ``text`` is not valid Unicode (a tokenizer refuses it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ChatTemplateError(
            f"the conversation holds a lone surrogate {text[exc.start]!r} at character {exc.start} (near "
            f"{text[max(exc.start - 30, 0):exc.end + 30]!r}): not valid Unicode, so no tokenizer can encode it "
            "(text decoded with errors='surrogateescape'?)") from None


def detect_tool_call_format(source: str) -> ToolCallFormat:
    """``"xml"`` if the template writes ``<function=`` or ``<parameter=`` calls, else ``"json"``."""
    return "xml" if ("<function=" in source or "<parameter=" in source) else "json"


def _shipped_source(name: str) -> str:
    return importlib.resources.files("agentrl.templates").joinpath(f"{name}.jinja").read_text(encoding="utf-8")


class ChatTemplate:
    """One chat template plus (optionally) the tokenizer whose ids it produces.

    Attributes: ``name``, ``source`` (the Jinja text), ``tool_call_format`` (``"json"`` or
    ``"xml"``), ``tokenizer`` (a Hugging Face tokenizer or None), ``turn_close`` (the string that
    ends a turn, ``<|im_end|>`` for Qwen), ``call_close`` (``</tool_call>``, or None when the
    template has no tool calls) and ``escape_control_tokens`` (off by default: see the module doc).
    """

    def __init__(self, source: str, *, name: str = "custom", tokenizer: Any = None,
                 tool_call_format: ToolCallFormat | None = None, turn_close: str | None = None,
                 escape_control_tokens: bool = False) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"ChatTemplate.source: expected the Jinja template text, got {source!r:.80}")
        if tool_call_format not in (None, "json", "xml"):
            raise ValueError(f"ChatTemplate.tool_call_format: expected 'json' or 'xml', got {tool_call_format!r}")
        if not isinstance(escape_control_tokens, bool):
            raise ValueError(f"ChatTemplate.escape_control_tokens: expected True or False, got {escape_control_tokens!r}")
        self.name = name
        self.source = source
        self.tokenizer = tokenizer
        self.tool_call_format: ToolCallFormat = tool_call_format or detect_tool_call_format(source)
        self._turn_close = turn_close or self._default_turn_close()
        self.call_close: str | None = _QWEN_CALL_CLOSE if _QWEN_CALL_CLOSE in source else None
        self._compiled = compile_template(source)
        self._special_tokens: dict[str, Any] = {}
        self._turn_close_id: int | None = None
        self._stop_ids: dict[bool, tuple[int, ...]] = {}  # resolved once: every episode asks
        self.escape_control_tokens = escape_control_tokens
        self._control = ControlTokens.of(tokenizer)
        if escape_control_tokens:
            self._control.check_escapable()
        if tokenizer is not None:
            # apply_chat_template passes the special tokens (bos_token, eos_token, ...) to the template too.
            self._special_tokens = {k: v for k, v in dict(getattr(tokenizer, "special_tokens_map", {})).items()
                                    if v is not None}
            if self._turn_close is not None:
                self._turn_close_id = self.token_id(self._turn_close)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_name(cls, name: str, tokenizer: Any = None, *, escape_control_tokens: bool = False) -> ChatTemplate:
        """A template shipped with agentrl: ``"qwen3"``, ``"qwen3_5"`` or ``"qwen3_coder"``."""
        if name not in _SHIPPED_FORMATS:
            raise ValueError(f"ChatTemplate.from_name: unknown template {name!r}; expected one of {TEMPLATE_NAMES}")
        return cls(_shipped_source(name), name=name, tokenizer=tokenizer, tool_call_format=_SHIPPED_FORMATS[name],
                   turn_close=_QWEN_TURN_CLOSE, escape_control_tokens=escape_control_tokens)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, *, escape_control_tokens: bool = False) -> ChatTemplate:
        """The tokenizer's own ``chat_template`` (the ``"default"`` entry if it holds several).

        The tool-call format is detected from the text (XML if it contains ``<function=`` or
        ``<parameter=``); pin it in your run config rather than re-detecting per request.
        """
        source = getattr(tokenizer, "chat_template", None)
        if isinstance(source, dict):
            source = source.get("default")
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"ChatTemplate.from_tokenizer: tokenizer {type(tokenizer).__name__} has no chat_template")
        name = str(getattr(tokenizer, "name_or_path", "") or "tokenizer")
        return cls(source, name=name, tokenizer=tokenizer, escape_control_tokens=escape_control_tokens)

    def _default_turn_close(self) -> str | None:
        if _QWEN_TURN_CLOSE in self.source:
            return _QWEN_TURN_CLOSE
        eos = getattr(self.tokenizer, "eos_token", None)
        return eos if isinstance(eos, str) and eos else None

    @property
    def turn_close(self) -> str:
        """The string that ends an assistant turn (``<|im_end|>`` for Qwen), needed by stops and the bridge."""
        if self._turn_close is None:
            raise ValueError(f"ChatTemplate {self.name!r}: cannot tell which token closes a turn (no <|im_end|> in "
                             "the template and no tokenizer eos_token); pass turn_close= to the constructor")
        return self._turn_close

    # -- rendering ----------------------------------------------------------------------------
    def render(self, messages: Sequence[Any], tools: Sequence[Any] | None = None,
               add_generation_prompt: bool = False, **template_kwargs: Any) -> str:
        """The conversation as text, byte-identical to ``apply_chat_template(..., tokenize=False)``.

        ``messages``: ``Message`` objects or OpenAI-style dicts. ``tools``: OpenAI function dicts
        or objects with ``to_openai()``/``schema()``. Extra keyword arguments (``enable_thinking``
        and the like) are passed to the template. Raises :class:`ChatTemplateError` where the
        template raises, ``TypeError``/``ValueError`` for input that is not a conversation.
        """
        return self.render_normalized(normalize_messages(messages), normalize_tools(tools), add_generation_prompt,
                                      **template_kwargs)

    def render_normalized(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                          add_generation_prompt: bool = False, **template_kwargs: Any) -> str:
        """:meth:`render` for input already passed through ``normalize_messages``/``normalize_tools``
        (the bridge keeps its history normalised and skips that work on every turn)."""
        variables: dict[str, Any] = {**self._special_tokens, "documents": None, **template_kwargs}
        if self.escape_control_tokens:
            messages = self._control.escape(messages)
        try:
            return self._compiled.render(messages=messages, tools=tools,
                                         add_generation_prompt=add_generation_prompt, **variables)
        except _RENDER_ERRORS as exc:
            raise ChatTemplateError(f"template {self.name!r} rejected the conversation: "
                                    f"{type(exc).__name__}: {exc}") from exc

    def encode(self, messages: Sequence[Any], tools: Sequence[Any] | None = None,
               add_generation_prompt: bool = False, **template_kwargs: Any) -> list[int]:
        """Token ids of :meth:`render` (no BOS/EOS added), as ``apply_chat_template(tokenize=True)``."""
        return self.tokenize(self.render(messages, tools, add_generation_prompt, **template_kwargs))

    def tokenize(self, text: str) -> list[int]:
        """Ids of ``text`` alone, without special tokens added (special/added tokens in it still match).

        Same ids as ``tokenizer.encode(text, add_special_tokens=False)``; a fast tokenizer's Rust
        backend is called directly when it has no truncation or padding configured.
        """
        tok = self._require_tokenizer("tokenize")
        backend = _fast_backend(tok)
        try:
            if backend is not None:
                return list(backend.encode(text, add_special_tokens=False).ids)
            return list(tok.encode(text, add_special_tokens=False))
        except (TypeError, UnicodeEncodeError):
            _check_unicode(text)
            raise

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` with special tokens kept (what the parser should read)."""
        return decode_keeping_special_tokens(self._require_tokenizer("decode"), token_ids)

    def token_bytes(self, token_ids: Sequence[int]) -> bytes | None:
        """The bytes ``token_ids`` spell (invalid UTF-8 included, where :meth:`decode` shows U+FFFD), or
        None when the tokenizer's vocabulary is not byte-level BPE. Padding ids spell nothing."""
        return self._token_bytes(token_ids)

    @cached_property
    def _token_bytes(self) -> TokenBytes:
        return TokenBytes(self._require_tokenizer("token_bytes"))

    def count_control_tokens(self, messages: list[dict[str, Any]]) -> Counter[str]:
        """How often each control token of the tokenizer (its added tokens flagged special) occurs in the
        text of the non-assistant ``messages`` (normalised dicts), escaped or not when rendered."""
        return self._control.count(messages)

    # -- tokens and stops ---------------------------------------------------------------------
    def token_id(self, token: str) -> int:
        """The single id of ``token`` in the tokenizer; raises if it is not one token there."""
        tok = self._require_tokenizer("token_id")
        ids = tok.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"ChatTemplate {self.name!r}: token {token!r} is not a single token in "
                             f"{type(tok).__name__} (encodes to {list(ids)[:8]}); the tokenizer does not match "
                             "this template")
        return int(ids[0])

    @property
    def turn_close_id(self) -> int:
        """Id of :attr:`turn_close` (EOS of a generation turn). Needs a tokenizer."""
        self._require_tokenizer("turn_close_id")
        _ = self.turn_close  # raises when nothing closes a turn, the one case __init__ leaves the id unset
        assert self._turn_close_id is not None
        return self._turn_close_id

    def stop_strings(self, *, one_call_per_turn: bool = False) -> tuple[str, ...]:
        """Strings a generation turn ends on: the turn close, plus ``</tool_call>`` in one-call-per-turn mode.

        In one-call-per-turn mode the model does not write the turn close itself; the bridge then
        appends a synthetic one as scaffold (loss mask 0, never sampled).
        """
        if not one_call_per_turn:
            return (self.turn_close,)
        if self.call_close is None:
            raise ValueError(f"ChatTemplate {self.name!r}: one_call_per_turn needs a template with </tool_call> calls")
        return (self.turn_close, self.call_close)

    def stop_token_ids(self, *, one_call_per_turn: bool = False) -> tuple[int, ...]:
        """Ids of :meth:`stop_strings`, resolved by string from the tokenizer (each must be one token)."""
        ids = self._stop_ids.get(one_call_per_turn)
        if ids is None:
            ids = self._stop_ids[one_call_per_turn] = tuple(
                self.token_id(s) for s in self.stop_strings(one_call_per_turn=one_call_per_turn))
        return ids

    # -- parsing ------------------------------------------------------------------------------
    def parse(self, completion: str | Sequence[int], tools: Sequence[Any] | None = None, *, strict: bool = False,
              max_calls: int | None = None) -> ParsedReply:
        """Parses a sampled turn (text, or ids decoded with special tokens kept) in this template's
        tool-call format; see :func:`agentrl.chat.parse.parse_tool_calls`. Never raises on model output."""
        from agentrl.chat.parse import parse_tool_calls

        text = completion if isinstance(completion, str) else self.decode(completion)
        return parse_tool_calls(text, self.tool_call_format, tools, strict=strict, max_calls=max_calls)

    # -- multi-turn ---------------------------------------------------------------------------
    def bridge(self, token_ids: Sequence[int], messages: Sequence[Any], new_messages: Sequence[Any], *,
               tools: Sequence[Any] | None = None, audit: bool = False, **template_kwargs: Any) -> BridgeResult:
        """What to append after a sampled assistant turn so the next prompt equals a full render.

        See :func:`agentrl.chat.bridge.bridge_turn` for the contract.
        """
        from agentrl.chat.bridge import bridge_turn

        return bridge_turn(self, token_ids, messages, new_messages, tools=tools, audit=audit, **template_kwargs)

    def _require_tokenizer(self, what: str) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"ChatTemplate {self.name!r}.{what}: needs a tokenizer; build it with "
                             f"ChatTemplate.from_name({self.name!r}, tokenizer=...) or from_tokenizer(...)")
        return self.tokenizer

    def __repr__(self) -> str:
        tok = type(self.tokenizer).__name__ if self.tokenizer is not None else None
        return f"ChatTemplate(name={self.name!r}, tool_call_format={self.tool_call_format!r}, tokenizer={tok})"
