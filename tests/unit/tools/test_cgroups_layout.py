"""cgroup detection and limit files for both layouts, on a directory tree shaped like cgroupfs.

The real v1 hierarchy is exercised by the bwrap integration tests on hosts that have it; this test
pins the file names and values written for v1 and v2 (which this CI host cannot mount).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.tools.sandbox import cgroups


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    monkeypatch.setattr(cgroups, "_DETECTED", None)
    return tmp_path


def test_v2_unified_layout(fake_root: Path) -> None:
    (fake_root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (fake_root / "cgroup.subtree_control").write_text("")
    support = cgroups.detect_cgroups()
    assert support.version == 2 and support.controllers == {"cpu", "memory", "pids"} and support.v2_delegation
    group_set = cgroups.CgroupSet(support)
    parent = fake_root / group_set.name
    assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    worker = group_set.worker(0, 300 << 20, 40, 0.5)
    path = worker.paths["memory"]
    assert worker.paths["pids"] == worker.paths["cpu"] == path
    assert path.parent == parent and worker.procs_files() == [path / "cgroup.procs"]
    assert (path / "memory.max").read_text() == str(300 << 20)
    assert (path / "pids.max").read_text() == "40"
    assert (path / "cpu.max").read_text() == "50000 100000"
    (path / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n")
    assert worker.oom_kills() == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroup v1 is only used as root")
def test_v1_per_controller_layout(fake_root: Path) -> None:
    for ctrl in ("memory", "pids", "cpu"):
        (fake_root / ctrl).mkdir()
        (fake_root / ctrl / "cgroup.procs").write_text("")
    support = cgroups.detect_cgroups()
    assert support.version == 1 and support.controllers == {"cpu", "memory", "pids"}
    worker = cgroups.CgroupSet(support).worker(3, 100 << 20, 20, 2.0)
    assert [p.parent.parent.parent.name for p in worker.procs_files()] == ["cpu", "memory", "pids"]
    assert len({p.parent.name for p in worker.procs_files()}) == 1
    assert (worker.paths["memory"] / "memory.limit_in_bytes").read_text() == str(100 << 20)
    assert (worker.paths["pids"] / "pids.max").read_text() == "20"
    assert (worker.paths["cpu"] / "cpu.cfs_quota_us").read_text() == "200000"
    (worker.paths["memory"] / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert worker.oom_kills() == 5


def test_no_cgroup_filesystem(fake_root: Path) -> None:
    support = cgroups.detect_cgroups()
    assert support.version is None and "no cgroup filesystem" in support.reason
    with pytest.raises(ValueError, match="cgroups are not usable here"):
        cgroups.CgroupSet(support)


CID = "c0ffee" * 10 + "abcd"


def _fake_proc(tmp_path: Path, pid: int, text: str) -> Path:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(text)
    return proc


def test_memory_cgroup_of_a_process_on_v1_and_hybrid(fake_root: Path, tmp_path: Path) -> None:
    group = fake_root / "memory" / "docker" / CID
    group.mkdir(parents=True)
    (group / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    proc = _fake_proc(tmp_path, 42, f"12:pids:/docker/{CID}\n4:memory:/docker/{CID}\n"
                                    f"1:name=systemd:/docker/{CID}\n0::/system.slice/containerd.service\n")
    assert cgroups.memory_cgroup_of(42, proc=proc) == (group, 1)
    assert cgroups.read_oom_kills(group, 1) == 3


def test_memory_cgroup_of_a_process_on_v2_with_the_systemd_driver(fake_root: Path, tmp_path: Path) -> None:
    (fake_root / "cgroup.controllers").write_text("cpu memory pids\n")
    group = fake_root / "system.slice" / f"docker-{CID}.scope"
    group.mkdir(parents=True)
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    proc = _fake_proc(tmp_path, 42, f"0::/system.slice/docker-{CID}.scope\n")
    assert cgroups.memory_cgroup_of(42, proc=proc) == (group, 2)
    assert cgroups.read_oom_kills(group, 2) == 1


def test_memory_cgroup_of_a_process_that_cannot_be_seen(fake_root: Path, tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, 42, f"4:memory:/docker/{CID}\n")
    assert cgroups.memory_cgroup_of(7, proc=proc) is None  # no such process here
    assert cgroups.memory_cgroup_of(42, proc=proc) is None  # its group is not under this mount
    assert cgroups.read_oom_kills(fake_root / "missing", 2) is None


class _Container:
    id = CID
    attrs = {"State": {"Pid": 42}}  # noqa: RUF012

    def reload(self) -> None:
        pass


def test_docker_sandbox_reads_oom_kills_on_a_v2_host(fake_root: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An OOM kill in a container on a unified (systemd driver) host is seen, not just on v1."""
    pytest.importorskip("docker")
    from agentrl.tools.sandbox.docker import DockerSandbox

    (fake_root / "cgroup.controllers").write_text("cpu memory pids\n")
    group = fake_root / "system.slice" / f"docker-{CID}.scope"
    group.mkdir(parents=True)
    (group / "memory.events").write_text("oom 2\noom_kill 2\n")
    proc = _fake_proc(tmp_path, 42, f"0::/system.slice/docker-{CID}.scope\n")
    real = cgroups.memory_cgroup_of
    monkeypatch.setattr("agentrl.tools.sandbox.docker.memory_cgroup_of", lambda pid: real(pid, proc=proc))
    sandbox = DockerSandbox(pool_size=1)
    container = _Container()
    sandbox._memory_cgroups[container.id] = sandbox._find_memory_cgroup(container)
    assert sandbox._oom_kills(container) == 2
    other = _Container()
    other.id = "f" * 64  # the PID shows a process that is not this container (another namespace)
    assert sandbox._find_memory_cgroup(other) is None and sandbox._oom_kills(other) == -1
