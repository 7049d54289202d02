"""RunDirectory: layout, config and summary snapshots, metrics lines (non-finite values, torn last
line, rewind), gzip trajectory files with their header, and the errors that name the file."""

from __future__ import annotations

import gzip
import math
import random
from pathlib import Path

import orjson
import pytest

from agentrl.chat.types import Message
from agentrl.episode import Episode
from agentrl.runner.rundir import RunDirectory, RunDirError
from agentrl.trajectory import SegmentKind, Status, StopReason, Trajectory


def make_episode(seed: int, *, forked: bool = False) -> Episode:
    rng = random.Random(seed)
    sequences = []
    for index in range(2 if forked else 1):
        traj = Trajectory.from_prompt([rng.randrange(1000) for _ in range(5)],
                                      messages=[Message(role="user", content=f"q{seed}")],
                                      rollout_id=f"r{seed}", group_id=f"g{seed // 2}", sequence_index=index)
        traj.append_model([rng.randrange(1000) for _ in range(4)], [-rng.random() for _ in range(4)],
                          weight_version="3", finish_reason="stop")
        traj.append_env([7, 8], kind=SegmentKind.TOOL, message_index=1)
        traj.reward = rng.random()
        traj.finish(Status.COMPLETED, StopReason.NO_TOOL_CALLS)
        sequences.append(traj)
    return Episode(sequences=sequences, env_info=[{"turn": 1, "seed": seed}])


@pytest.fixture
def run(tmp_path: Path) -> RunDirectory:
    return RunDirectory(tmp_path / "run", config_hash="abc123" * 4)


def test_construction_creates_the_layout(tmp_path: Path) -> None:
    run = RunDirectory(str(tmp_path / "a" / "b"), config_hash="h")
    assert run.root == tmp_path / "a" / "b"
    for folder in (run.trajectories_dir, run.checkpoints_dir, run.logs_dir):
        assert folder.is_dir() and folder.parent == run.root
    assert run.read_metrics() == [] and run.trajectory_steps() == []
    with pytest.raises(RunDirError, match="config_hash"):
        RunDirectory(tmp_path / "c", config_hash="")


def test_config_snapshot_holds_the_hash_and_keeps_an_older_hash_aside(tmp_path: Path) -> None:
    first = RunDirectory(tmp_path, config_hash="aaaaaaaaaaaaaaaa")
    path = first.write_config({"model": {"path": "m"}, "lr": 1e-5})
    assert orjson.loads(path.read_bytes())["config"] == {"model": {"path": "m"}, "lr": 1e-5}
    assert first.read_config()["config_hash"] == "aaaaaaaaaaaaaaaa"
    first.write_config({"lr": 2e-5})  # same hash: replaced in place
    assert sorted(p.name for p in tmp_path.glob("config*.json")) == ["config.json"]
    second = RunDirectory(tmp_path, config_hash="bbbbbbbbbbbbbbbb")
    second.write_config({"lr": 3e-5})
    assert second.read_config()["config"] == {"lr": 3e-5}
    kept = tmp_path / "config.aaaaaaaaaaaa.json"
    assert orjson.loads(kept.read_bytes())["config"] == {"lr": 2e-5}
    assert not list(tmp_path.glob(".*tmp*"))


def test_metrics_lines_hold_step_time_and_write_non_finite_values_as_null(run: RunDirectory) -> None:
    run.append_metrics(1, {"loss": 0.5, "nan": math.nan, "inf": -math.inf, "nested": {"x": math.inf}})
    run.append_metrics(2, {"loss": 0.25})
    lines = run.metrics_path.read_bytes().splitlines()
    assert len(lines) == 2
    first, second = run.read_metrics()
    assert first["step"] == 1 and first["loss"] == 0.5 and isinstance(first["time"], float)
    assert first["nan"] is None and first["inf"] is None and first["nested"] == {"x": None}
    assert second["step"] == 2 and second["time"] >= first["time"]


def test_metrics_refuse_reserved_keys_and_non_json_values(run: RunDirectory) -> None:
    with pytest.raises(RunDirError, match="'step' is reserved"):
        run.append_metrics(1, {"step": 3})
    with pytest.raises(TypeError, match=r"metrics\[step 1\]\['bad'\]"):
        run.append_metrics(1, {"bad": object()})
    with pytest.raises(RunDirError, match="step = -1"):
        run.append_metrics(-1, {})
    assert run.read_metrics() == []


def test_a_torn_last_metrics_line_is_skipped_then_cut_before_the_next_append(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path, config_hash="h")
    run.append_metrics(1, {"a": 1})
    run.append_metrics(2, {"a": 2})
    with open(run.metrics_path, "ab") as f:  # a writer killed mid-line
        f.write(b'{"step": 3, "a": ')
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    resumed = RunDirectory(tmp_path, config_hash="h")
    resumed.append_metrics(3, {"a": 3})
    assert [r["step"] for r in resumed.read_metrics()] == [1, 2, 3]
    assert resumed.metrics_path.read_bytes().count(b"\n") == 3


def test_a_whole_last_line_missing_only_its_newline_is_kept(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path, config_hash="h")
    run.metrics_path.write_bytes(b'{"step": 1, "a": 1}')
    assert [r["step"] for r in run.read_metrics()] == [1]
    run.append_metrics(2, {"a": 2})
    assert [r["step"] for r in run.read_metrics()] == [1, 2]


