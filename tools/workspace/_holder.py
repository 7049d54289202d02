"""The holder of a bubblewrap workspace group: a user + mount namespace that owns its layers.

Runs as ``/usr/bin/python3 -I -S _holder.py MOUNTPOINT [BASE]`` under ``unshare --user
--map-root-user --mount`` (as the sandbox's uid: 65534 when the host process is root), standard
library only, never imported by the host. bubblewrap 0.8 has no ``--overlay``, so the layers are
mounted here and each workspace's sandbox (bwrap, started through ``nsenter`` into this namespace)
binds its merged folder at ``/work``.

Every layer ``NAME`` is its own size-capped tmpfs at ``MOUNTPOINT/NAME`` (RAM: the cap is memory the
workspace may use) holding ``upper``, ``work`` and ``merged``; ``merged`` is an overlay of ``upper``
over the read-only lower layers (the base folder, opened before anything is mounted, and frozen
layers). *Freezing* a layer (a prepared workspace) unmounts its overlay and remounts its tmpfs
read-only, so its ``upper`` can be the lower layer of many forks: a fork is one tmpfs and one overlay
mount, whatever the base's size. The host's view never changes (the mounts exist in this namespace
only), and the kernel removes all of them when the namespace's last process exits: a holder that
dies, however it dies, leaves nothing mounted.

Requests on fd 0 and answers on fd 1 are framed like the sandbox worker's (4-byte big-endian length
+ JSON). The holder exits at end of input. Operations: ``mount``, ``freeze``, ``remove``, ``digest``,
``snapshot``, ``restore``, ``write``, ``usage`` (see :data:`OPS`); an answer is the operation's
result or ``{"error": message}``.
"""

from __future__ import annotations

import base64
import ctypes
import fnmatch
import hashlib
import json
import os
import stat
import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.tools.workspace import _resolve
else:  # run by the holder's interpreter from its own folder, standard library only
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import _resolve
    finally:
        sys.path.pop(0)  # only for this import: the folder holds modules named like installed packages

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x1, 0x2, 0x4, 0x20
MNT_DETACH = 2
OPAQUE = "user.overlay.opaque"
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode(), ctypes.c_ulong(flags), data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype} on {target}: {os.strerror(err)}")


def _umount(target: str) -> None:
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


