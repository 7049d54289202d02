"""``NamedEnum``: the string enum every agentrl status, kind and policy uses.

Its one difference from ``(str, Enum)``: an unknown value is refused with the valid names listed
(``'gpu' is not a valid RouterPolicy; expected one of 'round_robin', ...``), so a typo in a config
file or a command line says what would have been accepted.
"""

from __future__ import annotations

from enum import Enum
from typing import NoReturn

__all__ = ["NamedEnum"]


class NamedEnum(str, Enum):
    """A string enum whose unknown-value error lists the valid values."""

    @classmethod
    def _missing_(cls, value: object) -> NoReturn:
        names = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{value!r} is not a valid {cls.__name__}; expected one of {names}")
