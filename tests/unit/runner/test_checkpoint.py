"""RunCheckpointer: layout and round trip, keep_last pruning, one history per folder, the config-hash
check, resolve(), and writers that fail or are killed (SIGKILL) at each phase of a save."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import agentrl
from agentrl.runner import CheckpointError, CheckpointWriteError
from agentrl.runner import checkpoint as checkpoint_module
from agentrl.runner.checkpoint import RunCheckpointer
from agentrl.runner.rundir import RunDirectory

HASH = "f" * 64


def write_weights(payload: bytes) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        (folder / "rank0").mkdir()
        (folder / "rank0" / "weights.bin").write_bytes(payload)
        (folder / "trainer.pt").write_bytes(payload[::-1])
    return write


def save(ckpt: RunCheckpointer, step: int, **state: Any) -> Path:
    return ckpt.save(step, write_trainer=write_weights(f"w{step}".encode() * 100), state={"step": step, **state})


def steps_of(ckpt: RunCheckpointer) -> list[str]:
    return [p.name for p in ckpt.checkpoints()]


def wait_for(path: Path, proc_alive: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc_alive(), "the writer exited before reaching the kill point"
        assert time.monotonic() < deadline, f"the writer did not reach the kill point within {timeout}s"
        time.sleep(0.02)


@pytest.fixture
def ckpt(tmp_path: Path) -> RunCheckpointer:
    return RunCheckpointer(tmp_path / "checkpoints", keep_last=3, config_hash=HASH)


def test_save_writes_trainer_state_and_meta_then_loads_them_back(ckpt: RunCheckpointer) -> None:
    before = time.time()
    path = ckpt.save(3, write_trainer=write_weights(b"abc"),
                     state={"ledger": {"steps": [[1, [[0, "a"]]]]}, "rng": [1, 2, 3], "version": 3, "nan": None})
    assert path == ckpt.directory / "step_000003" and ckpt.latest() == path
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "state.json", "trainer"]
    assert (path / "trainer" / "rank0" / "weights.bin").read_bytes() == b"abc"
    meta = orjson.loads((path / "meta.json").read_bytes())
    assert meta["step"] == 3 and meta["config_hash"] == HASH and meta["agentrl_version"] == agentrl.__version__
    assert before <= meta["time"] <= time.time()
    loaded = ckpt.load(path)
    assert loaded.step == 3 and loaded.path == path and loaded.trainer_dir == path / "trainer"
    assert loaded.state == {"ledger": {"steps": [[1, [[0, "a"]]]]}, "rng": [1, 2, 3], "version": 3, "nan": None}
    assert loaded.meta == meta
    assert [p.name for p in ckpt.directory.iterdir()] == ["step_000003"]


def test_keep_last_prunes_to_the_newest_complete_checkpoints(tmp_path: Path) -> None:
    ckpt = RunCheckpointer(tmp_path, keep_last=2, config_hash=HASH)
    for step in (1, 2, 5, 10):
        save(ckpt, step)
        assert ckpt.latest() == tmp_path / f"step_{step:06d}"
    assert steps_of(ckpt) == ["step_000005", "step_000010"]
    assert sorted(os.listdir(tmp_path)) == ["step_000005", "step_000010"]
    assert ckpt.load(tmp_path / "step_000005").state == {"step": 5}
    one = RunCheckpointer(tmp_path, keep_last=1, config_hash=HASH)
    save(one, 11)
    assert os.listdir(tmp_path) == ["step_000011"]
    with pytest.raises(CheckpointError, match="keep_last = 0; expected an int >= 1"):
        RunCheckpointer(tmp_path, keep_last=0, config_hash=HASH)


def test_saving_an_earlier_or_equal_step_replaces_the_later_history(ckpt: RunCheckpointer) -> None:
    for step in (1, 2, 3):
        save(ckpt, step)
    save(ckpt, 2, redo=True)  # a run resumed from step 1 saves step 2 again
    assert steps_of(ckpt) == ["step_000001", "step_000002"]
    assert ckpt.load(ckpt.latest() or "").state == {"step": 2, "redo": True}
    assert not [n for n in os.listdir(ckpt.directory) if n.startswith(".")]


def test_a_config_hash_mismatch_names_both_hashes_unless_allowed(ckpt: RunCheckpointer) -> None:
    path = save(ckpt, 4)
    other = RunCheckpointer(ckpt.directory, keep_last=3, config_hash="0" * 64)
    with pytest.raises(CheckpointError) as info:
        other.load(path)
    message = str(info.value)
    assert f"saved with config hash {HASH!r}" in message and f"this run's config hash is {'0' * 64!r}" in message
    assert "allow_config_change=True" in message
    assert other.load(path, allow_config_change=True).state == {"step": 4}


def test_resolve_accepts_a_checkpoint_a_checkpoints_folder_or_a_run_folder(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run", config_hash=HASH)
    ckpt = RunCheckpointer(run.checkpoints_dir, keep_last=3, config_hash=HASH)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        RunCheckpointer.resolve(run.root)
    first, second = save(ckpt, 1), save(ckpt, 2)
    assert RunCheckpointer.resolve(first) == first
    assert RunCheckpointer.resolve(run.checkpoints_dir) == second
    assert RunCheckpointer.resolve(str(run.root)) == second
    assert ckpt.load(run.root).step == 2
    (run.checkpoints_dir / "step_000009").mkdir()  # a folder without meta.json is not a checkpoint
    assert RunCheckpointer.resolve(run.root) == second and ckpt.latest() == second
    with pytest.raises(CheckpointError, match="incomplete checkpoint"):
        RunCheckpointer.resolve(run.checkpoints_dir / "step_000009")
    with pytest.raises(CheckpointError, match="does not exist"):
        RunCheckpointer.resolve(tmp_path / "nowhere")


def test_a_failing_trainer_writer_leaves_latest_at_the_previous_checkpoint(ckpt: RunCheckpointer) -> None:
    previous = save(ckpt, 1)

    def fail(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x" * 100)
        raise OSError("disk full")

    with pytest.raises(CheckpointWriteError, match="disk full") as info:
        ckpt.save(2, write_trainer=fail, state={})
    assert ckpt.latest() == previous and os.listdir(ckpt.directory) == ["step_000001"]
    assert str(info.value).startswith(f"checkpoint of step 2: writing {ckpt.directory}/.tmp-step_000002-")
    assert "the disk is full" not in str(info.value)  # this disk has room: the writer's own error only


def test_a_full_disk_is_named_even_when_the_writer_does_not_say_so(ckpt: RunCheckpointer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    previous = save(ckpt, 1)

    def fail(folder: Path) -> None:  # torch.save on a full disk: a zip-writer error without an errno
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 10624 vs 10518")

    usage = shutil.disk_usage(ckpt.directory)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=4096))
    with pytest.raises(CheckpointWriteError) as info:
        ckpt.save(2, write_trainer=fail, state={})
    assert info.value.errno == errno.ENOSPC
    assert "unexpected pos" in str(info.value) and "the disk is full (4096 bytes free" in str(info.value)
    assert ckpt.latest() == previous

    def enospc(folder: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.undo()
    with pytest.raises(CheckpointWriteError, match=r"No space left on device.*the disk is full") as info:
        ckpt.save(2, write_trainer=enospc, state={})
    assert info.value.errno == errno.ENOSPC and ckpt.latest() == previous


def test_a_non_json_state_fails_before_anything_is_written(ckpt: RunCheckpointer) -> None:
    previous = save(ckpt, 1)
    called = []
    with pytest.raises(TypeError, match=r"state\['scheduler'\]\['rng'\]\[1\] \(a bytes\)"):
        ckpt.save(2, write_trainer=called.append, state={"scheduler": {"rng": [1, b"raw"]}})
    with pytest.raises(TypeError, match=r"state\['ledger'\]\[3\] \(a int key"):
        ckpt.save(2, write_trainer=called.append, state={"ledger": {3: "a"}})
    assert called == [] and ckpt.latest() == previous and os.listdir(ckpt.directory) == ["step_000001"]


def test_a_meta_json_that_is_not_an_object_or_lacks_a_step_is_refused(ckpt: RunCheckpointer) -> None:
    path = save(ckpt, 1)
    (path / "meta.json").write_bytes(orjson.dumps({"config_hash": HASH}))
    with pytest.raises(CheckpointError, match="step = None; expected an int"):
        ckpt.load(path)
    (path / "state.json").unlink()
    (path / "meta.json").write_bytes(orjson.dumps({"config_hash": HASH, "step": 1}))
    with pytest.raises(CheckpointError, match=r"state\.json: missing"):
        ckpt.load(path)


# -- writers killed with SIGKILL ------------------------------------------------------------------

_KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from agentrl.runner.checkpoint import RunCheckpointer

    directory, marker = Path(sys.argv[1]), Path(sys.argv[2])

    def write_trainer(folder):
        (folder / "trainer.pt").write_bytes(b"partial" * 1000)
        marker.write_text("ready")
        time.sleep(600)

    RunCheckpointer(directory, keep_last=3, config_hash=sys.argv[3]).save(
        2, write_trainer=write_trainer, state={"step": 2})
""")


