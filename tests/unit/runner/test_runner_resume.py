"""Resuming a run from its checkpoint (fake engine, real trainer): the prompts trained and the final
weights equal an uninterrupted run's, bit for bit, in each mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.runner import RunCallback
from agentrl.testing.runner import build_fake_runner, fake_run_config
from tests.unit.runner.test_runner_loop import trained_prompts

pytestmark = [pytest.mark.timeout(300)]


class _Killed(Exception):
    pass


class _Crash(RunCallback):
    """Raises once step ``at`` is recorded (before its checkpoint): a run killed mid-step."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        if step == self.at:
            raise _Killed(f"crash at step {step}")


@pytest.mark.parametrize("mode", ["sync", "one_step_off"])
async def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path: Path, mode: str) -> None:
    straight, _ = build_fake_runner(fake_run_config(tmp_path / "a", steps=4, mode=mode))
    await straight.run()

    config = fake_run_config(tmp_path / "b", steps=4, mode=mode)
    crashed, _ = build_fake_runner(config, callbacks=[_Crash(3)])
    with pytest.raises(_Killed):
        await crashed.run()
    resumed, _ = build_fake_runner(config, resume=str(config.run_dir()))
    await resumed.run()

    assert resumed.summary.resumed_from is not None
    assert trained_prompts(resumed.run_dir) == trained_prompts(straight.run_dir)
    assert [m["step"] for m in resumed.run_dir.read_metrics() if "prompt_ids" in m] == [1, 2, 3, 4]
    assert await resumed.trainer.digest() == await straight.trainer.digest()
