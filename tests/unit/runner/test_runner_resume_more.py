"""Resuming: a finished run answers at once and is left as it is; ``train.steps`` may be raised on
``--resume`` (the one change that does not alter what was trained); a resumed run's summary covers
the whole run. The fake engine stands for SGLang; the trainer, checkpoints and CLI are real."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.runner import api
from agentrl.testing.runner import build_fake_runner, fake_run_config


def _train_on_the_fake_engine(cfg: Any, *, callbacks: Any = (), resume: str | None = None, **_: Any) -> Any:
    runner, _engine = build_fake_runner(cfg, callbacks=callbacks, resume=resume)
    return asyncio.run(runner.run())


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setattr(api, "run", _train_on_the_fake_engine)
    return CliRunner()


def _invoke(cli: CliRunner, *args: str) -> Any:
    result = cli.invoke(app, ["train", *args, "--quiet"], env={"COLUMNS": "200"})
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    return result


def test_a_finished_run_answers_at_once_and_more_steps_extend_it(tmp_path: Path, cli: CliRunner) -> None:
    config = fake_run_config(tmp_path, steps=2, checkpoint_every=1, rows=24)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config.to_dict()))
    first = _invoke(cli, str(path))
    assert first.exit_code == 0, first.output
    run = tmp_path / "run"
    summary = run / "summary.json"
    before = summary.read_bytes()

    again = _invoke(cli, str(run), "--resume")
    assert again.exit_code == 0, again.output
    assert f"the run in {run} already finished: 2 steps (train.steps=2); nothing to resume" in again.stdout
    assert "train.steps=<more than 2>" in again.stdout
    assert summary.read_bytes() == before  # not overwritten with zeros

    other = _invoke(cli, str(run), "--resume", "train.optimizer.lr=0.5")
    assert other.exit_code == 2 and "changed: train.optimizer.lr" in other.stderr  # anything else: refused

    more = _invoke(cli, str(run), "--resume", "train.steps=4")
    assert more.exit_code == 0, more.output
    whole = json.loads(summary.read_text())
    assert whole["steps"] == 4 and whole["prompts_trained"] == 4 * 2  # the whole run, not the resumed part
    assert whole["resumed_from"].endswith("step_000002")
    first_wall = json.loads(before)["wall_s"]
    assert whole["wall_s"] > first_wall
