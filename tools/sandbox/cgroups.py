"""cgroup limits for sandbox workers, on cgroup v1 (per-controller hierarchies) or v2 (unified).

:func:`detect_cgroups` finds out, once, what this machine offers to this process: root on a v1 or
hybrid host can create groups in the ``memory``, ``pids`` and ``cpu`` hierarchies; on a unified v2
host the controllers must be enabled (delegated) in the parent's ``cgroup.subtree_control``. What
cannot be used is reported with the reason, and the sandbox falls back to rlimits for it.

A :class:`CgroupSet` is one sandbox's parent group; :meth:`CgroupSet.worker` creates one group per
worker (memory, process and CPU bandwidth limits for the worker and everything it forks). The
worker's launcher writes its own PID into :meth:`WorkerCgroup.procs_files` before it execs the
sandbox, so every descendant starts inside the group. Groups are removed on close.

Plain file writes to cgroupfs are in-kernel and immediate, so calling these from the event loop
does not block it.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CgroupSet", "CgroupSupport", "WorkerCgroup", "detect_cgroups", "memory_cgroup_of", "read_oom_kills"]

ROOT = Path("/sys/fs/cgroup")
WANTED = ("memory", "pids", "cpu")
CFS_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupSupport:
    """Which controllers this process can use: ``version`` 1 or 2 (``None``: none usable)."""

    version: int | None
    controllers: frozenset[str]
    base: Path | None = None
    reason: str = ""
    v2_delegation: bool = False
    layout: str = ""


def _v1_support() -> CgroupSupport:
    usable = []
    for ctrl in WANTED:
        path = ROOT / ctrl
        if (path / "cgroup.procs").exists() and os.access(path, os.W_OK):
            usable.append(ctrl)
    if not usable:
        return CgroupSupport(None, frozenset(), reason="cgroup v1 hierarchies present but not writable (needs root)",
                             layout="v1/hybrid")
    missing = sorted(set(WANTED) - set(usable))
    reason = f"cgroup v1 controllers not writable: {missing}" if missing else ""
    return CgroupSupport(1, frozenset(usable), base=ROOT, reason=reason, layout="v1/hybrid")


def _own_v2_group() -> Path:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return ROOT / line[3:].lstrip("/")
    except OSError:
        pass
    return ROOT


def _v2_support() -> CgroupSupport:
    for base in (ROOT, _own_v2_group().parent):
        try:
            available = set((base / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if not os.access(base, os.W_OK):
            continue
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        wanted = set(WANTED) & available
        try:
            for ctrl in sorted(wanted - enabled):
                (base / "cgroup.subtree_control").write_text(f"+{ctrl}")
        except OSError:
            wanted &= enabled
        if wanted:
            missing = sorted(set(WANTED) - wanted)
            reason = f"cgroup v2 controllers not delegated: {missing}" if missing else ""
            return CgroupSupport(2, frozenset(wanted), base=base, reason=reason, v2_delegation=True, layout="v2")
    return CgroupSupport(None, frozenset(), reason="cgroup v2 without a writable group that can delegate "
                         "memory/pids/cpu (run as root or under a delegated systemd scope)", layout="v2")


_DETECTED: CgroupSupport | None = None


def detect_cgroups() -> CgroupSupport:
    """What cgroup limits this process can apply (cached after the first call)."""
    global _DETECTED
    if _DETECTED is not None:
        return _DETECTED
    if (ROOT / "cgroup.controllers").exists():
        support = _v2_support()
    elif (ROOT / "memory").is_dir() or (ROOT / "pids").is_dir():
        support = _v1_support()
        unified = ROOT / "unified"
        if (unified / "cgroup.controllers").exists():
            ctrls = (unified / "cgroup.controllers").read_text().split()
            support = CgroupSupport(support.version, support.controllers, support.base,
                                    support.reason, v2_delegation=bool(set(ctrls) & set(WANTED)),
                                    layout=f"hybrid (cgroup2 at {unified} with controllers {ctrls})")
    else:
        support = CgroupSupport(None, frozenset(), reason=f"no cgroup filesystem at {ROOT}")
    if os.geteuid() != 0 and support.version == 1:
        support = CgroupSupport(None, frozenset(), reason="cgroup v1 needs root", layout=support.layout)
    _DETECTED = support
    return support


def read_oom_kills(memory_dir: Path, version: int) -> int | None:
    """How many processes the OOM killer has killed in the memory cgroup ``memory_dir`` so far
    (``memory.oom_control`` on cgroup v1, ``memory.events`` on v2); ``None`` when unreadable."""
    name = "memory.oom_control" if version == 1 else "memory.events"
    try:
        for line in (memory_dir / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def memory_cgroup_of(pid: int, *, proc: Path = Path("/proc")) -> tuple[Path, int] | None:
    """``(directory, version)`` of the memory cgroup process ``pid`` is in, under the cgroup mount
    at :data:`ROOT`: the ``memory`` line of ``/proc/<pid>/cgroup`` on a v1 or hybrid host, the
    ``0::`` line on a unified v2 host. ``None`` when the process or its group cannot be seen here
    (it is gone, or lives in another PID or cgroup namespace)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        controllers, _, path = line.partition(":")[2].partition(":")
        if "memory" in controllers.split(","):
            found = (ROOT / "memory" / path.lstrip("/"), 1)
            return found if found[0].is_dir() else None
        if line.startswith("0::"):
            unified = ROOT / path.lstrip("/")
    if unified is not None and (ROOT / "cgroup.controllers").exists() and unified.is_dir():
        return unified, 2
    return None


