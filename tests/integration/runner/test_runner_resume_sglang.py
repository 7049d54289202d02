"""Resume on a real CPU SGLang engine (router, ``ToyArithmeticEnv``, torch trainer in-process): a run
with partial rollouts and over-sampling is cut after step 2's checkpoint and resumed by a new
scheduler and a new trainer.

With the real engine which groups finish first depends on timing, so two runs do not train the
same prompts in the same order (the fake-engine tests check that equality bit for bit). What is
checked here: the restored buffer is the checkpoint's; every buffered episode continues from its
saved tokens (the engine is asked for the rest of the same turn, no environment turn is redone);
the resumed run's prompts are disjoint from what the checkpoint had trained; no prompt is trained
twice in the epoch; the engine serves the checkpoint's weight version after the resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.rollout.health import EngineGroup
from agentrl.runner import RunCallback, RunConfig, Runner
from agentrl.runner._launch import _assemble
from agentrl.runner.checkpoint import RunCheckpointer
from agentrl.runner.envs import environment_factory
from agentrl.runner.ledger import PromptLedger
from agentrl.runner.loop import LoopSettings
from agentrl.runner.rollout_service import RolloutService
from agentrl.runner.rundir import RunDirectory
from agentrl.runner.sides import LocalTrainer
from agentrl.runner.trainer import TrainService
from agentrl.testing import build_tiny_model
from agentrl.testing.runner import index_reward, trained_prompts

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


class _Killed(Exception):
    pass


class _Crash(RunCallback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        if step == self.at:
            raise _Killed(f"crash after step {step} was recorded, before its checkpoint")


class _FirstCollect(RunCallback):
    """Reads the scheduler's buffer when the resumed run starts its first rollout."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.buffer: list[str] | None = None

    def on_phase(self, phase: str, step: int) -> None:
        if phase == "collect_rollouts" and self.buffer is None:
            self.buffer = list(self.runner.rollout.scheduler.buffered_prompt_ids())


def make_config(tmp_path: Path, engine_url: str) -> RunConfig:
    data = tmp_path / "train.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in make_arithmetic_rows(24, seed=0)))
    return RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data), "seed": 2}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {
            "engines": {"context_length": 1024, "max_total_tokens": 8192, "random_seed": 0, "startup_timeout_s": 600,
                        "urls": [engine_url]},
            "sampling": {"max_new_tokens": 48, "temperature": 1.0},
            "scheduler": {"groups_per_step": 2, "group_size": 2, "over_sampling": 1.0, "partial_rollout": True},
        },
        "train": {"steps": 4, "optimizer": {"lr": 1e-3}, "max_tokens_per_micro_batch": 2048},
        "logging": {"run_dir": str(tmp_path / "run")},
        "checkpoint": {"every_steps": 1, "keep_last": 3},
    })


def runner_for(config: RunConfig, group: EngineGroup, *, resume: str | None = None,
               callbacks: tuple[RunCallback, ...] = ()) -> Runner:
    factory = environment_factory(config, reward=index_reward)
    rollout = _assemble(RolloutService, config, factory, group, None)  # a new scheduler on the same engines
    trainer = LocalTrainer(TrainService.from_config(config, threads=1))
    run_dir = RunDirectory(config.run_dir(), config_hash=config.hash())
    checkpointer = RunCheckpointer(run_dir.checkpoints_dir, keep_last=3, config_hash=config.hash())
    return Runner(rollout, trainer, LoopSettings.from_config(config), run_dir=run_dir, checkpointer=checkpointer,
                  callbacks=callbacks, resume=resume)


async def test_resume_continues_the_buffer_on_a_real_engine(tmp_path: Path, shared_engine: str) -> None:
    config = make_config(tmp_path, shared_engine)
    group = await EngineGroup.attach(config.rollout.engines.urls, config.rollout.router)
    try:
        crashed = runner_for(config, group, callbacks=(_Crash(3),))
        with pytest.raises(_Killed):
            await crashed.run()
        ckpt = crashed.checkpointer
        assert ckpt is not None
        saved = ckpt.load(ckpt.latest())
        assert saved.step == 2
        buffer = saved.state["scheduler"]["buffer"]
        ledger = PromptLedger()
        ledger.load_state_dict(saved.state["ledger"])
        before = [p for step in ledger.steps() for _, p in step.entries]

        watch = _FirstCollect()
        resumed = runner_for(config, group, resume=str(config.run_dir()), callbacks=(watch,))
        watch.runner = resumed
        await resumed.run()
        versions = [await e.weight_version() for e in group.engines]
    finally:
        await group.shutdown()

    assert watch.buffer == [g["prompt_id"] for g in buffer]   # restored before the first rollout
    assert versions == ["4"]

    steps = trained_prompts(resumed.run_dir)
    assert [len(s) for s in steps] == [2, 2, 2, 2]
    flat = [p for s in steps for p in s]
    assert len(flat) == len(set(flat)), f"a prompt was trained twice: {steps}"
    assert set(steps[2] + steps[3]).isdisjoint(steps[0] + steps[1])
    assert sorted(before) == sorted(steps[0] + steps[1])
    # every buffered episode that was trained later continued from its saved tokens
    saved_tokens = {(g["prompt_id"], i): m["sequences"][-1]["tokens"]
                    for g in buffer for i, m in enumerate(g["members"]) if m.get("sequences")}
    continued = 0
    for step in (3, 4):
        for ep in resumed.run_dir.read_trajectories(step):
            traj = ep.sequences[-1] if len(ep.sequences) == 1 else ep.sequences[0]
            prompt_id, index = str(traj.sample_id).rsplit(":", 1)
            prefix = saved_tokens.get((prompt_id, int(index)))
            if prefix is not None:
                assert ep.sequences[0].tokens[:len(prefix)] == prefix or traj.tokens[:len(prefix)] == prefix
                continued += 1
    report = resumed.run_dir.read_metrics()[2]
    print(f"buffered groups at the checkpoint: {len(buffer)}; episodes continued from saved tokens: {continued}; "
          f"members restored {report.get('report/members_restored')}, mismatches {report.get('report/restored_mismatch')}")
    assert report.get("report/restored_mismatch", 0) == 0
