"""Durable file writes shared by the run folder and the checkpointer.

A file is written to a temporary sibling, flushed and ``fsync``-ed, then renamed over its final
name, and the parent folder is ``fsync``-ed so the rename itself survives a crash: a reader sees the
old file or the new one, never a half-written one. :func:`json_bytes` serialises with orjson and,
when a value is not JSON, names where it sits (``state['scheduler']['rng'][2]``).

Example::

    write_atomic(run / "summary.json", json_bytes({"steps": 3}, what="summary"))
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from agentrl._unicode import without_lone_surrogates

__all__ = ["fsync_dir", "fsync_tree", "json_bytes", "temp_name", "write_atomic"]


def temp_name(path: Path) -> Path:
    """A hidden sibling of ``path`` that no reader lists: ``.<name>.tmp-<random>``."""
    return path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")


def fsync_dir(path: Path) -> None:
    """Makes the entries of folder ``path`` (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """``fsync`` every file and folder under ``root`` (children before parents), ``root`` last."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            file = Path(dirpath, name)
            if not file.is_symlink():
                _fsync_file(file)
        fsync_dir(Path(dirpath))


def read_json_object(path: Path, error: type[Exception], missing: str) -> dict[str, Any]:
    """The JSON object in ``path``; ``error`` (naming the file) when it is missing (``missing`` says
    what was expected), not JSON, or not an object."""
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError as exc:
        raise error(f"{path}: {missing}") from exc
    except orjson.JSONDecodeError as exc:
        raise error(f"{path}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def write_atomic(path: Path, data: bytes) -> Path:
    """Writes ``data`` to ``path`` through a temporary sibling, fsync and rename; returns ``path``."""
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def _find_unserialisable(value: object, where: str) -> str | None:
    """The first place under ``value`` that orjson cannot write as JSON, as a subscript path."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where}[{key!r}] (a {type(key).__name__} key; expected str keys)"
            found = _find_unserialisable(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        for i, item in enumerate(value):
            found = _find_unserialisable(item, f"{where}[{i}]")
            if found:
                return found
        return None
    try:
        orjson.dumps(value)
    except TypeError:
        return f"{where} (a {type(value).__name__})"
    return None


def json_bytes(value: object, *, what: str, option: int = 0) -> bytes:
    """``orjson.dumps(value)``; a value that is not JSON raises ``TypeError`` naming its place.

    Non-finite floats are written as ``null`` (orjson's rule), never an error; a lone surrogate in a
    string (not Unicode, e.g. an environment's text decoded with ``surrogateescape``) as U+FFFD.
    """
    try:
        return orjson.dumps(value, option=option)
    except TypeError as exc:
        if "surrogates not allowed" in str(exc):
            return json_bytes(without_lone_surrogates(value), what=what, option=option)
        place = _find_unserialisable(value, what) or what
        raise TypeError(f"{place}: not JSON-serialisable ({exc}); expected dicts with str keys, lists, "
                        f"str, int, float, bool or None") from exc
