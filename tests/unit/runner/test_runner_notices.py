"""Runs never end silently, never bias the data silently: on the fake engine with the in-process
trainer. A run whose every group fails stops non-zero with the reasons; steps that change no weight
say so; bad data rows are shown (file, line, field) as the run starts; all of it reaches the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.environments import ToyArithmeticEnv
from agentrl.runner import RunCallback
from agentrl.runner.loop import NoTrainableGroupsError
from agentrl.testing.runner import build_fake_runner, fake_run_config


class Notices(RunCallback):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_notice(self, text: str) -> None:
        self.seen.append(text)


class ResetFails(ToyArithmeticEnv):
    async def reset(self) -> Any:
        raise RuntimeError(f"no sandbox for question {self.task.question!r}")


async def test_a_run_whose_every_group_fails_stops_with_the_reasons(tmp_path: Path) -> None:
    notices = Notices()
    runner, _ = build_fake_runner(fake_run_config(tmp_path, steps=3, rows=4, checkpoint_every=None),
                                  environment=ResetFails, callbacks=[notices])
    with pytest.raises(NoTrainableGroupsError, match=r"the run trained nothing: no prompt group could be completed "
                                                     r"\(4 failed: env_error x4 \(first: prompt \d+: RuntimeError: "
                                                     r"no sandbox for question 'What is"):
        await runner.run()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 0 and summary["failed_groups"] == {"env_error": 4}
    assert "RuntimeError: no sandbox for question" in summary["failure_examples"]["env_error"]
    assert summary["stopped_because"].startswith("no prompt group could be completed")
    assert any("prompt group(s) failed: env_error x" in n for n in notices.seen)


async def test_steps_that_change_no_weight_say_so(tmp_path: Path) -> None:
    """Every member of every group gets the same reward: all advantages are zero, no step trains."""
    notices = Notices()
    runner, _ = build_fake_runner(fake_run_config(tmp_path, steps=2, checkpoint_every=None), callbacks=[notices],
                                  reward=lambda trajectory, task: 1.0)
    summary = await runner.run()
    assert summary.steps == 2 and summary.skipped_steps == 2 and not summary.weights_changed
    assert notices.seen == [f"step {s} changed no weight: every group's advantages were zero (all members of each "
                            "group got the same reward)" for s in (1, 2)]
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["weights_changed"] is False and written["skipped_steps"] == 2


async def test_bad_data_rows_are_shown_with_file_line_and_field(tmp_path: Path) -> None:
    config = fake_run_config(tmp_path, steps=1, checkpoint_every=None)
    data = Path(config.data.train.path)
    with data.open("a") as f:
        f.write('{"question": "What is 2 * 3?"}\n')  # no answer: skipped
    notices = Notices()
    runner, _ = build_fake_runner(config, callbacks=[notices])
    summary = await runner.run()
    assert summary.bad_rows == 1
    [shown] = [n for n in notices.seen if "bad data row" in n]
    assert f"{data}:13: field 'answer'" in shown, shown


def test_agentrl_train_exits_non_zero_and_shows_why_every_group_failed(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line around the same runner (the fake engine stands for SGLang): the notice on the
    way, the reasons on stderr, exit status 1, never "data exhausted" with status 0."""
    import asyncio

    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.runner import api

    config = fake_run_config(tmp_path, steps=2, rows=4, checkpoint_every=None)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config.to_dict()))

    def train_on_the_fake_engine(cfg: Any, *, callbacks: Any = (), **_: Any) -> Any:
        runner, _engine = build_fake_runner(cfg, environment=ResetFails, callbacks=callbacks)
        return asyncio.run(runner.run())

    monkeypatch.setattr(api, "run", train_on_the_fake_engine)
    result = CliRunner().invoke(app, ["train", str(path), "--quiet"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "warning: step 1: 4 prompt group(s) failed: env_error x4" in result.stdout
    assert "error: the run trained nothing: no prompt group could be completed (4 failed: env_error x4" in result.stderr
    assert "RuntimeError: no sandbox for question" in result.stderr and "Traceback" not in result.output
