"""Rewards off the event loop, with deadlines, and the reward-failure policy, on the scheduler with the
fake engine: a CPU-bound reward that never returns runs in a worker process that is killed at the
deadline; the other episodes finish; the step report shows the one timeout; nothing is resampled."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.data import DataSource
from agentrl.environments import ToyArithmeticEnv, make_arithmetic_rows
from agentrl.rewards import RewardTimeout, score, shared_pool
from agentrl.rollout import AgentConfig, SamplingParams
from agentrl.rollout.scheduler import Scheduler, SchedulerConfig
from agentrl.runner.envs import EnvFactory
from agentrl.testing.policy import FakePolicyClient, PolicyRequest
from agentrl.testing.rewards import SpinForever
from agentrl.trajectory import ErrorKind

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 1.0


def _answer(req: PolicyRequest) -> str:
    return "The answer is \\boxed{0}.<|im_end|>"


def _question(index: int) -> str:
    return str(make_arithmetic_rows(8, seed=0)[index]["question"])


def _scheduler(tok: Any, reward: Any, *, policy: str = "zero") -> Scheduler:
    rows = make_arithmetic_rows(8, seed=0)
    agent = AgentConfig(sampling=SamplingParams(max_new_tokens=32), reward_timeout_s=TIMEOUT_S,
                        reward_failure=policy)
    sched = Scheduler(EnvFactory(ToyArithmeticEnv, {}, reward), ChatTemplate.from_name("qwen3", tokenizer=tok),
                      FakePolicyClient(tok, _answer), DataSource.from_rows(rows, shuffle=False),
                      SchedulerConfig(groups_per_step=4, group_size=4), agent=agent)
    return sched


async def test_a_reward_that_never_returns_is_killed_at_its_deadline_and_scored_zero(tok: Any) -> None:
    await asyncio.to_thread(shared_pool().warm)
    sched = _scheduler(tok, SpinForever(_question(0)))
    t0 = time.perf_counter()
    batch = await sched.collect()
    wall = time.perf_counter() - t0
    report = batch.report
    report.check()
    assert report.trained == 4 and not report.failed and report.members_regenerated == 0
    assert report.errors == {"reward_timeout": 1}                      # the one, and only it
    [hung] = [ep for g in batch.groups for ep in g.episodes if ep.trajectory.errors]
    assert hung.trajectory.sample_id.endswith(":0") and hung.reward == 0.0
    assert hung.trajectory.errors[0].kind is ErrorKind.REWARD_TIMEOUT
    assert TIMEOUT_S <= hung.trajectory.metrics["time/reward_s"] <= TIMEOUT_S + 1.0  # the deadline holds
    assert all(ep.reward is not None for g in batch.groups for ep in g.episodes)
    assert wall < TIMEOUT_S + 10
    assert shared_pool().timeouts >= 1
    assert await score(lambda t: 1.0, None) is not None  # the pool's worker was replaced: it serves on


async def test_drop_group_policy_fails_the_group_and_resamples_nothing(tok: Any) -> None:
    sched = _scheduler(tok, SpinForever(_question(0)), policy="drop_group")
    batch = await sched.collect()
    report = batch.report
    report.check()
    assert report.failed == {"reward_timeout": 1} and report.trained == 4
    assert report.members_regenerated == 0 and report.drawn == 5       # one more prompt replaced the dropped group


async def test_a_method_reward_runs_in_a_thread_and_only_the_wait_ends_at_the_deadline() -> None:
    release = threading.Event()
    loop_turns = 0

    class Env:
        def reward(self, trajectory: Any) -> float:  # a bound method: never sent to a process
            release.wait(30)
            return 1.0

    async def ticker() -> None:
        nonlocal loop_turns
        while not release.is_set():
            loop_turns += 1
            await asyncio.sleep(0.01)

    ticking = asyncio.ensure_future(ticker())
    t0 = time.perf_counter()
    with pytest.raises(RewardTimeout, match=r"Env.reward ran past its deadline of 0.5 s"):
        await score(Env().reward, object(), timeout_s=0.5, pool=shared_pool())
    assert 0.5 <= time.perf_counter() - t0 < 10  # cut at the deadline: the reward itself waits 30 s
    release.set()
    await ticking
    assert loop_turns >= 5  # the event loop kept running while the reward waited (about 50 turns; blocked: 1)

