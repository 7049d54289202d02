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

Every tmpfs is capped in size and in files (``nr_inodes``: an empty file costs kernel memory that no
size counts). A layer's hash is not the holder's work: it runs in the episode's own sandbox
(``_layer.py``), so one member's files never hold up the requests of its group.

Requests on fd 0 and answers on fd 1 are framed like the sandbox worker's (4-byte big-endian length
+ JSON). The holder exits at end of input. Operations: ``mount``, ``scratch``, ``freeze``,
``remove``, ``snapshot``, ``restore``, ``write``, ``usage`` (see :data:`OPS`); an answer is the
operation's result or ``{"error": message}``. Two carry raw bytes besides their frame: ``restore``
reads its snapshot (``payload`` bytes) right after its request, and ``snapshot`` answers
``{"stream": true}``, then the snapshot as frames of raw bytes (a 4-byte length each, a zero length
at the end), then its result frame.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.tools.workspace import _layer, _resolve
else:  # run by the holder's interpreter from its own folder, standard library only
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import _layer
        import _resolve
    finally:
        sys.path.pop(0)  # only for this import: the folder holds modules named like installed packages

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 0x1, 0x2, 0x4, 0x20
MNT_DETACH = 2
STREAM_CHUNK = 1 << 20
MOUNT_INODES = 64
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
        self.scratches: set[str] = set()

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

    def _layer(self, name: str, size: int, inodes: int) -> str:
        where = self._dir(name)
        if name in self.mounted or name in self.frozen or name in self.scratches:
            raise ValueError(f"layer {name!r} exists already")
        os.mkdir(where, 0o755)
        _mount("tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(size)},nr_inodes={int(inodes)},mode=0755")
        for sub in ("upper", "work", "merged"):
            os.mkdir(f"{where}/{sub}", 0o755)
        return where

    def _overlay(self, where: str, lowers: list[str]) -> None:
        options = f"lowerdir={self._lowers(lowers)},upperdir={where}/upper,workdir={where}/work,userxattr"
        _mount("overlay", f"{where}/merged", "overlay", MS_NOSUID | MS_NODEV, options)

    def mount(self, name: str, size: int, lowers: list[str], inodes: int) -> dict[str, Any]:
        """A writable layer ``name`` over ``lowers`` (top first), capped at ``size`` bytes and
        ``inodes`` files."""
        where = self._layer(name, size, inodes)
        self._overlay(where, lowers)
        self.mounted.add(name)
        return {"merged": f"{where}/merged", "upper": f"{where}/upper"}

    def scratch(self, name: str, size: int, inodes: int) -> dict[str, Any]:
        """An empty tmpfs ``name`` anyone may write (a kernel's ``/tmp``), capped at ``size`` bytes and
        ``inodes`` files; one of that name is replaced."""
        where = self._dir(name)
        if name in self.scratches:
            _umount(where)
        else:
            if name in self.mounted or name in self.frozen:
                raise ValueError(f"layer {name!r} exists already")
            os.mkdir(where, 0o755)
        _mount("tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(size)},nr_inodes={int(inodes)},mode=1777")
        self.scratches.add(name)
        return {"path": where}

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
        if name in self.mounted or name in self.frozen or name in self.scratches:
            _umount(where)
            os.rmdir(where)
        self.mounted.discard(name)
        self.frozen.discard(name)
        self.scratches.discard(name)
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

    def snapshot(self, name: str, cap: int) -> dict[str, Any]:
        """Streams layer ``name``'s writable part (``_layer.write_snapshot``, at most ``cap`` bytes) as
        raw frames after ``{"stream": true}``; the result frame follows (see the module doc)."""
        _send(1, {"stream": True})
        pending = bytearray()

        def out(data: bytes) -> None:
            pending.extend(data)
            while len(pending) >= STREAM_CHUNK:
                _send_raw(1, bytes(pending[:STREAM_CHUNK]))
                del pending[:STREAM_CHUNK]

        try:
            size = _layer.write_snapshot(f"{self._dir(name)}/upper", out, int(cap))
        except BaseException:
            _send_raw(1, b"")
            raise
        if pending:
            _send_raw(1, bytes(pending))
        _send_raw(1, b"")
        return {"bytes": size}

    def restore(self, name: str, size: int, lowers: list[str], inodes: int, payload: _Payload) -> dict[str, Any]:
        """A new layer ``name`` whose writable part is the snapshot in ``payload`` over ``lowers``."""
        # overlayfs makes files of its own in its work folder while it mounts: room for them first
        # (a layer filled to its cap was mounted while empty), then the cap itself
        where = self._layer(name, size, int(inodes) + MOUNT_INODES)
        try:
            entries = _layer.read_snapshot(f"{where}/upper", payload.read)
            self._overlay(where, lowers)
            try:
                _mount("none", where, "tmpfs", MS_REMOUNT | MS_NOSUID | MS_NODEV, f"size={int(size)},nr_inodes={int(inodes)}")
            except OSError:
                pass  # more in use than the cap (a snapshot of another spec): the room above stays
        except BaseException:
            _umount(where)
            os.rmdir(where)
            raise
        self.mounted.add(name)
        return {"merged": f"{where}/merged", "upper": f"{where}/upper", "entries": entries}


class _Payload:
    """The raw bytes that follow a request (``payload`` of them), read as needed."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.left = fd, int(size)

    def read(self, n: int) -> bytes:
        if n > self.left:
            raise ValueError(f"the snapshot ends early: {n} bytes wanted, {self.left} left")
        data = _read_exact(self.fd, n)
        if data is None:
            raise EOFError("the host closed the pipe")
        self.left -= n
        return data

    def drain(self) -> None:
        while self.left:
            data = os.read(self.fd, min(self.left, STREAM_CHUNK))
            if not data:
                return
            self.left -= len(data)


OPS: dict[str, Callable[..., dict[str, Any]]] = {
    "mount": Holder.mount, "scratch": Holder.scratch, "freeze": Holder.freeze, "remove": Holder.remove,
    "usage": Holder.usage, "write": Holder.write, "snapshot": Holder.snapshot, "restore": Holder.restore}


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send_raw(fd: int, data: bytes) -> None:
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _send(fd: int, obj: dict[str, Any]) -> None:
    _send_raw(fd, json.dumps(obj).encode())


def main(argv: list[str]) -> None:
    holder = Holder(argv[0], argv[1] if len(argv) > 1 else None)
    _send(1, {"ready": True, "pid": os.getpid()})
    while True:
        head = _read_exact(0, 4)
        body = _read_exact(0, struct.unpack(">I", head)[0]) if head is not None else None
        if body is None:
            return  # the host closed the pipe (or died): the namespace and its mounts go with this process
        request = json.loads(body)
        payload = _Payload(0, request.pop("payload")) if "payload" in request else None
        try:
            result = OPS[request.pop("op")](holder, **request, **({"payload": payload} if payload else {}))
        except Exception as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        if payload is not None:
            payload.drain()  # what the operation did not read: the next request starts after it
        _send(1, result)


if __name__ == "__main__":
    main(sys.argv[1:])
