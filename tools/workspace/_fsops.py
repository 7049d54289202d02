"""The file tools' program: runs *inside* a workspace's sandbox, one execution per call.

Standard library only (run by the sandbox's interpreter, loaded from ``/opt/agentrl``). Each
operation opens its path beneath the workspace root with ``openat2(RESOLVE_BENEATH)``
(:mod:`_resolve`), so neither ``..`` nor a symlink (absolute, or relative and pointing out) reaches
anything outside ``/work``, even if the path changes while it is opened; and the program runs in the
sandbox, where nothing of the host is visible anyway. Reads its request (JSON) on stdin, any size;
prints one JSON object: the operation's result, or ``{"error": message}``.

What real repositories hold: a text file is read a page at a time (whole lines from ``start_line``
up to ``max_chars`` characters; one longer line is cut), with the line counts the caller needs to
say what was left out; a name that is not UTF-8 is shown with its odd bytes escaped (``caf\\xe9``),
and a path written that way names the file.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.tools.workspace import _resolve
elif "_resolve" in sys.modules:  # loaded already (the unit tests, the holder)
    _resolve = sys.modules["_resolve"]
else:  # run from its own folder (the sandbox's /opt/agentrl), standard library only
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import _resolve
    finally:
        sys.path.pop(0)  # only for this import: the folder holds modules named like installed packages

ROOT = "/work"
READ_CAP = 1 << 20  # the most an edit reads
SCAN_CAP = 64 << 20  # the most a read scans to count a file's lines
PAGE_CHARS = 4000
LIST_CAP = 500
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


class OpError(Exception):
    """A refusal with a message for the model."""


def relative(path: str, root: str = ROOT) -> str:
    """``path`` relative to the workspace root; ``OpError`` for a path that names a place outside."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise OpError(f"path {path!r}: expected a non-empty path inside {root}")
    if path.startswith("/"):
        if path != root and not path.startswith(root + "/"):
            raise OpError(f"path {path!r} is outside the workspace; expected a path under {root} or relative to it")
        path = path[len(root):].lstrip("/") or "."
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise OpError(f"path {path!r} leads outside the workspace ('..' above {root})")
            parts.pop()
            continue
        parts.append(part)
    return "/".join(parts) or "."


def shown(name: str) -> str:
    """``name`` as text: bytes that are not UTF-8 written as ``\\xNN`` (never a lone surrogate, which
    no chat template or JSON encoder takes)."""
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError:  # a surrogate that no byte decodes to
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _unescaped(rel: str) -> str | None:
    """The path whose odd bytes ``rel`` writes as ``\\xNN`` (see :func:`shown`), or None."""
    if not _ESCAPE.search(rel):
        return None
    raw = _ESCAPE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)) if int(m.group(1), 16) >= 0x80 else m.group(0), rel)
    return raw if raw != rel else None


def _open(root_fd: int, rel: str, flags: int, mode: int = 0o644) -> int:
    try:
        return _open_escaped(root_fd, rel, flags, mode)
    except _resolve.Escape as exc:
        raise OpError(exc.strerror) from None
    except FileNotFoundError:
        raise OpError(f"{rel}: no such file or directory") from None
    except IsADirectoryError:
        raise OpError(f"{rel}: is a directory") from None
    except NotADirectoryError:
        raise OpError(f"{rel}: not a directory (a part of the path is a file)") from None
    except PermissionError:
        raise OpError(f"{rel}: permission denied") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OpError(f"{rel}: a symlink; the file tools do not follow a symlink at the end of a path "
                          "(use its target's path)") from None
        raise


def _open_escaped(root_fd: int, rel: str, flags: int, mode: int) -> int:
    """Opens ``rel``; a path that does not exist as written but does with its ``\\xNN`` escapes
    undone is that one."""
    try:
        return _resolve.open_beneath(root_fd, rel, flags | os.O_NONBLOCK, mode)
    except FileNotFoundError:
        raw = _unescaped(rel)
        if raw is None:
            raise
        return _resolve.open_beneath(root_fd, raw, (flags & ~os.O_CREAT) | os.O_NONBLOCK, mode)