class Holder:
    """The layers of one namespace; see the module doc."""

    def __init__(self, mountpoint: str, base: str | None) -> None:
        # The base is opened before anything is mounted: the mounts below may hide its path.
        self.base_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY) if base else None
        if _libc.mount(b"none", b"/", None, ctypes.c_ulong(0x4000 | 0x40000), None) != 0:  # MS_REC | MS_PRIVATE
            raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
        _mount("tmpfs", mountpoint, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        self.root = mountpoint
        os.mkdir(f"{mountpoint}/.empty", 0o755)
        self.frozen: set[str] = set()
        self.mounted: set[str] = set()

    def _dir(self, name: str) -> str:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"layer name {name!r}: expected a plain name")
        return f"{self.root}/{name}"

    def _lowers(self, lowers: list[str]) -> str:
        paths = []
        for name in lowers:
            if name == "@base":
                if self.base_fd is not None:
                    paths.append(f"/proc/self/fd/{self.base_fd}")
            elif name in self.frozen:
                paths.append(f"{self._dir(name)}/upper")
            else:
                raise ValueError(f"lower layer {name!r}: expected '@base' or a frozen layer")
        return ":".join(paths) or f"{self.root}/.empty"

    def _layer(self, name: str, size: int) -> str:
        where = self._dir(name)
        if name in self.mounted or name in self.frozen:
            raise ValueError(f"layer {name!r} exists already")
        os.mkdir(where, 0o755)
        _mount("tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(size)},mode=0755")
        for sub in ("upper", "work", "merged"):
            os.mkdir(f"{where}/{sub}", 0o755)
        return where

    def _overlay(self, where: str, lowers: list[str]) -> None:
        options = f"lowerdir={self._lowers(lowers)},upperdir={where}/upper,workdir={where}/work,userxattr"
        _mount("overlay", f"{where}/merged", "overlay", MS_NOSUID | MS_NODEV, options)

    def mount(self, name: str, size: int, lowers: list[str]) -> dict[str, Any]:
        """A writable layer ``name`` over ``lowers`` (top first), capped at ``size`` bytes."""
        where = self._layer(name, size)
        self._overlay(where, lowers)
        self.mounted.add(name)
        return {"merged": f"{where}/merged"}

    def freeze(self, name: str) -> dict[str, Any]:
        """Makes layer ``name`` read-only and usable as a lower layer (its overlay is unmounted)."""
        where = self._dir(name)
        if name not in self.mounted:
            raise ValueError(f"layer {name!r} is not mounted")
        _umount(f"{where}/merged")
        _mount("none", where, "tmpfs", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "")
        self.mounted.discard(name)
        self.frozen.add(name)
        return {}

    def remove(self, name: str) -> dict[str, Any]:
        """Unmounts layer ``name`` (its memory is freed once no process uses it)."""
        where = self._dir(name)
        if name in self.mounted:
            _umount(f"{where}/merged")
        if name in self.mounted or name in self.frozen:
            _umount(where)
            os.rmdir(where)
        self.mounted.discard(name)
        self.frozen.discard(name)
        return {}

    def usage(self, name: str) -> dict[str, Any]:
        vfs = os.statvfs(self._dir(name))
        return {"used": (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize, "size": vfs.f_blocks * vfs.f_frsize}

    def write(self, name: str, files: dict[str, str]) -> dict[str, Any]:
        """Writes ``files`` (relative path -> base64 content) into layer ``name``'s merged view."""
        root = os.open(f"{self._dir(name)}/merged", os.O_RDONLY | os.O_DIRECTORY)
        try:
            for path, data in sorted(files.items()):
                parent = _resolve.make_parents(root, path)
                try:
                    fd = _resolve.open_beneath(parent, _resolve.split_parent(path)[1],
                                               os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                finally:
                    os.close(parent)
                with os.fdopen(fd, "wb") as f:
                    f.write(base64.b64decode(data))
        finally:
            os.close(root)
        return {"files": len(files)}

    def digest(self, name: str, ignore: list[str]) -> dict[str, Any]:
        """A hash of layer ``name``'s writable part: every path, type, mode, content and symlink target,
        deletions and opaque folders (not times), leaving out names matching ``ignore``."""
        h = hashlib.sha256()
        count = 0
        for rel, kind, st, payload in _walk(f"{self._dir(name)}/upper", ignore, contents=True):
            h.update(f"{rel}\0{kind}\0{st.st_mode & 0o7777:o}\0".encode())
            h.update(hashlib.sha256(payload).digest())
            count += 1
        return {"digest": h.hexdigest(), "entries": count}

    def snapshot(self, name: str) -> dict[str, Any]:
        """Layer ``name``'s writable part as a list of entries (what :meth:`restore` takes)."""
        entries = [{"path": rel, "kind": kind, "mode": st.st_mode & 0o7777,
                    "data": base64.b64encode(payload).decode("ascii")}
                   for rel, kind, st, payload in _walk(f"{self._dir(name)}/upper", [], contents=True)]
        return {"entries": entries}

    def restore(self, name: str, size: int, lowers: list[str], entries: list[dict[str, Any]]) -> dict[str, Any]:
        """A new layer ``name`` whose writable part is ``entries`` (from :meth:`snapshot`) over ``lowers``."""
        where = self._layer(name, size)
        try:
            _unpack(f"{where}/upper", entries)
            self._overlay(where, lowers)
        except BaseException:
            _umount(where)
            os.rmdir(where)
            raise
        self.mounted.add(name)
        return {"merged": f"{where}/merged"}


def _walk(top: str, ignore: list[str], *, contents: bool) -> Any:
    """``(relative path, kind, stat, payload)`` for everything below ``top`` in sorted order, never
    following a symlink; kind is ``dir``, ``opaque`` (a folder hiding the layers below), ``file``,
    ``link`` (payload: the target), ``whiteout`` (a deletion) or ``other``."""
    stack = [("", os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))]
    while stack:
        prefix, fd = stack.pop()
        try:
            subdirs = []
            for entry in sorted(os.listdir(fd)):
                if any(fnmatch.fnmatchcase(entry, pattern) for pattern in ignore):
                    continue
                rel = prefix + entry
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    sub = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    opaque = _is_opaque(sub)
                    yield rel, "opaque" if opaque else "dir", st, b""
                    subdirs.append((rel + "/", sub))
                elif stat.S_ISLNK(st.st_mode):
                    yield rel, "link", st, os.fsencode(os.readlink(entry, dir_fd=fd))
                elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    yield rel, "whiteout", st, b""
                elif stat.S_ISREG(st.st_mode):
                    yield rel, "file", st, _read(fd, entry) if contents else b""
                else:
                    yield rel, "other", st, b""
            stack.extend(reversed(subdirs))
        finally:
            os.close(fd)


def _is_opaque(fd: int) -> bool:
    try:
        return os.getxattr(fd, OPAQUE) == b"y"
    except OSError:
        return False


def _read(dir_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _unpack(upper: str, entries: list[dict[str, Any]]) -> None:
    """Recreates a snapshot's entries in an empty ``upper`` (parents come before their children)."""
    root = os.open(upper, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for e in entries:
            path, kind, mode = str(e["path"]), str(e["kind"]), int(e["mode"]) & 0o7777
            data = base64.b64decode(e.get("data") or "")
            parent_fd = _resolve.make_parents(root, path)
            name = _resolve.split_parent(path)[1]
            try:
                if kind in ("dir", "opaque"):
                    os.mkdir(name, 0o700, dir_fd=parent_fd)
                    sub = _resolve.open_beneath(parent_fd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                    try:
                        if kind == "opaque":
                            os.setxattr(sub, OPAQUE, b"y")
                        os.fchmod(sub, mode)
                    finally:
                        os.close(sub)
                elif kind == "file":
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent_fd)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                        os.fchmod(f.fileno(), mode)
                elif kind == "link":
                    os.symlink(os.fsdecode(data), name, dir_fd=parent_fd)
                elif kind == "whiteout":
                    os.mknod(name, stat.S_IFCHR | mode, 0, dir_fd=parent_fd)
            finally:
                os.close(parent_fd)
    finally:
        os.close(root)


OPS: dict[str, Callable[..., dict[str, Any]]] = {"mount": Holder.mount, "freeze": Holder.freeze, "remove": Holder.remove, "usage": Holder.usage,
       "write": Holder.write, "digest": Holder.digest, "snapshot": Holder.snapshot, "restore": Holder.restore}


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(fd: int, obj: dict[str, Any]) -> None:
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def main(argv: list[str]) -> None:
    holder = Holder(argv[0], argv[1] if len(argv) > 1 else None)
    _send(1, {"ready": True, "pid": os.getpid()})
    while True:
        head = _read_exact(0, 4)
        body = _read_exact(0, struct.unpack(">I", head)[0]) if head is not None else None
        if body is None:
            return  # the host closed the pipe (or died): the namespace and its mounts go with this process
        request = json.loads(body)
        try:
            result = OPS[request.pop("op")](holder, **request)
        except Exception as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        _send(1, result)


if __name__ == "__main__":
    main(sys.argv[1:])
