"""Control-token strings in environment text: found, counted and (optionally) escaped.

A tokenizer matches its added tokens before BPE, so the text ``<|im_end|>`` inside a tool result
or a user turn becomes the real control token, exactly as under Hugging Face's
``apply_chat_template`` and in serving. That lets a tool (or web content it returns) close the
turn and forge a new one. :class:`ControlTokens` knows a tokenizer's control tokens (its added
tokens flagged ``special``): the bridge counts them in the environment's messages, and a
:class:`~agentrl.chat.ChatTemplate` built with ``escape_control_tokens=True`` renders them in a
visibly escaped form (a backslash after the first character, ``<\\|im_end|>``) that tokenises as
plain text. Assistant messages are never touched: their tokens are the model's own.

Instances are immutable and safe to share between threads.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

__all__ = ["ControlTokens", "escaped"]


def escaped(token: str) -> str:
    """``token`` with a backslash after its first character: ``<|im_end|>`` becomes ``<\\|im_end|>``."""
    return token[:1] + "\\" + token[1:]


def _special_strings(tokenizer: Any) -> list[str]:
    """The tokenizer's added tokens flagged ``special`` (its ``all_special_tokens`` when it has no table)."""
    table = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(table, dict) and table:
        found = [str(t.content) for t in table.values() if getattr(t, "special", False)]
    else:
        found = [str(t) for t in getattr(tokenizer, "all_special_tokens", ())]
    return sorted({t for t in found if t}, key=len, reverse=True)  # longest first: the regex prefers it


class ControlTokens:
    """The control-token strings of one tokenizer, and what to do with them in message text."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self.tokens: tuple[str, ...] = tuple(tokens)
        self._pattern = re.compile("|".join(map(re.escape, self.tokens))) if self.tokens else None
        # a text holding none of the tokens' first characters holds no token: checked without the regex
        # (every environment message of every turn is counted; most hold no "<" at all)
        self._firsts = tuple(sorted({t[0] for t in self.tokens})) if all(self.tokens) else ("",)

    def check_escapable(self) -> None:
        """Raises ``ValueError`` when an escaped token would still hold a control token."""
        clashes = [t for t in self.tokens if any(other in escaped(t) for other in self.tokens)]
        if clashes:
            raise ValueError(f"escape_control_tokens: the escaped form of {clashes[0]!r} ({escaped(clashes[0])!r}) "
                             "still holds a control token; this tokenizer's tokens cannot be escaped this way")

    @classmethod
    def of(cls, tokenizer: Any) -> ControlTokens:
        """The control tokens of ``tokenizer`` (none when it is None)."""
        return cls(_special_strings(tokenizer) if tokenizer is not None else ())

    def count(self, messages: Iterable[dict[str, Any]]) -> Counter[str]:
        """How often each control token occurs in the text of the non-assistant ``messages``."""
        found: Counter[str] = Counter()
        if self._pattern is None:
            return found
        for message in messages:
            if message.get("role") != "assistant":
                for text in _texts(message.get("content")):
                    if any(first in text for first in self._firsts):
                        found.update(self._pattern.findall(text))
        return found

    def escape(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with every control token in non-assistant text escaped (copies only what changes)."""
        if self._pattern is None:
            return messages
        return [m if m.get("role") == "assistant" else self._escaped_message(m) for m in messages]

    def _escaped_message(self, message: dict[str, Any]) -> dict[str, Any]:
        content = message.get("content")
        if isinstance(content, str):
            new = self._escape_text(content)
            return message if new is content else {**message, "content": new}
        if isinstance(content, list):
            parts = [{**p, "text": self._escape_text(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str)
                     else p for p in content]
            return {**message, "content": parts}
        return message

    def _escape_text(self, text: str) -> str:
        assert self._pattern is not None
        if self._pattern.search(text) is None:
            return text
        return self._pattern.sub(lambda m: escaped(m.group(0)), text)


def _texts(content: Any) -> list[str]:
    """The text of a message's content: a string, or the ``text`` of each part of a list."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []
