"""Where an error of the user's code happened, as ``path:line in function``; a leaf module.

An environment, an agent harness or a reward that fails in a training run fails in another task,
thread or process; its episode keeps the error as a value (:class:`agentrl.trajectory.EpisodeError`)
and, with :func:`exception_origin`, the place it came from, so that a run stopped by it can say
where to look (:mod:`agentrl.rollout.scheduler`, ``max_consecutive_failed_groups``).

- :func:`exception_origin`: the innermost frame of an exception's traceback outside the standard
  library, installed packages and agentrl itself (the user's code; None when no frame is, as for a
  deadline agentrl enforces), read from ``__traceback__`` or, for an exception a worker process sent back, from the
  traceback text it carries (``exc.traceback``, as :mod:`pebble` attaches it); an exception may
  name its origin itself with an ``origin`` attribute (a reward that returned no number: where the
  reward function is defined);
- :func:`function_origin`: where a function (or a callable object's ``__call__``) is defined;
- :func:`source_line`: the source text at an origin, for a report.

Paths under the current directory are relative to it.

Example::

    try:
        env.reset()
    except Exception as exc:
        exception_origin(exc)   # 'my_envs.py:41 in reset'
"""

from __future__ import annotations

import inspect
import linecache
import os
import re
import sysconfig
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["exception_origin", "function_origin", "source_line"]

_REMOTE_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$', re.MULTILINE)
_ORIGIN = re.compile(r"^(?P<path>.+):(?P<line>\d+) in .+$")


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get("stdlib"), paths.get("platstdlib"), paths.get("purelib"), paths.get("platlib"),
             os.path.dirname(os.path.abspath(__file__))}  # the agentrl package itself, installed or not
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots if r))


_LIBRARIES = _library_roots()


def _is_library(path: str) -> bool:
    if path.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return True
    return os.path.realpath(path).startswith(_LIBRARIES)


def _shown(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if rel.startswith("..") else rel


def _pick(frames: list[tuple[str, int, str]]) -> str | None:
    found = next((f for f in reversed(frames) if not _is_library(f[0])), None)
    return None if found is None else f"{_shown(found[0])}:{found[1]} in {found[2]}"


def exception_origin(exc: BaseException) -> str | None:
    """``path:line in function`` where ``exc`` was raised in the user's code (see the module doc), or None."""
    named = getattr(exc, "origin", None)
    if isinstance(named, str) and named:
        return named
    remote = getattr(exc, "traceback", None)
    if isinstance(remote, str):
        found = [(m["path"], int(m["line"]), m["name"].strip()) for m in _REMOTE_FRAME.finditer(remote)]
        if found:
            return _pick(found)
    if exc.__traceback__ is None:
        return None
    return _pick([(frame.f_code.co_filename, line, frame.f_code.co_qualname)
                  for frame, line in traceback.walk_tb(exc.__traceback__)])


def function_origin(fn: Callable[..., Any]) -> str | None:
    """``path:line in name`` where ``fn`` is defined, or None: a wrapper that names what it wraps
    (``__wrapped__``, as ``functools.wraps`` and agentrl's reward adapters do) is seen through, and a
    callable object is its class's ``__call__``."""
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None and wrapped is not fn and callable(wrapped):
        return function_origin(wrapped)
    target: Any = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        target = type(fn).__call__
    target = inspect.unwrap(getattr(target, "__func__", target))
    code = getattr(target, "__code__", None)
    if code is None:
        return None
    return f"{_shown(code.co_filename)}:{code.co_firstlineno} in {getattr(target, '__qualname__', code.co_name)}"


def source_line(origin: str | None) -> str | None:
    """The stripped source line an origin (``path:line in function``) points at, when the file is readable."""
    match = _ORIGIN.match(origin or "")
    if match is None:
        return None
    text = linecache.getline(match["path"], int(match["line"])).strip()
    return text or None

