"""TOML reading on every supported Python: the standard library's ``tomllib`` (3.11+) or ``tomli``."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["TOMLDecodeError", "loads"]

loads = tomllib.loads
TOMLDecodeError = tomllib.TOMLDecodeError