def _regular(fd: int, rel: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OpError(f"{rel}: not a regular file")
    return st


def _read_text(root_fd: int, rel: str) -> tuple[str, int]:
    fd = _open(root_fd, rel, os.O_RDONLY)
    try:
        st = _regular(fd, rel)
        data = os.read(fd, READ_CAP + 1) if st.st_size else b""
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    if b"\0" in data[:8192]:
        raise OpError(f"{rel}: a binary file ({st.st_size} bytes); not shown")
    return data[:READ_CAP].decode("utf-8", "replace"), st.st_size


def _lines(fd: int, longest: int) -> Any:
    """The file's lines as bytes (the last one may lack its newline), read in chunks; a line longer
    than ``longest`` bytes comes as its start only."""
    pending = b""
    read = 0
    while read < SCAN_CAP:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        read += len(chunk)
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line + b"\n"
        if len(pending) > longest:  # a long line: only its start is ever shown
            yield pending
            pending = b""
            while True:  # skip the rest of that line
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return
                read += len(chunk)
                cut = chunk.find(b"\n")
                if cut >= 0:
                    pending = chunk[cut + 1:]
                    break
    if pending:
        yield pending


def read(root_fd: int, path: str, start_line: int = 1, max_lines: int = 0, max_chars: int = PAGE_CHARS) -> dict[str, Any]:
    """A page of a text file: whole lines from ``start_line`` (1-based), at most ``max_lines`` of them
    (0: no count limit) and ``max_chars`` characters (a first line longer than that is cut). The
    result says which lines it holds (``first``, ``last``), how many the file has (``lines``, None
    past :data:`SCAN_CAP` bytes), and ``cut_line``: whether the one line shown was cut."""
    rel = relative(path)
    first, budget = max(1, int(start_line)), max(1, int(max_chars))
    fd = _open(root_fd, rel, os.O_RDONLY)
    try:
        st = _regular(fd, rel)
        if b"\0" in os.pread(fd, 8192, 0):
            raise OpError(f"{rel}: a binary file ({st.st_size} bytes); not shown")
        out: list[str] = []
        used, number, last, cut_line = 0, 0, 0, False
        for number, raw in enumerate(_lines(fd, budget * 4 + 4), start=1):
            if number < first or last:
                continue
            text = raw.decode("utf-8", "replace")
            if not out and len(text) > budget:
                out.append(text[:budget])
                cut_line = True
                last = number
            elif used + len(text) > budget or (max_lines and len(out) >= int(max_lines)):
                last = number - 1
            else:
                out.append(text)
                used += len(text)
        total = number if os.lseek(fd, 0, os.SEEK_CUR) < SCAN_CAP or st.st_size <= SCAN_CAP else None
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # (_regular closed it)
    return {"content": "".join(out), "first": first, "last": last or (first + len(out) - 1), "lines": total,
            "size": st.st_size, "cut_line": cut_line}


def write(root_fd: int, path: str, content: str) -> dict[str, Any]:
    rel = relative(path)
    if rel == ".":
        raise OpError(f"path {path!r}: expected a file path, got the workspace root")
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OpError(f"content: not valid Unicode at character {exc.start} ({exc.reason})") from None
    try:
        parent = _resolve.make_parents(root_fd, rel)
    except _resolve.Escape as exc:
        raise OpError(exc.strerror) from None
    except NotADirectoryError:
        raise OpError(f"{rel}: a part of the path is a file, not a directory") from None
    try:
        name = _resolve.split_parent(rel)[1]
        fd = _open(parent, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    finally:
        os.close(parent)
    try:
        _regular(fd, rel)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    return {"bytes": len(data)}


def edit(root_fd: int, path: str, old: str, new: str, replace_all: bool = False) -> dict[str, Any]:
    rel = relative(path)
    if not old:
        raise OpError("old_text is empty; expected the exact text to replace")
    text, size = _read_text(root_fd, rel)
    if size > READ_CAP:
        raise OpError(f"{rel}: {size} bytes, larger than the {READ_CAP} the edit tool handles")
    count = text.count(old)
    if count == 0:
        raise OpError(f"{rel}: old_text not found; expected it exactly as in the file (read it first)")
    if count > 1 and not replace_all:
        raise OpError(f"{rel}: old_text occurs {count} times; expected exactly once (add context, or set "
                      "replace_all)")
    write(root_fd, rel, text.replace(old, new) if replace_all else text.replace(old, new, 1))
    return {"replacements": count if replace_all else 1}


def _describe(dir_fd: int, name: str) -> tuple[str, bool]:
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        return shown(name) + "/", True
    if stat.S_ISLNK(st.st_mode):
        return f"{shown(name)} -> {shown(os.readlink(name, dir_fd=dir_fd))}", False
    if stat.S_ISREG(st.st_mode):
        return f"{shown(name)} ({st.st_size} bytes)", False
    return f"{shown(name)} (special file)", False


def list_dir(root_fd: int, path: str = ".", depth: int = 1) -> dict[str, Any]:
    rel = relative(path)
    depth = max(1, min(int(depth), 4))
    out: list[str] = []
    cut = False

    def walk(fd: int, prefix: str, level: int) -> None:
        nonlocal cut
        for name in sorted(os.listdir(fd)):
            if len(out) >= LIST_CAP:
                cut = True
                return
            try:
                text, is_dir = _describe(fd, name)
            except OSError:
                continue
            out.append(prefix + text)
            if is_dir and level < depth:
                try:
                    sub = _resolve.open_beneath(fd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    walk(sub, prefix + shown(name) + "/", level + 1)
                finally:
                    os.close(sub)

    fd = _open(root_fd, rel, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk(fd, "", 1)
    finally:
        os.close(fd)
    return {"entries": out, "cut": cut}


OPS: dict[str, Callable[..., dict[str, Any]]] = {"read": read, "write": write, "edit": edit, "list": list_dir}


def main(request: dict[str, Any], root: str = ROOT) -> None:
    """Runs one request ``{"op": ..., **arguments}`` and prints its JSON result."""
    try:
        op = OPS[request.pop("op")]
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            result = op(root_fd, **request)
        finally:
            os.close(root_fd)
    except OpError as exc:
        result = {"error": shown(str(exc))}
    except OSError as exc:
        result = {"error": shown(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))}
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
