"""``without_lone_surrogates``: JSON-like data made writable as UTF-8.

A Python string may hold a lone surrogate (``"\\udcff"``: text decoded with
``errors="surrogateescape"``, or a JSON ``"\\ud800"`` escape). It is not Unicode: UTF-8 cannot encode
it, orjson refuses it, and no reader can load an escaped one back. Files are written with each one
replaced by U+FFFD, the replacement character, as a decoder does for bytes it cannot read.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["without_lone_surrogates"]

_LONE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(value: Any) -> Any:
    """``value`` (dicts, lists, tuples, strings, scalars) with every lone surrogate replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_lone_surrogates(v) for v in value]
    return value