@dataclass
class WorkerCgroup:
    """One worker's group in each usable controller."""

    support: CgroupSupport
    paths: dict[str, Path] = field(default_factory=dict)

    def procs_files(self) -> list[Path]:
        return sorted({p / "cgroup.procs" for p in self.paths.values()})

    def pids(self) -> list[int]:
        """The processes in the group now (those of its first controller)."""
        for path in self.procs_files():
            with contextlib.suppress(OSError, ValueError):
                return [int(line) for line in path.read_text().split()]
        return []

    def oom_kills(self) -> int:
        """How many processes the OOM killer has killed in this group so far."""
        mem = self.paths.get("memory")
        if mem is None or self.support.version is None:
            return 0
        kills = read_oom_kills(mem, self.support.version)
        return 0 if kills is None else kills

    def remove(self) -> None:
        for path in sorted(set(self.paths.values())):
            _rmdir(path)
        self.paths.clear()


def _rmdir(path: Path) -> None:
    for _ in range(100):  # the kernel refuses while exiting tasks are still being released
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def _remove_stale(hierarchy: Path) -> None:
    """Removes empty groups left by sandbox processes that died without closing (their PID is gone)."""
    try:
        entries = list(hierarchy.glob("agentrl-sandbox-*-*"))
    except OSError:
        return
    for parent in entries:
        pid = parent.name.split("-")[2]
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        for child in parent.glob("w*"):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            parent.rmdir()


class CgroupSet:
    """A sandbox's parent group (``agentrl-<id>``) under which each worker gets its own group."""

    def __init__(self, support: CgroupSupport, *, register: Callable[[str], None] | None = None) -> None:
        """``register`` is called with each parent group's path before it is created (a workspace
        registers it with the reaper, which removes it if this process dies)."""
        if support.version is None or support.base is None:
            raise ValueError(f"CgroupSet: cgroups are not usable here ({support.reason})")
        self.support = support
        self.name = f"agentrl-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._parents: dict[str, Path] = {}
        self._workers: list[WorkerCgroup] = []
        for ctrl in sorted(support.controllers):
            _remove_stale(self._hierarchy(ctrl))
            parent = self._hierarchy(ctrl) / self.name
            if register is not None:
                register(str(parent))
            parent.mkdir(exist_ok=True)
            self._parents[ctrl] = parent
        if support.version == 2:
            parent = next(iter(self._parents.values()))
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(support.controllers)))

    def _hierarchy(self, ctrl: str) -> Path:
        assert self.support.base is not None
        return self.support.base / ctrl if self.support.version == 1 else self.support.base

    def worker(self, index: int, memory_bytes: int, max_processes: int, cpu_cores: float) -> WorkerCgroup:
        """Creates the group of worker ``index`` with its limits written."""
        group = WorkerCgroup(self.support)
        v1 = self.support.version == 1
        name = f"w{index}-{uuid.uuid4().hex[:6]}"  # one group; on v2 all controllers share its directory
        for ctrl, parent in self._parents.items():
            path = parent / name
            path.mkdir(exist_ok=True)
            group.paths[ctrl] = path
            if ctrl == "memory":
                if v1:
                    (path / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    if (path / "memory.memsw.limit_in_bytes").exists():
                        (path / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                else:
                    (path / "memory.max").write_text(str(memory_bytes))
                    if (path / "memory.swap.max").exists():
                        (path / "memory.swap.max").write_text("0")
            elif ctrl == "pids":
                (path / "pids.max").write_text(str(max_processes))
            elif ctrl == "cpu":
                quota = max(1000, int(cpu_cores * CFS_PERIOD_US))
                if v1:
                    (path / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
                    (path / "cpu.cfs_quota_us").write_text(str(quota))
                else:
                    (path / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
        self._workers.append(group)
        return group

    def parents(self) -> list[Path]:
        return list(self._parents.values())

    def release(self, group: WorkerCgroup) -> None:
        group.remove()
        if group in self._workers:
            self._workers.remove(group)

    def close(self) -> None:
        for group in list(self._workers):
            group.remove()
        self._workers.clear()
        for path in self._parents.values():
            _rmdir(path)
        self._parents.clear()
