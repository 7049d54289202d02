"""Browsing a run folder: the index reads what the run folder's writer wrote, filters by step,
reward, stop reason, failure kind and tool calls, loads episodes back, and shows a group with its
advantages; plain JSONL files of episodes or trajectories are read too."""

from __future__ import annotations

import gzip
import statistics
from pathlib import Path

import pytest

from agentrl import Episode, save_episodes
from agentrl.inspect import GroupView, InspectError, RunFolder, RunIndex, read_episodes_file
from agentrl.runner.rundir import RunDirectory
from agentrl.testing.episodes import synthetic_episode
from agentrl.trajectory import save_jsonl


def _episodes(step: int, n: int = 8) -> list[Episode]:
    out = []
    for i in range(n):
        ep = synthetic_episode(40, seed=step * 100 + i, turns=1 + i % 3, group_id=f"s{step}g{i // 4}", index=i % 4)
        ep.trajectory.reward = float(i % 4) / 3  # distinct within a group
        out.append(ep)
    return out


@pytest.fixture()
def run(tmp_path: Path) -> tuple[Path, dict[int, list[Episode]]]:
    writer = RunDirectory(tmp_path / "run", config_hash="abc")
    writer.write_config({"algorithm": {"std_normalize": True, "advantage_eps": 1e-6}})
    written = {}
    for step in (1, 2, 3):
        written[step] = _episodes(step)
        writer.write_trajectories(step, written[step])
        writer.append_metrics(step, {"rollout/reward_mean": 0.5})
    return writer.root, written


def test_rows_match_what_was_written(run: tuple[Path, dict[int, list[Episode]]]) -> None:
    root, written = run
    index = RunIndex.of_run(root)
    flat = [(s, ep) for s in sorted(written) for ep in written[s]]
    assert len(index) == len(flat)
    for row, (step, ep) in zip(index, flat, strict=True):
        traj = ep.trajectory
        assert (row.step, row.sample_id, row.reward, row.stop_reason, row.status) == (
            step, traj.sample_id, traj.reward, traj.stop_reason.value if traj.stop_reason else None, traj.status.value)
        assert row.tool_calls == int(traj.metrics["tool_calls"]) and row.turns == traj.num_model_turns
        assert row.failure_kinds == (("malformed_json",) if "failures/malformed_json" in traj.metrics else ())
        assert dict(row.kind_tokens) == {k: sum(s.length for s in traj.segments if s.kind.value == k)
                                         for k in {s.kind.value for s in traj.segments}}
        assert index.episode(row).to_dict() == ep.to_dict()


def test_filters(run: tuple[Path, dict[int, list[Episode]]]) -> None:
    root, written = run
    index = RunIndex.of_run(root)
    every = [ep.trajectory for s in sorted(written) for ep in written[s]]
    assert [r.step for r in index.filter(step=2)] == [2] * 8
    assert len(index.filter(step=[1, 3])) == 16
    assert [r.reward for r in index.filter(min_reward=0.5)] == [t.reward for t in every if t.reward >= 0.5]
    assert [r.reward for r in index.filter(max_reward=0.0)] == [t.reward for t in every if t.reward <= 0.0]
    for reason in {t.stop_reason for t in every}:
        assert [r.sample_id for r in index.filter(stop_reason=reason)] == [t.sample_id for t in every
                                                                           if t.stop_reason is reason]
    with_failure = [t.sample_id for t in every if "failures/malformed_json" in t.metrics]
    assert [r.sample_id for r in index.filter(failure="malformed_json")] == with_failure
    assert [r.sample_id for r in index.filter(failure="any")] == with_failure
    assert index.filter(failure="tool_timeout").rows == ()
    assert [r.tool_calls for r in index.filter(tool_calls=1)] == [1] * sum(1 for t in every if t.metrics["tool_calls"] == 1)
    assert {r.tool_calls for r in index.filter(min_tool_calls=1, max_tool_calls=1)} == {1}
    assert len(index.filter(step=1, min_tool_calls=2)) == sum(1 for ep in written[1] if ep.trajectory.metrics["tool_calls"] >= 2)
    ranked = index.sorted_by_reward()
    assert [r.reward for r in ranked] == sorted((t.reward for t in every), reverse=True)
    assert index.failure_counts()["malformed_json"] == len(with_failure)


def test_group_side_by_side_with_advantages(run: tuple[Path, dict[int, list[Episode]]]) -> None:
    root, written = run
    index = RunIndex.of_run(root)
    view = index.group("s2g1")
    assert isinstance(view, GroupView) and len(view.episodes) == 4
    rewards = [ep.trajectory.reward for ep in written[2][4:]]
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    assert view.advantages == pytest.approx([(r - mean) / (std + 1e-6) for r in rewards])
    markup = view._repr_html_()
    assert markup.count('class="member"') == 4 and f"{view.advantages[0]:+.3f}" in markup
    with pytest.raises(KeyError, match="no such group"):
        index.group("nope")


def test_reads_jsonl_files_of_episodes_and_of_trajectories(tmp_path: Path) -> None:
    episodes = _episodes(1, n=3)
    save_episodes(tmp_path / "eps.jsonl", episodes)
    assert [ep.to_dict() for _, ep in read_episodes_file(tmp_path / "eps.jsonl")] == [e.to_dict() for e in episodes]
    # a forked rollout saved as trajectories: consecutive sequences of one rollout make one episode
    first, second = synthetic_episode(30, seed=5).trajectory, synthetic_episode(30, seed=5).trajectory
    second.sequence_index = 1
    other = synthetic_episode(30, seed=6).trajectory
    save_jsonl(tmp_path / "trajs.jsonl", [first, second, other])
    got = read_episodes_file(tmp_path / "trajs.jsonl")
    assert [(line, len(ep.sequences)) for line, ep in got] == [(1, 2), (3, 1)]
    index = RunIndex.of_file(tmp_path / "trajs.jsonl")
    assert [r.step for r in index] == [None] * 3 and index.episode(2).trajectory.rollout_id == "r6"
    with gzip.open(tmp_path / "eps.jsonl.gz", "wb") as f:
        f.write((tmp_path / "eps.jsonl").read_bytes())
    assert len(RunIndex.of_file(tmp_path / "eps.jsonl.gz")) == 3


def test_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(InspectError, match="no such folder"):
        RunFolder(tmp_path / "missing")
    with pytest.raises(InspectError, match="not a run folder"):
        RunFolder(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": [1], "prompt_length": 5, "loss_mask": [], "logprobs": [], "segments": []}\n')
    with pytest.raises(InspectError, match=r"bad.jsonl:1: .*prompt_length"):
        read_episodes_file(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(InspectError, match="expected a JSON object"):
        RunIndex.of_file(bad)
