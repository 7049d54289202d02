"""Resuming a run from its checkpoint (fake engine, real trainer): the prompts trained and the final
weights equal an uninterrupted run's, bit for bit, in each mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.runner import RunCallback
from agentrl.testing.runner import build_fake_runner, fake_run_config, trained_prompts

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


@pytest.mark.parametrize(("mode", "lora"), [("sync", None), ("one_step_off", None), ("sync", {"rank": 8})])
async def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path: Path, mode: str,
                                                                     lora: dict[str, Any] | None) -> None:
    straight, _ = build_fake_runner(fake_run_config(tmp_path / "a", steps=4, mode=mode, lora=lora))
    await straight.run()

    config = fake_run_config(tmp_path / "b", steps=4, mode=mode, lora=lora)
    crashed, _ = build_fake_runner(config, callbacks=[_Crash(3)])
    with pytest.raises(_Killed):
        await crashed.run()
    resumed, _ = build_fake_runner(config, resume=str(config.run_dir()))
    await resumed.run()

    assert resumed.summary.resumed_from is not None
    assert trained_prompts(resumed.run_dir) == trained_prompts(straight.run_dir)
    assert [m["step"] for m in resumed.run_dir.read_metrics() if "prompt_ids" in m] == [1, 2, 3, 4]
    assert await resumed.trainer.digest() == await straight.trainer.digest()
    if lora is not None:  # the adapter trained (peft starts B at zero), and resumed to the same bits
        adapters = [r.trainer.service.backend.adapter for r in (resumed, straight)]
        states = [a.state_dict() for a in adapters]
        assert states[0].keys() == states[1].keys()
        assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
        assert any(".lora_B." in k and v.abs().max() > 0 for k, v in states[0].items())


async def test_resume_with_a_partial_rollout_buffer_continues_it_exactly(tmp_path: Path) -> None:
    """Over-sampling leaves groups in flight at each step's end; they are buffered (environments
    open, partial turns kept), checkpointed, rebuilt by replay after the crash and continued."""
    def config_at(root: Path) -> Any:
        return fake_run_config(root, steps=4, partial_rollout=True, over_sampling=1.0, rows=20)

    straight, _ = build_fake_runner(config_at(tmp_path / "a"))
    await straight.run()

    config = config_at(tmp_path / "b")
    crashed, _ = build_fake_runner(config, callbacks=[_Crash(3)])
    with pytest.raises(_Killed):
        await crashed.run()
    resumed_from = crashed.checkpointer.load(crashed.checkpointer.latest())
    assert resumed_from.step == 2 and resumed_from.state["scheduler"]["buffer"], "nothing was buffered"
    resumed, _ = build_fake_runner(config, resume=str(config.run_dir()))
    await resumed.run()

    assert trained_prompts(resumed.run_dir) == trained_prompts(straight.run_dir)
    assert [g["prompt_id"] for g in (await resumed.rollout.state_dict())["buffer"]] == \
        [g["prompt_id"] for g in (await straight.rollout.state_dict())["buffer"]]
    assert await resumed.trainer.digest() == await straight.trainer.digest()


async def test_train_only_from_saved_trajectories_reproduces_the_run(tmp_path: Path) -> None:
    """The debug mode re-trains a run folder's saved trajectories from the initial model: the same
    data in the same order gives the same weights, bit for bit, and one metrics line per step."""
    from agentrl.runner.debug import train_from_trajectories
    from agentrl.runner.trainer import TrainService

    config = fake_run_config(tmp_path, steps=3, checkpoint_every=None)
    runner, _ = build_fake_runner(config)
    await runner.run()
    fresh = TrainService.from_config(config, threads=1)
    metrics = train_from_trajectories(config, config.run_dir(), service=fresh)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert fresh.digest() == await runner.trainer.digest()
    with pytest.raises(FileNotFoundError, match="no trajectories for steps"):
        train_from_trajectories(config, config.run_dir(), steps=[9], service=fresh)
