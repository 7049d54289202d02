"""The run report on a run that is still going (no summary, a torn last metrics line), its curves as
real PNG files, the best / worst tables linking to written viewers, and ``agentrl inspect``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from agentrl import save_episodes
from agentrl.cli.main import app
from agentrl.inspect import RunFolder, RunIndex, write_run_report
from agentrl.inspect.plots import CURVES, curve_series
from agentrl.runner.rundir import RunDirectory
from agentrl.testing.episodes import synthetic_episode


@pytest.fixture()
def partial_run(tmp_path: Path) -> Path:
    writer = RunDirectory(tmp_path / "run", config_hash="abc")
    writer.write_config({"model": {"path": str(tmp_path / "absent")}, "algorithm": {"std_normalize": True}})
    for step in (1, 2):
        episodes = [synthetic_episode(60, seed=step * 10 + i) for i in range(6)]
        writer.write_trajectories(step, episodes)
        writer.append_metrics(step, {"rollout/reward_mean": 0.1 * step, "rollout/accuracy": 0.05 * step,
                                     "mismatch/mean": 0.01, "rollout/staleness_max": 0})
    with open(writer.metrics_path, "ab") as f:  # killed mid-line: step 3 is torn
        f.write(b'{"step": 3, "time": 1.0, "rollout/reward_mean": 0.')
    return writer.root


def test_report_of_a_running_folder(partial_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    index = write_run_report(partial_run, out, top=3)
    markup = index.read_text(encoding="utf-8")
    assert index == out / "index.html" and "running (or stopped without a summary): last step 2" in markup
    folder = RunFolder(partial_run)
    lines = folder.metrics()
    assert [line["step"] for line in lines] == [1, 2] and not folder.warnings
    drawn = {c.name for c in CURVES if curve_series(c, lines)}
    assert drawn == {"reward", "accuracy", "mismatch", "staleness"}
    assert sorted(p.stem for p in (out / "plots").glob("*.png")) == sorted(drawn)
    for png in (out / "plots").glob("*.png"):
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size == (560, 300)
    assert curve_series(next(c for c in CURVES if c.name == "reward"), lines)["rollout/reward_mean"] == [
        (1, pytest.approx(0.1)), (2, pytest.approx(0.2))]
    links = re.findall(r'href="(episodes/[^"]+)"', markup)
    assert len(set(links)) >= 3 and all((out / link).is_file() for link in links)
    assert "not logged (yet): Tool calls per episode" in markup
    counts = RunIndex.of_run(partial_run).failure_counts()
    assert counts  # the synthetic episodes include failures
    assert all(f'<td>{kind}</td><td class="num">{n}</td>' in markup for kind, n in counts.items())


def test_the_curves_draw_the_held_out_evaluations_the_runner_logs() -> None:
    """The eval sets' keys as the runner writes them (``eval/<name>/...``, at step 0 before RL and
    every ``every_steps``) join the rollout curves."""
    lines = [{"step": 0, "initial": True, "eval/greedy/mean_reward": 0.0, "eval/greedy/pass@1": 0.0,
              "eval/greedy/tool_calls_per_episode": 0.0, "eval/t1/pass@1": 0.4},
             {"step": 1, "rollout/accuracy": 0.3, "rollout/reward_mean": 0.3, "rollout/tool_calls_per_episode": 0.4},
             {"step": 2, "rollout/accuracy": 0.5, "eval/greedy/pass@1": 0.9, "eval/greedy/mean_reward": 0.9,
              "eval/greedy/tool_calls_per_episode": 1.0, "eval/t1/pass@1": 0.8}]
    curves = {c.name: c for c in CURVES}
    accuracy = curve_series(curves["accuracy"], lines)
    assert accuracy == {"rollout/accuracy": [(1, 0.3), (2, 0.5)], "eval/greedy/pass@1": [(0, 0.0), (2, 0.9)],
                        "eval/t1/pass@1": [(0, 0.4), (2, 0.8)]}
    assert curve_series(curves["reward"], lines)["eval/greedy/mean_reward"] == [(0, 0.0), (2, 0.9)]
    assert curve_series(curves["tool_calls"], lines)["eval/greedy/tool_calls_per_episode"] == [(0, 0.0), (2, 1.0)]


def test_a_bad_line_mid_file_is_reported_not_fatal(partial_run: Path, tmp_path: Path) -> None:
    data = (partial_run / "metrics.jsonl").read_bytes()
    (partial_run / "metrics.jsonl").write_bytes(b"garbage\n" + data + b"\n")
    index = write_run_report(partial_run, tmp_path / "r2")
    assert "metrics.jsonl:1: not JSON" in index.read_text(encoding="utf-8")


def test_cli_run_folder_file_and_errors(partial_run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", str(partial_run)])
    assert result.exit_code == 0, result.output
    assert Path(result.output.strip()) == partial_run / "inspect" / "index.html"
    episodes = [synthetic_episode(50, seed=i) for i in range(4)]
    save_episodes(tmp_path / "rollouts.jsonl", episodes)
    result = runner.invoke(app, ["inspect", str(tmp_path / "rollouts.jsonl"), "--out", str(tmp_path / "o"), "--limit", "2"])
    assert result.exit_code == 0, result.output
    markup = (tmp_path / "o" / "index.html").read_text(encoding="utf-8")
    table = re.search(r'<table class="grid" id="episodes">(.*?)</table>', markup, re.S)
    assert table is not None and table.group(1).count("<tr>") == 1 + 4  # the header and one row per episode
    assert len(list((tmp_path / "o" / "episodes").glob("*.html"))) == 2 and "viewers written for the first 2" in markup
    result = runner.invoke(app, ["inspect", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "no such file or folder" in result.output
    (tmp_path / "junk.jsonl").write_text("{nope\n")
    result = runner.invoke(app, ["inspect", str(tmp_path / "junk.jsonl")])
    assert result.exit_code == 2 and "junk.jsonl: unreadable" in result.output


def test_a_distillation_run_draws_its_figures() -> None:
    lines = [{"step": 1, "distill/reverse_kl": 0.33, "distill/teacher_logprob": -1.2, "distill/student_logprob": -0.9,
              "distill/teacher_share": 1.0, "distill/tokens": 990.0},
             {"step": 2, "distill/reverse_kl": 0.25, "distill/teacher_logprob": -1.0, "distill/student_logprob": -0.75,
              "distill/teacher_share": 1.0, "distill/tokens": 980.0}]
    series = curve_series(next(c for c in CURVES if c.name == "distill"), lines)
    assert series["distill/reverse_kl"] == [(1, 0.33), (2, 0.25)]
    assert set(series) == {"distill/reverse_kl", "distill/teacher_logprob", "distill/student_logprob",
                           "distill/teacher_share"}
