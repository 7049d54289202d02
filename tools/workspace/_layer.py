"""A workspace's files as data: their hash and their snapshot, at the cost of what they hold.

Part of the programs that run next to a workspace: the standard library only, never imported by the
host. The holder (``_holder.py``) writes and reads snapshots with it; the per-step hash runs as a
program in the episode's own sandbox (its CPU time and memory are the episode's, never its group's):
``main({"op": "digest", "top": ..., "ignore": [...]})`` prints ``{"digest", "entries", "bytes"}``.

Every walk uses file descriptors (``openat`` below a directory fd, never following a symlink) and
names as bytes (a name that is not UTF-8 hashes and snapshots like any other). A file's content is
read only where it has data (``SEEK_DATA``/``SEEK_HOLE``): a sparse file of 10 GiB with a few pages
written costs those pages, in time and memory, and everything streams in chunks of at most 1 MiB.

- hash: per entry (depth first) its depth, name, kind, mode and content hash; the content hash of a file with no hole is
  the SHA-256 of its bytes, that of a file with holes hashes its size and its non-zero 4 KiB pages
  (so a hole and written zeros hash alike there);
- snapshot (:func:`write_snapshot`): ``MAGIC``, then per entry (depth first) a 4-byte length, a JSON
  header (depth, name as base64, kind, mode, size, data extents) and the extents' bytes, then a zero
  length. A snapshot holds what the layer allocated plus a header of at most a few hundred bytes per
  file, and :func:`write_snapshot` stops at ``cap`` bytes.
"""

from __future__ import annotations

import base64
import errno
import fnmatch
import hashlib
import json
import os
import stat
import struct
import sys
from collections.abc import Callable, Iterator
from typing import Any

MAGIC = b"AGENTRL-LAYER-2\n"
OPAQUE = "user.overlay.opaque"
CHUNK = 1 << 20
PAGE = 4096
_ZERO_PAGE = bytes(PAGE)


MAX_DEPTH = 256


class TooLarge(Exception):
    """A snapshot would exceed its cap."""


class TooDeep(Exception):
    """Folders nested deeper than :data:`MAX_DEPTH`."""


def extents(fd: int, size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the parts of a file that hold data; holes are left out."""
    out: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data after pos: a hole up to the end
                break
            return [(0, size)]  # no SEEK_DATA on this filesystem: all of it is data
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if end > start:
            out.append((start, end - start))
        pos = end
    return out


def _chunks(fd: int, offset: int, length: int) -> Iterator[tuple[int, bytes]]:
    end = offset + length
    while offset < end:
        data = os.pread(fd, min(CHUNK, end - offset), offset)
        if not data:
            return
        yield offset, data
        offset += len(data)


def content_hash(fd: int, size: int) -> tuple[bytes, int]:
    """The content hash of an open regular file (see the module doc) and how many bytes were read."""
    parts = extents(fd, size)
    read = 0
    if parts == [(0, size)] or size == 0:
        h = hashlib.sha256()
        for _, data in _chunks(fd, 0, size):
            h.update(data)
            read += len(data)
        return h.digest(), read
    h = hashlib.sha256(b"sparse\0" + struct.pack(">Q", size))
    for offset, length in parts:
        first = offset - offset % PAGE  # whole pages: a page a hole shares with data reads as zeros
        for start, data in _chunks(fd, first, offset + length - first):
            read += len(data)
            for i in range(0, len(data), PAGE):
                page = data[i:i + PAGE]
                if page != _ZERO_PAGE[:len(page)]:
                    h.update(struct.pack(">Q", (start + i) // PAGE) + page)
    return h.digest(), read


def _is_opaque(fd: int) -> bool:
    try:
        return os.getxattr(fd, OPAQUE) == b"y"
    except OSError:
        return False


def _names(fd: int, ignore: list[str]) -> list[str]:
    """A folder's names, largest first (``pop()`` gives them in byte order), without ``ignore``."""
    names = [n for n in os.listdir(fd) if not any(fnmatch.fnmatchcase(n, p) for p in ignore)]
    return sorted(names, key=os.fsencode, reverse=True)


def walk(top: str, ignore: list[str]) -> Iterator[tuple[int, str, str, os.stat_result, int]]:
    """``(depth, name, kind, stat, parent fd)`` of everything below ``top``, depth first, each
    folder's names in byte order, never following a symlink; kind is ``dir``, ``opaque`` (a folder
    hiding the layers below), ``file``, ``link``, ``whiteout`` (a deletion) or ``other``. The parent
    fd is open while the entry is handled. Memory: one fd and the names left per level (at most
    :data:`MAX_DEPTH` levels: deeper raises :class:`TooDeep`)."""
    stack: list[tuple[int, list[str]]] = [(os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW), [])]
    try:
        stack[0][1].extend(_names(stack[0][0], ignore))
        while stack:
            fd, names = stack[-1]
            if not names:
                os.close(stack.pop()[0])
                continue
            name = names.pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            depth = len(stack) - 1
            if stat.S_ISDIR(st.st_mode):
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                try:
                    yield depth, name, "opaque" if _is_opaque(sub) else "dir", st, fd
                    if len(stack) >= MAX_DEPTH:
                        raise TooDeep(f"folders nested deeper than {MAX_DEPTH} levels")
                    stack.append((sub, _names(sub, ignore)))
                except BaseException:
                    os.close(sub)
                    raise
            elif stat.S_ISLNK(st.st_mode):
                yield depth, name, "link", st, fd
            elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                yield depth, name, "whiteout", st, fd
            elif stat.S_ISREG(st.st_mode):
                yield depth, name, "file", st, fd
            else:
                yield depth, name, "other", st, fd
    finally:
        for fd, _ in stack:
            os.close(fd)


