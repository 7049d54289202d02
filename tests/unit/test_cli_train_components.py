"""``--reward`` and ``--group-filter`` on ``--resume``: the names a run started with are recorded in its
folder (components.json); a resume without them reuses them, a resume with different ones is refused.
The training itself is replaced by a recorder of what ``agentrl train`` hands the runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.environments import make_arithmetic_rows
from agentrl.rewards import drop_uniform_rewards, math_answer_reward
from agentrl.testing import build_tiny_model

REWARD = "agentrl.rewards:math_answer_reward"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(8, seed=0)))
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\npath = "{build_tiny_model()}"\ndtype = "float32"\n[data.train]\npath = "{data}"\n'
                    '[environment]\nname = "toy_arithmetic"\n[rollout.engines]\nmax_total_tokens = 4096\n'
                    f'[train]\nsteps = 2\n[logging]\nrun_dir = "{tmp_path / "run"}"\n')
    return path


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What each ``agentrl train`` hands the runner; the 'run' writes config.json and a checkpoint."""
    from agentrl.runner import api
    from agentrl.runner.rundir import RunDirectory

    seen: list[dict[str, Any]] = []

    def fake_train(config: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        RunDirectory(config.run_dir(), config_hash=config.hash()).write_config(config.to_dict())
        (config.run_dir() / "checkpoints" / "step_000001").mkdir(parents=True, exist_ok=True)
        (config.run_dir() / "checkpoints" / "step_000001" / "meta.json").write_text("{}")
        return None

    monkeypatch.setattr(api, "run", fake_train)
    return seen


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(app, ["train", *args], env={"COLUMNS": "200"})
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return result


def test_the_names_are_recorded_and_a_resume_reuses_them(config: Path, calls: list[dict[str, Any]]) -> None:
    result = invoke(str(config), "--reward", REWARD, "--group-filter", "drop_uniform_rewards")
    assert result.exit_code == 0, result.output
    run = config.parent / "run"
    assert json.loads((run / "components.json").read_text()) == {"reward": REWARD,
                                                                  "group_filter": "drop_uniform_rewards"}
    assert calls[0]["reward"] is math_answer_reward and calls[0]["group_filter"] is drop_uniform_rewards
    result = invoke(str(config), "--resume", "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"components   --reward {REWARD}, --group-filter drop_uniform_rewards" in result.stdout
    for target in (str(config), str(run)):  # the config file, or the run folder itself
        result = invoke(target, "--resume")
        assert result.exit_code == 0, result.output
        assert calls[-1]["reward"] is math_answer_reward and calls[-1]["group_filter"] is drop_uniform_rewards
        assert calls[-1]["resume"] == str(run)
    result = invoke(str(config), "--resume", "--reward", REWARD)  # the same name again is fine
    assert result.exit_code == 0 and calls[-1]["group_filter"] is drop_uniform_rewards


def test_a_resume_with_other_names_is_refused(config: Path, calls: list[dict[str, Any]]) -> None:
    assert invoke(str(config), "--group-filter", "drop_uniform_rewards").exit_code == 0
    run = config.parent / "run"
    result = invoke(str(config), "--resume", "--reward", REWARD)
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: --reward {REWARD!r}: the run in {run} was trained with no --reward "
                                     "(components.json); expected the same, or leave --reward out to reuse it")
    result = invoke(str(config), "--resume", "--group-filter", "tests_nope:f", "--dry-run")
    assert result.exit_code == 2 and result.stderr.startswith("error: --group-filter: ")  # unknown: named first
    assert len(calls) == 1


def test_a_run_folder_without_the_record_takes_the_names_given(config: Path, calls: list[dict[str, Any]]) -> None:
    """A folder written before the names were recorded: the names given are used (nothing to compare)."""
    assert invoke(str(config)).exit_code == 0
    run = config.parent / "run"
    assert json.loads((run / "components.json").read_text()) == {"reward": None, "group_filter": None}
    (run / "components.json").unlink()
    result = invoke(str(config), "--resume", "--reward", REWARD)
    assert result.exit_code == 0, result.output
    assert calls[-1]["reward"] is math_answer_reward
    (run / "components.json").write_text('{"reward": 3}')
    result = invoke(str(config), "--resume")
    assert result.exit_code == 2 and "components.json: expected {\"reward\": name or null" in result.stderr
