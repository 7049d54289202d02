"""The sides' transports hand every method of the runner's protocols on to the plain objects, unchanged:
in a worker thread (LocalTrainer), inside a train rank or the rollout actor. And what a run is started
with travels as one frozen plan."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from agentrl.runner._forward import protocol_methods
from agentrl.runner._run_plan import plan_run
from agentrl.runner.config import RunConfig
from agentrl.runner.loop import RolloutSide, TrainSide
from agentrl.runner.ray_run import GroupTrainer, RolloutActor, TrainRank
from agentrl.runner.rundir import RunDirectory
from agentrl.runner.sides import LocalTrainer
from agentrl.testing.runner import fake_run_config

TRAIN = ("digest", "export", "export_merged", "load", "offload", "onload", "probe_adapter", "save", "score",
         "score_teacher", "train", "warmup")


class RecordingService:
    """Answers any method with its name, arguments and the thread it ran on."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def method(*args: Any, **kwargs: Any) -> dict[str, Any]:
            return {"name": name, "args": args, "kwargs": kwargs, "thread": threading.get_ident()}

        return method


class AsyncRecordingService:
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        async def method(*args: Any, **kwargs: Any) -> dict[str, Any]:
            return {"name": name, "args": args, "kwargs": kwargs}

        return method


def test_the_protocols_name_the_methods_every_transport_forwards() -> None:
    assert protocol_methods(TrainSide) == TRAIN
    assert "collect" in protocol_methods(RolloutSide) and "score_adapter" in protocol_methods(RolloutSide)
    for cls in (LocalTrainer, GroupTrainer, TrainRank):
        assert all(callable(vars(cls).get(name)) for name in TRAIN), cls
    assert all(asyncio.iscoroutinefunction(vars(RolloutActor)[name])
               for name in (*protocol_methods(RolloutSide), "active_requests"))


def test_the_local_trainer_runs_each_method_of_the_service_in_a_worker_thread() -> None:
    side = LocalTrainer(RecordingService())  # type: ignore[arg-type]

    async def calls() -> list[dict[str, Any]]:
        return [await side.train("batch", 3), await side.warmup(), await side.probe_adapter("f", [[1, 2]], seed=7),
                await side.push(2, [], flush=False, exact=True)]

    train, warmup, probe, push = asyncio.run(calls())
    assert (train["name"], train["args"]) == ("train", ("batch", 3))
    assert (warmup["name"], warmup["args"]) == ("warmup", ())
    assert (probe["args"], probe["kwargs"]) == (("f", [[1, 2]]), {"seed": 7})
    assert (push["name"], push["args"], push["kwargs"]) == ("push_weights", (2, []), {"flush": False, "exact": True})
    assert train["thread"] != threading.get_ident()
    with pytest.raises(AttributeError):
        side.no_such_method  # noqa: B018


def test_a_train_rank_and_the_rollout_actor_hand_calls_to_their_service() -> None:
    rank = TrainRank.__new__(TrainRank)
    rank.service = RecordingService()  # type: ignore[assignment]
    out = rank.push_weights(4, ["t"], flush=True, exact=False)
    assert (out["name"], out["args"], out["kwargs"]) == ("push_weights", (4, ["t"]), {"flush": True, "exact": False})
    assert rank.export("folder")["args"] == ("folder",)
    actor = RolloutActor.__new__(RolloutActor)
    actor.service = AsyncRecordingService()  # type: ignore[assignment]
    got = asyncio.run(actor.evals_due(3, final=True))
    assert (got["name"], got["args"], got["kwargs"]) == ("evals_due", (3,), {"final": True})


def test_the_run_plan_is_frozen_and_runs_the_warmup_only_on_a_fresh_training_run(tmp_path: Path) -> None:
    raw = fake_run_config(tmp_path, steps=2).to_dict()
    config = RunConfig.from_dict({**raw, "warmup": {"data": str(tmp_path / "warm.jsonl"), "steps": 1}})
    run_dir = RunDirectory(config.run_dir(), config_hash=config.hash())
    plan = plan_run(config, dict, run_dir, callbacks=[])
    assert plan.warmup_dir == str(run_dir.root) and plan.resume is None and not plan.rollout_only
    assert plan.settings.steps == 2 and plan.callbacks == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.resume = "x"  # type: ignore[misc]
    assert plan_run(config, dict, run_dir, resume="ckpt").warmup_dir is None  # the checkpoint holds it
    rollout = plan_run(config, dict, run_dir, rollout_only=True)
    assert rollout.rollout_only and rollout.warmup_dir is None