def test_a_writer_process_killed_mid_save_leaves_latest_at_the_previous_checkpoint(
        ckpt: RunCheckpointer, tmp_path: Path) -> None:
    previous = save(ckpt, 1)
    marker = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(ckpt.directory), str(marker), HASH])
    try:
        wait_for(marker, lambda: proc.poll() is None)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    leftovers = [n for n in os.listdir(ckpt.directory) if n.startswith(".tmp-step_000002-")]
    assert len(leftovers) == 1, os.listdir(ckpt.directory)
    assert ckpt.latest() == previous and RunCheckpointer.resolve(ckpt.directory) == previous
    assert ckpt.load(ckpt.directory).state == {"step": 1}
    save(ckpt, 2)  # the next save removes the killed writer's folder
    assert sorted(os.listdir(ckpt.directory)) == ["step_000001", "step_000002"]


def _hang(marker: Path) -> None:
    marker.write_text("ready")
    time.sleep(600)


@pytest.fixture
def forked_kill(tmp_path: Path) -> Iterator[Callable[[Callable[[], None]], None]]:
    """Runs ``body`` in a forked child (modules already imported), SIGKILLs it at the marker."""
    marker = tmp_path / "kill-point"

    def run(body: Callable[[], None]) -> None:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            try:
                body()
            finally:
                os._exit(3)
        reaped: list[int] = []

        def alive() -> bool:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reaped.append(status)
            return not done

        try:
            wait_for(marker, alive)
        finally:
            if not reaped:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        marker.unlink()

    yield run