def test_a_malformed_middle_metrics_line_raises_naming_file_and_line(run: RunDirectory) -> None:
    run.metrics_path.write_bytes(b'{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(RunDirError, match=r"metrics\.jsonl:2: not JSON"):
        run.read_metrics()
    run.metrics_path.write_bytes(b'{"step": 1}\n[1, 2]\n')
    with pytest.raises(RunDirError, match=r"metrics\.jsonl:2: expected an object with an int 'step'"):
        run.read_metrics()


def test_trajectories_round_trip_through_gzip_with_a_header(run: RunDirectory) -> None:
    episodes = [make_episode(i, forked=i == 1) for i in range(3)]
    path = run.write_trajectories(1, episodes, extra={"policy_version": 4})
    assert path.name == "step_000001.jsonl.gz" and path.parent == run.trajectories_dir
    with gzip.open(path, "rb") as f:
        lines = f.read().splitlines()
    assert orjson.loads(lines[0]) == {"config_hash": run.config_hash, "step": 1, "count": 3, "policy_version": 4}
    assert len(lines) == 4
    back = run.read_trajectories(1)
    assert [e.to_dict() for e in back] == [e.to_dict() for e in episodes]
    assert len(back[1].sequences) == 2
    assert run.trajectory_header(1)["policy_version"] == 4
    run.write_trajectories(12, [])
    assert run.trajectory_steps() == [1, 12] and run.read_trajectories(12) == []
    assert not [p for p in run.trajectories_dir.iterdir() if p.name.startswith(".")]


def test_a_lone_surrogate_in_an_episode_is_written_as_the_replacement_character(run: RunDirectory) -> None:
    # an environment's text decoded with errors="surrogateescape": not Unicode, so orjson refuses it as it is
    episode = make_episode(0)
    episode.env_info.append({"stderr": "bytes \udcff here"})
    run.write_trajectories(1, [episode])
    [back] = run.read_trajectories(1)
    assert back.env_info[-1] == {"stderr": "bytes \ufffd here"}
    assert back.trajectory.to_dict() == episode.trajectory.to_dict()


def test_trajectory_errors_name_the_file(run: RunDirectory) -> None:
    with pytest.raises(RunDirError, match=r"no trajectories for step 5; steps with trajectories: \[\]"):
        run.read_trajectories(5)
    with pytest.raises(RunDirError, match="'step' is reserved"):
        run.write_trajectories(1, [], extra={"step": 2})
    path = run.trajectory_path(2)
    with gzip.open(path, "wb") as f:  # a file copied under the wrong step name
        f.write(orjson.dumps({"config_hash": "h", "step": 3, "count": 0}) + b"\n")
    with pytest.raises(RunDirError, match=r"step_000002\.jsonl\.gz:1: expected a header with step 2"):
        run.read_trajectories(2)
    good = make_episode(0).to_dict()
    bad = make_episode(1).to_dict()
    bad["sequences"][0]["loss_mask"].append(1)
    with gzip.open(path, "wb") as f:
        for record in ({"config_hash": "h", "step": 2, "count": 2}, good, bad):
            f.write(orjson.dumps(record) + b"\n")
    with pytest.raises(RunDirError, match=r"step_000002\.jsonl\.gz:3: sequences"):
        run.read_trajectories(2)
    with gzip.open(path, "wb") as f:
        for record in ({"config_hash": "h", "step": 2, "count": 2}, good):
            f.write(orjson.dumps(record) + b"\n")
    with pytest.raises(RunDirError, match="header says 2 episodes, the file holds 1"):
        run.read_trajectories(2)
    path.write_bytes(b"\x1f\x8b truncated")
    with pytest.raises(RunDirError, match="unreadable"):
        run.read_trajectories(2)


def test_a_failed_trajectory_write_leaves_no_file_and_keeps_the_previous_one(run: RunDirectory) -> None:
    run.write_trajectories(1, [make_episode(0)])
    broken = make_episode(1)
    broken.sequences[0].info["handle"] = object()
    with pytest.raises(TypeError, match=r"episodes\[1\]"):
        run.write_trajectories(1, [make_episode(2), broken])
    assert [e.to_dict() for e in run.read_trajectories(1)] == [make_episode(0).to_dict()]
    assert sorted(p.name for p in run.trajectories_dir.iterdir()) == ["step_000001.jsonl.gz"]


def test_rewind_forgets_the_steps_after_a_checkpoint(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path, config_hash="h")
    for step in (1, 2, 3):
        run.append_metrics(step, {"v": step})
        run.write_trajectories(step, [make_episode(step)])
    with open(run.metrics_path, "ab") as f:
        f.write(b'{"step": 4')
    resumed = RunDirectory(tmp_path, config_hash="h")
    resumed.rewind(2)
    assert [r["v"] for r in resumed.read_metrics()] == [1, 2]
    assert resumed.trajectory_steps() == [1, 2]
    resumed.append_metrics(3, {"v": 30})
    assert [(r["step"], r["v"]) for r in resumed.read_metrics()] == [(1, 1), (2, 2), (3, 30)]


def test_summary_is_written_atomically_and_replaced(run: RunDirectory) -> None:
    run.write_summary({"steps": 2, "reward": math.nan})
    run.write_summary({"steps": 3})
    assert run.read_summary() == {"steps": 3}
    assert [p.name for p in run.root.iterdir() if p.is_file()] == ["summary.json"]
    run.summary_path.write_bytes(b"[1]")
    with pytest.raises(RunDirError, match=r"summary\.json: expected a JSON object, got list"):
        run.read_summary()
