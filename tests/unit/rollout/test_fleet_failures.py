"""A sandbox fleet's failures are the machinery's, not the environment's: a tool call (or a reward's
command) that meets :class:`ExecutorUnavailableError` / :class:`ExecutorLostError` ends the episode
with error ``sandbox_unavailable`` / ``executor_lost`` (never a tool message the model is trained on),
and the scheduler regenerates it as it does an engine failure: nothing lost, nothing counted twice,
no reward of zero trained on."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.chat import ChatTemplate, Message
from agentrl.data import DataSource
from agentrl.environments import Environment
from agentrl.rewards import Reward
from agentrl.rollout import AgentConfig, SamplingParams, run_episode
from agentrl.rollout._step import lost_reason
from agentrl.rollout.scheduler import RepeatedFailureError, Scheduler, SchedulerConfig
from agentrl.testing.policy import FakePolicyClient, PolicyRequest
from agentrl.tools import ToolResult
from agentrl.tools.fleet import ExecutorLostError, ExecutorUnavailableError
from agentrl.trajectory import ErrorKind, Status, Trajectory

pytestmark = pytest.mark.timeout(120)

AGENT = AgentConfig(sampling=SamplingParams(max_new_tokens=64))


class Faults:
    """Which calls fail, shared by every episode of a test: the first ``tool`` tool calls, the first
    ``reward`` reward commands."""

    def __init__(self, tool: int = 0, reward: int = 0, lost: bool = True) -> None:
        self.tool, self.reward, self.lost = tool, reward, lost
        self.tool_calls = 0
        self.rewards = 0

    def error(self, where: str) -> Exception:
        if self.lost:
            return ExecutorLostError(f"the executor on node n1 is gone ({where})", node="n1")
        return ExecutorUnavailableError(f"no room within the admission deadline ({where})",
                                        reason="admission_timeout")


class Probe:
    name = "probe"
    description = "Runs a probe in the sandbox."
    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self.parameters: dict[str, Any] = {"type": "object", "properties": {}, "required": []}

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    async def __call__(self, **arguments: Any) -> ToolResult:
        self.faults.tool_calls += 1
        if self.faults.tool_calls <= self.faults.tool:
            raise self.faults.error("tool")
        return ToolResult("probe ok")


class SandboxedEnv(Environment):
    """One tool call, then an answer; the reward 'runs a command' that may meet the fleet's failure."""

    def __init__(self, task: Any, faults: Faults) -> None:
        super().__init__(task)
        self.faults = faults
        self.register_tool(Probe(faults))

    async def reset(self) -> list[Message]:
        return [Message(role="user", content=f"Task {self.task['id']}: probe, then answer.")]

    async def reward(self, trajectory: Trajectory) -> Reward:
        self.faults.rewards += 1
        if self.faults.rewards <= self.faults.reward:
            raise self.faults.error("reward")
        return Reward(1.0)


def policy(req: PolicyRequest) -> str:
    if "<tool_response>" not in req.text:
        return f"<tool_call>\n{json.dumps({'name': 'probe', 'arguments': {}})}\n</tool_call><|im_end|>"
    return "Done.<|im_end|>"


async def test_a_lost_executor_ends_the_episode_with_a_machinery_error_not_a_tool_message(tok: Any) -> None:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    episode = await run_episode(SandboxedEnv({"id": 0}, Faults(tool=1)), template, FakePolicyClient(tok, policy), AGENT)
    traj = episode.trajectory
    assert traj.status is Status.FAILED and [e.kind for e in traj.errors] == [ErrorKind.EXECUTOR_LOST]
    assert not [m for m in traj.messages if m.role == "tool"]  # the model never saw it as a tool result
    assert traj.reward is None
    assert lost_reason(episode) == "executor_lost_error"
    busy = await run_episode(SandboxedEnv({"id": 1}, Faults(tool=1, lost=False)), template,
                             FakePolicyClient(tok, policy), AGENT)
    assert [e.kind for e in busy.trajectory.errors] == [ErrorKind.SANDBOX_UNAVAILABLE]
    assert lost_reason(busy) == "sandbox_unavailable_error"


async def test_a_reward_that_meets_the_fleets_failure_is_not_scored_zero(tok: Any) -> None:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=64), reward_failure="zero")
    episode = await run_episode(SandboxedEnv({"id": 0}, Faults(reward=1)), template, FakePolicyClient(tok, policy),
                                config)
    traj = episode.trajectory
    assert traj.reward is None  # reward_failure="zero" scores the reward's own bugs, never the machinery's
    assert [e.kind for e in traj.errors] == [ErrorKind.EXECUTOR_LOST]
    assert lost_reason(episode) == "executor_lost_error"


@pytest.mark.parametrize("where", ["tool", "reward"])
async def test_the_scheduler_regenerates_them_nothing_lost_nothing_twice(tok: Any, where: str) -> None:
    faults = Faults(**{where: 3})
    rows = [{"id": i} for i in range(8)]
    scheduler = Scheduler(lambda row: SandboxedEnv(row, faults), ChatTemplate.from_name("qwen3", tokenizer=tok),
                          FakePolicyClient(tok, policy), DataSource.from_rows(rows, shuffle=False),
                          SchedulerConfig(groups_per_step=4, group_size=2, member_retries=2), agent=AGENT)
    batch = await scheduler.collect()
    report = batch.report
    report.check()
    assert report.trained == 4 and report.failed == {} and report.members_regenerated == 3
    assert report.errors == {"executor_lost": 3}
    episodes = batch.episodes()
    assert len(episodes) == 8 and len({ep.trajectory.sample_id for ep in episodes}) == 8  # none twice
    assert all(ep.reward == 1.0 and not ep.trajectory.errors for ep in episodes)  # each trained one is clean


class BrokenStep(SandboxedEnv):
    async def step(self, reply: Message, failures: Any = ()) -> Any:
        raise ValueError("a bug in the environment")


@pytest.mark.parametrize("broken", ["fleet", "environment"])
async def test_only_the_environments_failures_count_towards_stopping_the_run(tok: Any, broken: str) -> None:
    """Every group fails; with the fleet failing (every tool call) the run goes on until the data runs out,
    with the environment failing (its step raises) the streak stops it at the limit."""
    faults = Faults(tool=10**6)
    factory = (lambda row: SandboxedEnv(row, faults)) if broken == "fleet" else (lambda row: BrokenStep(row, faults))
    scheduler = Scheduler(factory, ChatTemplate.from_name("qwen3", tokenizer=tok), FakePolicyClient(tok, policy),
                          DataSource.from_rows([{"id": i} for i in range(6)], shuffle=False, epochs=1),
                          SchedulerConfig(groups_per_step=2, group_size=2, member_retries=1,
                                          max_consecutive_failed_groups=2), agent=AGENT)
    if broken == "environment":
        with pytest.raises(RepeatedFailureError, match="a bug in the environment"):
            await scheduler.collect()
        return
    batch = await scheduler.collect()
    assert batch.report.data_exhausted and batch.report.trained == 0
    assert batch.report.failed == {"executor_lost_error": 6}  # all six groups, none stopped the run
