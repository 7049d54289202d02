"""A run whose environment or reward fails every time stops early and says where: N prompt groups in a
row failing with the same error of the code under training (``max_consecutive_failed_groups``) raise
:class:`RepeatedFailureError` with the first error's message and ``file:line``; failures of the
infrastructure (``ErrorKind.infrastructure``) never count, and one usable group ends the streak."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agentrl.chat import ChatTemplate, Message
from agentrl.data import DataSource
from agentrl.environments import ToyArithmeticEnv, make_arithmetic_rows
from agentrl.episode import Episode
from agentrl.rollout import AgentConfig, InferenceError, SamplingParams
from agentrl.rollout._step import FailureStreak, Member, PendingGroup
from agentrl.rollout.scheduler import RepeatedFailureError, Scheduler, SchedulerConfig
from agentrl.runner import RunCallback
from agentrl.testing.policy import FakePolicyClient
from agentrl.testing.runner import build_fake_runner, fake_run_config
from agentrl.trajectory import EpisodeError, ErrorKind, Trajectory

HERE = "tests/unit/rollout/test_repeated_failures.py"
ANSWER = "The answer is \\boxed{1}.<|im_end|>"


@pytest.fixture(scope="module")
def template(tok: Any) -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=tok)


def scheduler(template: ChatTemplate, client: Any, env: Any, rows: int, **cfg: Any) -> Scheduler:
    source = DataSource.from_rows(make_arithmetic_rows(rows, seed=0), seed=0)
    return Scheduler(env, template, client, source, SchedulerConfig(**cfg),
                     agent=AgentConfig(sampling=SamplingParams(max_new_tokens=16), reward_pool=False))


class ResetRaises(ToyArithmeticEnv):
    tried: ClassVar[set[str]] = set()

    async def reset(self) -> list[Message]:
        ResetRaises.tried.add(self.task.question)
        raise KeyError("question_text")  # the line the error names


async def test_an_environment_whose_reset_always_raises_stops_within_n_groups(tok: Any, template: ChatTemplate) -> None:
    """2,000 rows: the run stops after 5 failing groups (and the ones in flight), not after the data set."""
    ResetRaises.tried = set()
    sched = scheduler(template, FakePolicyClient(tok, lambda r: ANSWER), ResetRaises, 2000, groups_per_step=4,
                      group_size=2, member_retries=1, max_consecutive_failed_groups=5)
    with pytest.raises(RepeatedFailureError) as info:
        await sched.collect()
    error = info.value.error
    assert (error.kind, error.component, error.message) == (ErrorKind.ENV, "reset", "KeyError: 'question_text'")
    assert error.origin == f"{HERE}:46 in ResetRaises.reset"
    text = str(info.value)
    assert text.startswith("5 prompt groups in a row failed with the same env error (max_consecutive_failed_groups=5)")
    assert f"at {HERE}:46 in ResetRaises.reset" in text and 'raise KeyError("question_text")' in text
    assert len(ResetRaises.tried) <= 5 + 4  # the streak, plus the groups of the step still in flight
    await sched.shutdown()


class StringReward(ToyArithmeticEnv):
    def reward(self, trajectory: Trajectory) -> Any:
        return "yes"


@pytest.mark.parametrize("policy", ["zero", "drop_group"])
async def test_a_reward_that_returns_a_string_stops_naming_the_value_its_type_and_where(
        tok: Any, template: ChatTemplate, policy: str) -> None:
    """Scored 0.0 (accepted, every advantage zero) or dropped: either way the streak stops the run,
    across steps (2 groups a step, 3 in a row)."""
    source = DataSource.from_rows(make_arithmetic_rows(40, seed=0), seed=0)
    sched = Scheduler(StringReward, template, FakePolicyClient(tok, lambda r: ANSWER), source,
                      SchedulerConfig(groups_per_step=2, group_size=2, max_consecutive_failed_groups=3),
                      agent=AgentConfig(sampling=SamplingParams(max_new_tokens=16), reward_pool=False,
                                        reward_failure=policy))
    with pytest.raises(RepeatedFailureError) as info:
        for _ in range(3):
            await sched.collect()
    assert sched.steps == (2 if policy == "zero" else 1)  # zero: step 1 was handed over, step 2 stopped
    text = str(info.value)
    assert "reward: RewardValueError: StringReward.reward result: expected a float or Reward, got str: 'yes'" in text
    assert f"at {HERE}:67 in StringReward.reward" in text
    await sched.shutdown()


async def test_engine_failures_never_count(tok: Any, template: ChatTemplate) -> None:
    """Every request fails on the engine: groups fail (engine_error) until the data runs out, no stop."""

    class Down(FakePolicyClient):
        async def generate(self, *args: Any, **kwargs: Any) -> Any:
            raise InferenceError("connection refused")

    sched = scheduler(template, Down(tok, lambda r: ANSWER), ToyArithmeticEnv, 8, groups_per_step=4, group_size=2,
                      member_retries=0, max_consecutive_failed_groups=2)
    batch = await sched.collect()
    assert batch.report.data_exhausted and batch.report.failed == {"engine_error": 8} and not batch.groups


def member(error: EpisodeError | None = None, *, usable: bool = False) -> Member:
    if usable:
        traj = Trajectory.from_prompt([1, 2, 3])
        traj.reward = 1.0
        return Member(episode=Episode(sequences=[traj]))
    return Member(lost="env_error: x", error=error)


def group(*members: Member) -> PendingGroup:
    return PendingGroup(group_id="g", row=None, members=list(members))  # type: ignore[arg-type]


def test_the_streak_counts_only_the_same_code_failure_in_a_row() -> None:
    here = EpisodeError(ErrorKind.ENV, "KeyError: 'a'", component="reset", origin="env.py:3 in reset")
    same_place = EpisodeError(ErrorKind.ENV, "KeyError: 'b'", component="reset", origin="env.py:3 in reset")
    elsewhere = EpisodeError(ErrorKind.REWARD, "ValueError: x", component="reward", origin="env.py:9 in reward")
    engine = EpisodeError(ErrorKind.ENGINE, "down", component="generate")
    streak = FailureStreak(3)
    streak.add(group(member(here), member(here)))
    streak.add(group(member(engine), member(engine)))  # infrastructure: leaves the streak as it is
    streak.add(group(member(elsewhere), member(elsewhere)))  # another error: a new streak of 1
    streak.add(group(member(same_place), member(here)))
    assert (streak.groups, streak.first) == (1, same_place)
    streak.add(group(member(here), member(usable=True)))  # one usable episode: the group is fine
    assert streak.groups == 0
    streak.add(group(member(here), member(here)))
    streak.add(group(member(same_place), member(here)))  # the same place, another message: the same error
    with pytest.raises(RepeatedFailureError) as info:
        streak.add(group(member(here), member(engine)))
    assert info.value.error is here and info.value.groups == 3
    FailureStreak(None).add(group(member(here)))  # None: never stops


def test_only_the_engine_and_the_sandbox_fleet_are_infrastructure() -> None:
    assert {k for k in ErrorKind if k.infrastructure} == {ErrorKind.ENGINE, ErrorKind.ENGINE_OUTPUT,
                                                          ErrorKind.SANDBOX_UNAVAILABLE, ErrorKind.EXECUTOR_LOST}


def string_reward(trajectory: Any, task: Any) -> Any:
    return "yes"


class Notices(RunCallback):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_notice(self, text: str) -> None:
        self.seen.append(text)


async def test_a_training_run_with_a_string_reward_stops_and_says_why(tmp_path: Path) -> None:
    """`train --reward` returning a string: the first step tells the error with its place, the streak
    stops the run, and summary.json holds why."""
    notices = Notices()
    config = fake_run_config(tmp_path, steps=5, rows=12, scheduler_options={"max_consecutive_failed_groups": 3})
    runner, _ = build_fake_runner(config, reward=string_reward, callbacks=[notices])
    with pytest.raises(RepeatedFailureError, match=r"got str: 'yes'"):
        await runner.run()
    where = f"at {HERE}:{string_reward.__code__.co_firstlineno} in string_reward"  # where it is defined
    assert any(n.startswith("step 1: first reward error (4 this step): reward: RewardValueError:") and where in n
               for n in notices.seen), notices.seen
    assert "step 1 changed no weight: the reward failed on every episode (4; scored 0.0, its first error told " \
           "above)" in notices.seen
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped_because"].startswith("3 prompt groups in a row failed with the same reward error")
    assert where in summary["stopped_because"] and where in summary["error_examples"]["reward"]
