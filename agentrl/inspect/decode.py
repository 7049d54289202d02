"""Token ids to the text of each token, for the viewer's token-level view.

A trajectory holds ids, not text. :func:`token_decoder` wraps whatever can decode them: a Hugging
Face tokenizer (anything with ``decode``), a ``tokenizers.Tokenizer``, a ``tokenizer.json`` file or
a folder holding one (loaded with the ``tokenizers`` library only: no transformers import). A byte
that is only part of a character (byte-level BPE splits UTF-8 sequences) shows as nothing on its
token; the whole character shows on the token that completes it.

Example::

    decode = token_decoder("runs/exp1/model")   # a folder with tokenizer.json
    decode([9707, 11, 1879])                    # ['Hello', ',', ' world']
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["TokenDecoder", "token_decoder"]

TokenDecoder = Callable[[Sequence[int]], list[str]]
"""Maps ids to one string per id (same length)."""

_REPLACEMENT = "\ufffd"
_MAX_CARRY = 4  # a UTF-8 character spans at most 4 bytes, so at most 4 byte-level tokens


def _from_pieces(decode_one: Callable[[list[int]], str]) -> TokenDecoder:
    def decode(ids: Sequence[int]) -> list[str]:
        out: list[str] = []
        carry: list[int] = []  # ids whose bytes do not yet form whole characters
        for t in ids:
            if carry:
                joined = decode_one([*carry, t])
                if not joined.endswith(_REPLACEMENT) or len(carry) >= _MAX_CARRY:
                    out.append(joined)
                    carry = []
                else:
                    out.append("")
                    carry.append(t)
                continue
            text = decode_one([t])
            if text.endswith(_REPLACEMENT) and len(text) == 1:
                carry = [t]
                out.append("")
            else:
                out.append(text)
        if carry:  # an unfinished character at the end: show the replacement character
            out[-1] = decode_one(carry)
        return out

    return decode


def _from_tokenizers(tok: Any) -> TokenDecoder:
    return _from_pieces(lambda ids: str(tok.decode(ids, skip_special_tokens=False)))


def token_decoder(source: Any) -> TokenDecoder:
    """A :data:`TokenDecoder` for ``source`` (see the module doc); raises ``ValueError`` naming
    what it got when it cannot build one."""
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"tokenizer: {str(path)!r} is neither a tokenizer.json file nor a folder holding one")
        from tokenizers import Tokenizer

        try:
            return _from_tokenizers(Tokenizer.from_file(str(file)))
        except Exception as exc:  # the tokenizers library raises its own exception type
            raise ValueError(f"tokenizer: cannot load {str(file)!r} ({exc})") from exc
    if hasattr(source, "decode"):
        return _from_tokenizers(source)
    raise ValueError(f"tokenizer: expected a tokenizer (with decode), a tokenizer.json path or a folder, "
                     f"got {type(source).__name__}")
