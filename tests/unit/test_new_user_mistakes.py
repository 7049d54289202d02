"""The new user's day one, replayed (issue "Parity and polish"): configuration mistakes, each one
message naming the key, the value and what is accepted (exit 2, no traceback, nothing started), made
against a config of their own. The four runtime failures they hit have their own tests, named here:

- ``reset()`` raising on every row: ``tests/unit/runner/test_runner_notices.py`` (NoTrainableGroupsError), and
  on a large data set ``tests/unit/rollout/test_repeated_failures.py`` (stopped within N groups, with file:line);
- a reward returning ``None`` or raising: ``tests/unit/rollout/test_reward_failures.py`` (scored, never
  resampled);
- every step skipped: ``tests/unit/runner/test_runner_notices.py`` (the summary's ``weights_changed``);
- a bad row past the dry run's checks: ``tests/unit/runner/test_runner_notices.py`` (told as it happens).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model

runner = CliRunner()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(8, seed=0)))
    path = tmp_path / "run.toml"
    path.write_text(f"""
[model]
path = "{build_tiny_model()}"
dtype = "float32"
[data.train]
path = "{data}"
[environment]
name = "toy_arithmetic"
[rollout.scheduler]
groups_per_step = 2
group_size = 2
[train]
steps = 2
[logging]
run_dir = "{tmp_path / 'run'}"
""")
    return path


MISTAKES = [
    # (what the user wrote, what the one line must say)
    (["train.stpes=3"], ["train.stpes", "did you mean 'steps'"]),
    (["steps=2"], ["steps", "did you mean", "train.steps"]),
    (["train.steps=many"], ["train.steps=many", "expected an int"]),
    (["rollout.scheduler.group_size=0"], ["rollout.scheduler.group_size", "0", ">= 1"]),
    (["environment.name=toy_arithmetc"], ["toy_arithmetc", "toy_arithmetic"]),
    (["environment.name=agentrl.environments:ToyArithmeticEnvv"], ["has no attribute 'ToyArithmeticEnvv'",
                                                                   "did you mean 'ToyArithmeticEnv'"]),
    (["environment.name=agentrl.environments.arithmetc:ToyArithmeticEnv"],
     ["cannot import module 'agentrl.environments.arithmetc'", "did you mean 'agentrl.environments.arithmetic'"]),
    (["data.train.path=nowhere.jsonl"], ["data.train.path", "nowhere.jsonl"]),
    (["model.path=models/nope"], ["model.path", "models/nope"]),
    (["algorithm.estimator=gspo", "algorithm.policy_loss=ppo"], ["gspo", "ppo"]),
    (["rollout.sampling.temperature=-1"], ["rollout.sampling.temperature", "-1"]),
    (["sync.method=teleport"], ["sync.method", "teleport", "disk"]),
]


@pytest.mark.parametrize(("overrides", "says"), MISTAKES, ids=[" ".join(m[0]) for m in MISTAKES])
def test_a_configuration_mistake_is_one_clear_line(config: Path, overrides: list[str], says: list[str]) -> None:
    result = runner.invoke(app, ["train", str(config), *overrides, "--dry-run"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    text = result.stderr.strip() if result.stderr_bytes is not None else result.output.strip()
    assert "Traceback" not in result.output
    assert text.startswith("error: ") and len(text.splitlines()) == 1, text
    for fragment in says:
        assert fragment in text, (fragment, text)
    assert not (config.parent / "run").exists()  # nothing started, no run folder