def test_a_writer_killed_after_state_json_before_meta_json(ckpt: RunCheckpointer, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           forked_kill: Callable[[Callable[[], None]], None]) -> None:
    previous = save(ckpt, 1)
    real_fsync_tree = checkpoint_module.fsync_tree

    def fsync_then_hang(root: Path) -> None:
        real_fsync_tree(root)
        assert (root / "state.json").is_file() and (root / "trainer" / "trainer.pt").is_file()
        _hang(tmp_path / "kill-point")

    def body() -> None:
        monkeypatch.setattr(checkpoint_module, "fsync_tree", fsync_then_hang)
        save(ckpt, 2)

    forked_kill(body)
    assert ckpt.latest() == previous


def test_a_writer_killed_while_writing_meta_json(ckpt: RunCheckpointer, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 forked_kill: Callable[[Callable[[], None]], None]) -> None:
    previous = save(ckpt, 1)

    def half_written_meta(path: Path, data: bytes) -> Path:
        (path.parent / f".{path.name}.tmp-dead").write_bytes(data[: len(data) // 2])
        _hang(tmp_path / "kill-point")
        return path

    def body() -> None:
        monkeypatch.setattr(checkpoint_module, "write_atomic", half_written_meta)
        save(ckpt, 2)

    forked_kill(body)
    assert ckpt.latest() == previous
    assert RunCheckpointer.resolve(ckpt.directory) == previous


def test_a_writer_killed_while_pruning_leaves_only_complete_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        forked_kill: Callable[[Callable[[], None]], None]) -> None:
    ckpt = RunCheckpointer(tmp_path / "ck", keep_last=1, config_hash=HASH)
    save(ckpt, 1)
    real_rmtree = checkpoint_module.shutil.rmtree

    def delete_some_then_hang(path: Path, ignore_errors: bool = False) -> None:
        real_rmtree(path / "trainer")  # rmtree got as far as the weights, not yet meta.json
        _hang(tmp_path / "kill-point")

    def body() -> None:
        monkeypatch.setattr(checkpoint_module.shutil, "rmtree", delete_some_then_hang)
        save(ckpt, 2)

    forked_kill(body)
    assert steps_of(ckpt) == ["step_000002"]
    assert ckpt.load(ckpt.directory).state == {"step": 2}
    save(ckpt, 3)
    assert sorted(os.listdir(ckpt.directory)) == ["step_000003"]


def test_the_torch_backend_saves_into_and_loads_from_a_checkpoint(tmp_path: Path) -> None:
    import torch

    from agentrl.testing import build_tiny_model
    from agentrl.train import TorchBackendConfig, TorchTrainBackend

    config = TorchBackendConfig(device="cpu", dtype="float32")
    backend = TorchTrainBackend.from_pretrained(build_tiny_model(), config)
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(0.01)  # differ from the folder the fresh backend starts from
    ckpt = RunCheckpointer(tmp_path, keep_last=1, config_hash=HASH)
    path = ckpt.save(1, write_trainer=backend.save_checkpoint, state={"policy_version": 1})
    fresh = TorchTrainBackend.from_pretrained(build_tiny_model(), config)
    loaded = ckpt.load(tmp_path)
    fresh.load_checkpoint(loaded.trainer_dir)
    assert loaded.path == path and loaded.state == {"policy_version": 1}
    expected = dict(backend.model.named_parameters())
    for name, p in fresh.model.named_parameters():
        assert torch.equal(p, expected[name]), name