def _open_file(dir_fd: int, name: str) -> int:
    return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)


def digest(top: str, ignore: list[str]) -> dict[str, Any]:
    """The hash of everything below ``top`` (see the module doc), with its entry and byte counts."""
    h = hashlib.sha256()
    entries = read = 0
    for depth, name, kind, st, dir_fd in walk(top, ignore):
        h.update(struct.pack(">I", depth) + os.fsencode(name) + f"\0{kind}\0{st.st_mode & 0o7777:o}\0".encode())
        if kind == "file":
            fd = _open_file(dir_fd, name)
            try:
                content, n = content_hash(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            read += n
            h.update(content)
        elif kind == "link":
            h.update(hashlib.sha256(os.fsencode(os.readlink(name, dir_fd=dir_fd))).digest())
        else:
            h.update(hashlib.sha256(b"").digest())
        entries += 1
    return {"digest": h.hexdigest(), "entries": entries, "bytes": read}


def write_snapshot(top: str, out: Callable[[bytes], None], cap: int) -> int:
    """Writes the snapshot of ``top`` through ``out`` (see the module doc); returns its size. Raises
    :class:`TooLarge` before it would pass ``cap`` bytes."""
    total = 0

    def emit(data: bytes) -> None:
        nonlocal total
        total += len(data)
        if total > cap:
            raise TooLarge(f"the snapshot passes its cap of {cap} bytes")
        out(data)

    emit(MAGIC)
    for depth, name, kind, st, dir_fd in walk(top, []):
        head: dict[str, Any] = {"d": depth, "n": base64.b64encode(os.fsencode(name)).decode("ascii"), "k": kind,
                                "m": st.st_mode & 0o7777}
        fd = _open_file(dir_fd, name) if kind == "file" else None
        try:
            if fd is not None:
                size = os.fstat(fd).st_size
                head.update(s=size, x=extents(fd, size))
            elif kind == "link":
                head["t"] = base64.b64encode(os.fsencode(os.readlink(name, dir_fd=dir_fd))).decode("ascii")
            body = json.dumps(head).encode()
            emit(struct.pack(">I", len(body)) + body)
            if fd is not None:
                for offset, length in head["x"]:
                    for _, data in _chunks(fd, offset, length):
                        emit(data)
        finally:
            if fd is not None:
                os.close(fd)
    emit(struct.pack(">I", 0))
    return total


def read_snapshot(upper: str, read_exact: Callable[[int], bytes]) -> int:
    """Recreates a snapshot's entries (read through ``read_exact``) in the empty folder ``upper``;
    returns how many. Each entry is made in the folder its depth names on the path walked so far
    (by fd, never by a path that could lead elsewhere)."""
    if read_exact(len(MAGIC)) != MAGIC:
        raise ValueError("not a workspace snapshot of this format (expected AGENTRL-LAYER-2)")
    stack = [os.open(upper, os.O_RDONLY | os.O_DIRECTORY)]
    count = 0
    try:
        while True:
            size = struct.unpack(">I", read_exact(4))[0]
            if size == 0:
                return count
            if size > 1 << 20:
                raise ValueError(f"a snapshot entry header of {size} bytes")
            head = json.loads(read_exact(size))
            depth = int(head["d"])
            if not 0 <= depth < len(stack):
                raise ValueError(f"a snapshot entry at depth {depth} below a folder at depth {len(stack) - 1}")
            while len(stack) > depth + 1:
                os.close(stack.pop())
            sub = _restore_entry(stack[depth], head, read_exact)
            if sub is not None:
                stack.append(sub)
            count += 1
    finally:
        for fd in stack:
            os.close(fd)


def _restore_entry(parent: int, head: dict[str, Any], read_exact: Callable[[int], bytes]) -> int | None:
    """Makes one entry in the folder ``parent``; returns a new folder's fd (for its entries)."""
    name = os.fsdecode(base64.b64decode(head["n"]))
    kind, mode = str(head["k"]), int(head["m"]) & 0o7777
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"a snapshot entry named {name!r}")
    if kind in ("dir", "opaque"):
        os.mkdir(name, 0o700, dir_fd=parent)
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
        if kind == "opaque":
            os.setxattr(sub, OPAQUE, b"y")
        os.fchmod(sub, mode)
        return sub
    if kind == "file":
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent)
        try:
            for offset, length in head["x"]:
                offset, length = int(offset), int(length)
                while length > 0:
                    data = read_exact(min(CHUNK, length))
                    os.pwrite(fd, data, offset)
                    offset += len(data)
                    length -= len(data)
            os.ftruncate(fd, int(head["s"]))
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    elif kind == "link":
        os.symlink(os.fsdecode(base64.b64decode(head["t"])), name, dir_fd=parent)
    elif kind == "whiteout":
        os.mknod(name, stat.S_IFCHR | mode, 0, dir_fd=parent)
    return None


OPS: dict[str, Callable[..., dict[str, Any]]] = {"digest": digest}


def main(request: dict[str, Any]) -> None:
    """Runs one request ``{"op": ..., **arguments}`` (in a sandbox) and prints its JSON result."""
    try:
        result = OPS[request.pop("op")](**request)
    except OSError as exc:
        result = {"error": f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")}
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
