"""The training loop on the deterministic fake engine, the real torch backend (tiny Qwen3), real run
folders and checkpoints: each mode runs, weights move and reach the "engine", the ledger and the
run folder say what was trained, and a resumed run equals an uninterrupted one bit for bit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentrl.runner import Runner, RunnerError
from agentrl.runner.loop import LoopSettings
from agentrl.testing.runner import build_fake_runner, fake_run_config, trained_prompts

pytestmark = [pytest.mark.timeout(300)]


async def test_sync_mode_trains_syncs_and_records_every_step(tmp_path: Path) -> None:
    config = fake_run_config(tmp_path, steps=3)
    runner, _client = build_fake_runner(config)
    summary = await runner.run()
    assert summary.steps == 3 and summary.policy_version == 3
    assert runner.rollout.weights.loaded == [1, 2, 3]                      # one sync per step, in order
    assert runner.rollout.weights.inflight_at_load == [0, 0, 0]            # engines idle at every sync
    lines = runner.run_dir.read_metrics()
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert all(m["train/skipped"] == 0.0 for m in lines)                   # index rewards: advantages non-zero
    assert all(m["mismatch/n"] > 0 for m in lines)
    # every step's trajectories were sampled by the weights the engine held then
    for step in (1, 2, 3):
        episodes = runner.run_dir.read_trajectories(step)
        assert len(episodes) == 4
        versions = {s.weight_version for ep in episodes for t in ep.sequences for s in t.segments if s.weight_version}
        assert versions == {str(step - 1)}
    flat = [p for step in trained_prompts(runner.run_dir) for p in step]
    assert len(flat) == len(set(flat)) == 6                                # 3 steps × 2 groups, none twice
    assert runner.ledger.trained(0) == set(flat)
    assert (runner.run_dir.root / "summary.json").is_file()


async def test_weights_move_and_the_engine_is_told_the_version(tmp_path: Path) -> None:
    config = fake_run_config(tmp_path, steps=1, checkpoint_every=None)
    runner, client = build_fake_runner(config)
    before = await runner.trainer.digest()
    await runner.run()
    assert await runner.trainer.digest() != before
    assert client.weight_version == "1"


async def test_one_step_off_never_updates_while_generating_and_trains_one_step_old_data(tmp_path: Path) -> None:
    config = fake_run_config(tmp_path, steps=4, mode="one_step_off", checkpoint_every=None)
    runner, _client = build_fake_runner(config, token_delay_s=0.002)
    await runner.run()
    assert runner.rollout.weights.inflight_at_load == [0, 0, 0, 0]
    for step in (1, 2, 3, 4):
        episodes = runner.run_dir.read_trajectories(step)
        versions = {int(s.weight_version) for ep in episodes for t in ep.sequences for s in t.segments
                    if s.weight_version}
        assert versions == {max(step - 2, 0)}    # step 2 trains data generated while step 1 trained
    lines = runner.run_dir.read_metrics()
    assert all("time/drain_s" in m for m in lines)


@pytest.mark.parametrize("token_delay_s", [0.0, 0.02])
async def test_bounded_staleness_keeps_every_trained_token_within_the_bound(tmp_path: Path,
                                                                            token_delay_s: float) -> None:
    """Fast rollouts (no token delay): the next batch is ready before the update, waits in the queue
    and is trained one version later. Slow ones (0.02 s/token): updates land while requests run
    (paused and resumed, not aborted)."""
    config = fake_run_config(tmp_path, steps=5, mode="bounded_staleness", checkpoint_every=None,
                             partial_rollout=True, max_staleness=2, rows=40)
    runner, _ = build_fake_runner(config, token_delay_s=token_delay_s)
    await runner.run()
    staleness = []
    for step in range(1, 6):
        episodes = runner.run_dir.read_trajectories(step)
        versions = [int(s.weight_version) for ep in episodes for t in ep.sequences for s in t.segments
                    if s.weight_version]
        staleness.append(step - 1 - min(versions))  # the trainer was at version step-1 when it trained them
    assert max(staleness) <= 2
    assert runner.rollout.weights.loaded == [1, 2, 3, 4, 5]
    if token_delay_s < 0.01:
        assert max(staleness) >= 1                   # the data did get older: the bound was needed
    else:
        assert any(n > 0 for n in runner.rollout.weights.inflight_at_load)   # updates land while generating


async def test_bounded_staleness_holds_when_training_is_slower_than_rollouts(tmp_path: Path) -> None:
    """The collector is far ahead of a slow trainer: it must not hand a batch over while another waits
    in the queue (that batch would be trained two updates later, past the scheduler's admission)."""
    config = fake_run_config(tmp_path, steps=6, mode="bounded_staleness", checkpoint_every=None,
                             partial_rollout=True, max_staleness=2, rows=80, over_sampling=1.0)
    runner, _ = build_fake_runner(config, token_delay_s=0.01)
    train_step = runner.train_step

    async def slow_train_step(batch: Any) -> dict[str, Any]:
        await asyncio.sleep(1.5)  # a step's rollouts take well under that on the fake engine
        return dict(await train_step(batch))

    runner.train_step = slow_train_step
    summary = await runner.run()
    assert summary.steps == 6
    for step in range(1, 7):
        versions = [int(s.weight_version) for ep in runner.run_dir.read_trajectories(step) for t in ep.sequences
                    for s in t.segments if s.weight_version]
        assert step - 1 - min(versions) <= 2


async def test_data_running_out_ends_the_run_with_its_reason(tmp_path: Path) -> None:
    config = fake_run_config(tmp_path, steps=50, rows=5, checkpoint_every=None)
    runner, _ = build_fake_runner(config)
    summary = await runner.run()
    assert summary.stopped_because == "data exhausted"
    assert summary.prompts_trained == 5


class _Skewed:
    """A rollout side whose engine scores differ from the trainer's by ``offset`` per token."""

    def __init__(self, runner: Runner, offset: float) -> None:
        self.runner, self.offset = runner, offset

    async def score(self, sequences: list[list[int]]) -> list[list[float]]:
        assert self.runner.trainer is not None
        scored = await self.runner.trainer.score(sequences)
        return [[x + self.offset for x in s] for s in scored]


@pytest.mark.parametrize(("offset", "fails"), [(0.0, False), (0.5, True)])
async def test_post_sync_probe_stops_the_run_when_engine_and_trainer_disagree(
        tmp_path: Path, offset: float, fails: bool) -> None:
    config = fake_run_config(tmp_path, steps=1, checkpoint_every=None)
    runner, _ = build_fake_runner(config)
    runner.settings = LoopSettings.from_config(config, probe_sequences=[[1, 2, 3, 4, 5], [7, 8, 9]], probe_bound=0.01)
    skewed = _Skewed(runner, offset)
    runner.rollout.score = skewed.score  # type: ignore[method-assign]
    if fails:
        with pytest.raises(RunnerError, match="post-sync probe"):
            await runner.probe()
    else:
        figures: dict[str, Any] = await runner.probe()
        assert figures["probe/mean_abs_diff"] == 0.0 and figures["probe/tokens"] == 6


async def test_colocated_engines_release_their_memory_around_each_train_step(tmp_path: Path) -> None:
    config = fake_run_config(tmp_path, steps=2, checkpoint_every=None)
    runner, _ = build_fake_runner(config)
    runner.settings = LoopSettings(**{**runner.settings.__dict__, "release_engine_memory": True})
    events: list[str] = []
    rollout, trainer = runner.rollout, runner.trainer
    original_train, original_load = trainer.train, rollout.weights.load

    async def release() -> None:
        events.append("release")

    async def resume(tags: list[str] | None = None) -> None:
        events.append(f"resume {','.join(tags) if tags else 'all'}")

    async def offload() -> dict[str, float]:
        events.append("offload")
        return {}

    async def onload() -> dict[str, float]:
        events.append("onload")
        return {}

    async def train(batch: Any, step: int) -> dict[str, float]:
        events.append("train")
        return await original_train(batch, step)

    async def load(version: int, folder: Path) -> dict[str, float]:
        events.append("sync")
        return await original_load(version, folder)

    rollout.release_memory, rollout.resume_memory = release, resume  # type: ignore[method-assign]
    trainer.train, trainer.offload, trainer.onload = train, offload, onload  # type: ignore[method-assign]
    rollout.weights.load = load  # type: ignore[method-assign]
    await runner.run()
    # SGLang's order: released weights come back first and are filled by the sync, then the KV cache
    assert events == ["release", "onload", "train", "offload", "resume weights", "sync", "resume all"] * 2


async def test_mismatch_before_and_after_the_step_is_logged(tmp_path: Path) -> None:
    """Before the update the trainer scores what the engine sampled (the fake engine reports -0.5 for
    every token, the tiny model does not: a large, finite mismatch); after it, the figures move."""
    base = fake_run_config(tmp_path / "a", steps=1, checkpoint_every=None).to_dict()
    base["train"]["score_after_step"] = True
    from agentrl.runner import RunConfig

    runner, _ = build_fake_runner(RunConfig.from_dict(base))
    await runner.run()
    line = runner.run_dir.read_metrics()[0]
    for prefix in ("mismatch", "mismatch_after"):
        assert line[f"{prefix}/n"] > 0
        assert line[f"{prefix}/p50"] <= line[f"{prefix}/p90"] <= line[f"{prefix}/p99"] <= line[f"{prefix}/max"]
    assert line["mismatch_after/mean"] != line["mismatch/mean"]
