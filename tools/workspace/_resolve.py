"""Opening paths of a workspace without leaving it: ``openat2(RESOLVE_BENEATH)``.

Part of the programs that run next to a workspace (``_holder.py``, ``_fsops.py``): the standard
library only, never imported by the host. :func:`open_beneath` opens ``path`` relative to a
directory fd and lets the kernel refuse (``EXDEV``) any resolution that leaves it: ``..`` above the
root, an absolute symlink, a symlink that points outside, ``/proc`` magic links. A path that is
swapped for a symlink while it is being opened cannot race this, since the kernel checks every step.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine(), 437)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class Escape(OSError):
    """A path that would resolve outside the workspace."""


def open_beneath(root_fd: int, path: str, flags: int, mode: int = 0o644) -> int:
    """``openat2(root_fd, path, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)``; raises
    :class:`Escape` when the resolution leaves ``root_fd`` and ``OSError`` for the other failures."""
    how = struct.pack("=QQQ", flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0,
                      RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    buf = ctypes.create_string_buffer(how, len(how))
    fd = _libc.syscall(_SYS_OPENAT2, ctypes.c_int(root_fd), ctypes.c_char_p(os.fsencode(path)), buf,
                       ctypes.c_size_t(len(how)))
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err == errno.EXDEV:
        raise Escape(err, f"{path!r} leads outside the workspace (through '..' or a symlink)")
    raise OSError(err, os.strerror(err), path)


def split_parent(path: str) -> tuple[str, str]:
    """``("dir/sub", "name")`` of a relative path (``"."`` for a top-level name)."""
    parent, _, name = path.rstrip("/").rpartition("/")
    return parent or ".", name


def make_parents(root_fd: int, path: str) -> int:
    """Creates the missing directories of ``path``'s parent (every step resolved beneath
    ``root_fd``); returns an fd of the parent directory."""
    parent, _ = split_parent(path)
    try:
        return open_beneath(root_fd, parent, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        pass
    parts = [p for p in parent.split("/") if p not in ("", ".")]
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            prefix = "/".join(parts[: i + 1])
            try:
                nxt = open_beneath(root_fd, prefix, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = open_beneath(root_fd, prefix, os.O_RDONLY | os.O_DIRECTORY)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd
