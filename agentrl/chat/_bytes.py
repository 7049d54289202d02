"""The bytes a sequence of token ids spells, for byte-level BPE tokenizers (Qwen, GPT-2, Llama 3).

Decoding ids to ``str`` is lossy twice over: bytes that are not valid UTF-8 (a multi-byte character
cut between tokens, or a model sampling a stray byte) become U+FFFD, and the text then no longer
says which bytes were sampled. The bridge's audit compares bytes instead (:class:`TokenBytes`):
each id of a byte-level vocabulary is a string of byte symbols (GPT-2's ``bytes_to_unicode``
table), added tokens are their text in UTF-8, and padding ids (beyond the tokenizer) spell
nothing. For any other kind of vocabulary the bytes are unknown (``None``) and callers fall back
to comparing ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = ["TokenBytes"]


@lru_cache(maxsize=1)
def _symbol_bytes() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode``, inverted: the printable symbol of each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = list(printable)
    shifted = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            symbols.append(256 + shifted)
            shifted += 1
    return {chr(s): b for b, s in zip(printable, symbols, strict=True)}


def _is_byte_level(backend: Any) -> bool:
    decoder = getattr(backend, "decoder", None)
    return decoder is not None and type(decoder).__name__ == "ByteLevel"


class TokenBytes:
    """``token_bytes(ids)``: the bytes ``ids`` spell, or None when the tokenizer is not byte-level.

    Built once per tokenizer (reading its added tokens); each call looks ids up one by one.
    """

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend if _is_byte_level(backend) else None
        table = getattr(tokenizer, "added_tokens_decoder", None) if self._backend is not None else None
        self._added = {int(i): str(t.content).encode("utf-8") for i, t in (table or {}).items()}
        self._size = len(tokenizer) if self._backend is not None else 0

    def __call__(self, token_ids: Sequence[int]) -> bytes | None:
        if self._backend is None:
            return None
        symbols = _symbol_bytes()
        out = bytearray()
        for i in token_ids:
            added = self._added.get(i)
            if added is not None:
                out += added
                continue
            token = self._backend.id_to_token(i) if 0 <= i < self._size else None
            if token is None:  # a padding id: no text, no bytes
                continue
            try:
                out += bytes(symbols[c] for c in token)
            except KeyError:  # not a byte symbol after all: the bytes are unknown
                return None
        return bytes(out)
