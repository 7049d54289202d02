"""``Agent(run, reward)``: a harness run per group member by the scheduler, bounded and timed, its
failures typed, its aborts held and resumed; named like an environment by the one resolver and
checked by ``agentrl env check``."""

from __future__ import annotations

import asyncio
import pickle
import sys
import textwrap
from pathlib import Path
from typing import Any

import openai
import pytest
from _proxy_support import ADD, call_then_answer
from typer.testing import CliRunner

from agentrl.chat import ChatTemplate
from agentrl.cli import app
from agentrl.data import DataSource
from agentrl.environments.registry import RegistryError, resolve
from agentrl.proxy import Agent, AgentRunner
from agentrl.rollout import AgentConfig, SamplingParams, Scheduler, SchedulerConfig
from agentrl.rollout._step import lost_reason
from agentrl.rollout.eval import EvalConfig, evaluate
from agentrl.testing.policy import FakePolicyClient
from agentrl.train import build_training_batch
from agentrl.trajectory import ErrorKind, SegmentKind, Status

REPO = Path(__file__).resolve().parents[3]
CONFIG = AgentConfig(sampling=SamplingParams(max_new_tokens=64), reward_pool=False)


async def calculator_run(task: dict[str, Any], client: openai.AsyncOpenAI) -> str | None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["q"]}]
    for _ in range(3):
        reply = await client.chat.completions.create(model="agentrl", messages=messages, tools=[ADD])
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "3"} for c in message.tool_calls]
    return None


def answer_reward(task: dict[str, Any], answer: Any) -> float:
    return float("3" in str(answer))


def runner(agent: Agent, template: ChatTemplate, client: Any, row: dict[str, Any] | None = None) -> AgentRunner:
    return AgentRunner(agent(row or {"q": "1+2?"}), template, client, CONFIG, group_id="g", sample_id="p:0")


async def test_the_scheduler_runs_an_agent_per_member_and_the_batch_trains(template: ChatTemplate) -> None:
    agent = Agent(calculator_run, answer_reward)
    client = FakePolicyClient(template.tokenizer, call_then_answer, token_delay_s=0.0005)
    data = DataSource.from_rows([{"q": f"{i} + 2?"} for i in range(4)])
    scheduler = Scheduler(agent, template, client, data, SchedulerConfig(groups_per_step=2, group_size=3), agent=CONFIG)
    batch = await scheduler.collect()
    episodes = batch.episodes()
    assert len(episodes) == 6 and {e.status for e in episodes} == {Status.COMPLETED}
    assert [e.reward for e in episodes] == [1.0] * 6 and all(e.trajectory.info["answer"] == "The answer is 3."
                                                               for e in episodes)
    assert {len({e.trajectory.group_id for e in g.episodes}) for g in batch.groups} == {1}
    training = build_training_batch(episodes)
    assert training is not None
    await scheduler.shutdown()
    assert agent._hosts == {}  # the server stopped with its last episode
    report = await evaluate(agent, template, client, [{"q": "1+2?"}], EvalConfig(samples_per_prompt=2), agent=CONFIG)
    assert report.mean_reward == 1.0 and report.samples == 2


async def test_a_plain_function_runs_in_a_thread_with_a_sync_client(template: ChatTemplate) -> None:
    def sync_run(task: dict[str, Any], client: openai.OpenAI) -> str | None:
        reply = client.chat.completions.create(model="agentrl", messages=[{"role": "user", "content": task["q"]}])
        return reply.choices[0].message.content

    agent = Agent(sync_run, answer_reward)
    run = runner(agent, template, FakePolicyClient(template.tokenizer, lambda r: "It is 3.<|im_end|>"))
    try:
        episode = await run.advance()
    finally:
        await run.close()
    assert episode is not None and episode.reward == 1.0 and episode.trajectory.info["answer"] == "It is 3."


@pytest.mark.parametrize(("run", "kind", "says"), [
    (lambda: _raises, ErrorKind.AGENT, "run() raised ValueError: the harness broke"),
    (lambda: _sleeps, ErrorKind.AGENT_TIMEOUT, "deadline of 0.3 s"),
    (lambda: _silent, ErrorKind.AGENT, "without calling the model"),
])
async def test_harness_failures_are_typed_errors_and_the_episode_is_lost(template: ChatTemplate, run: Any,
                                                                         kind: ErrorKind, says: str) -> None:
    agent = Agent(run(), answer_reward, timeout_s=0.3)
    r = runner(agent, template, FakePolicyClient(template.tokenizer, call_then_answer))
    try:
        episode = await asyncio.wait_for(r.advance(), 5)
    finally:
        await r.close()
    assert episode is not None and episode.status is Status.FAILED
    error = episode.trajectory.error_of(kind)
    assert error is not None and says in error.message
    assert lost_reason(episode) == f"{kind.value}_error" and episode.reward is None
    episode.validate()


async def _raises(task: Any, client: openai.AsyncOpenAI) -> None:
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    raise ValueError("the harness broke")


async def _sleeps(task: Any, client: openai.AsyncOpenAI) -> None:
    await asyncio.sleep(30)


async def _silent(task: Any, client: openai.AsyncOpenAI) -> str:
    return "no model needed"


async def test_a_call_after_the_episode_ended_is_refused_and_recorded(template: ChatTemplate) -> None:
    leaked: list[Any] = []

    async def leaky(task: Any, client: openai.AsyncOpenAI) -> str:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

        url, key = str(client.base_url), client.api_key

        async def later() -> None:  # a task the harness left behind, with a client of its own
            await asyncio.sleep(0.05)
            async with openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0) as own:
                try:
                    await own.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}])
                except openai.APIStatusError as exc:
                    leaked.append(exc.status_code)

        leaked.append(asyncio.get_running_loop().create_task(later()))
        return "3"

    r = runner(Agent(leaky, answer_reward), template, FakePolicyClient(template.tokenizer, call_then_answer))
    try:
        episode = await r.advance()
        await asyncio.wait_for(leaked[0], 30)  # the left-behind task has made its call
    finally:
        await r.close()
    assert episode is not None and episode.status is Status.COMPLETED and leaked[1:] == [410]
    assert [e.kind for e in episode.trajectory.errors] == [ErrorKind.AGENT_LATE_CALL]


async def test_at_most_max_concurrency_harnesses_run_at_once(template: ChatTemplate) -> None:
    active, peak = [0], [0]

    async def counted(task: Any, client: openai.AsyncOpenAI) -> str | None:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        try:
            return await calculator_run(task, client)
        finally:
            active[0] -= 1

    agent = Agent(counted, answer_reward, max_concurrency=2)
    client = FakePolicyClient(template.tokenizer, call_then_answer, token_delay_s=0.002)
    runners = [runner(agent, template, client) for _ in range(6)]
    episodes = await asyncio.gather(*(r.advance() for r in runners))
    for r in runners:
        await r.close()
    assert peak[0] == 2 and all(e is not None and e.reward == 1.0 for e in episodes)


async def test_an_abort_holds_the_request_and_a_resume_continues_the_same_turn(template: ChatTemplate) -> None:
    text = "one two three four five six seven eight nine ten"
    seen: list[str | None] = []

    async def once(task: Any, client: openai.AsyncOpenAI) -> str | None:
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "count"}])
        seen.append(reply.choices[0].message.content)
        return reply.choices[0].message.content

    client = FakePolicyClient(template.tokenizer, lambda r: text + "<|im_end|>", token_delay_s=0.02)
    r = runner(Agent(once, answer_reward), template, client)
    step_full = [False]

    async def fill_the_step() -> None:
        while not client.running:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.06)
        step_full[0] = True
        await client.abort_all()  # what the scheduler does to the step's requests

    filler = asyncio.ensure_future(fill_the_step())
    assert await r.advance(lambda: step_full[0]) is None  # suspended, the harness waiting on its request
    await filler
    assert r.suspensions == 1 and 0 < r.partial_turn_tokens and seen == []
    step_full[0] = False
    episode = await r.advance(lambda: step_full[0])  # the next step resumes it
    await r.close()
    assert episode is not None and seen == [text] and len(episode.sequences) == 1
    segments = episode.trajectory.segments_of(SegmentKind.MODEL)
    assert [s.finish_reason for s in segments] == ["abort", "stop"]


async def test_a_discarded_episode_cancels_its_harness(template: ChatTemplate) -> None:
    client = FakePolicyClient(template.tokenizer, lambda r: "x " * 30 + "<|im_end|>", token_delay_s=0.02)
    r = runner(Agent(calculator_run, answer_reward), template, client)

    flag = [False]

    async def abort_soon() -> None:
        while not client.running:
            await asyncio.sleep(0.005)
        flag[0] = True
        await client.abort_all()

    aborter = asyncio.ensure_future(abort_soon())
    assert await r.advance(lambda: flag[0]) is None
    await aborter
    episode = r.finish_aborted()
    await r.close()
    assert episode.status is Status.ABORTED and r._task is not None and r._task.done()


def test_an_agent_pickles_without_its_servers() -> None:
    agent = Agent(calculator_run, answer_reward, max_concurrency=3)
    copy = pickle.loads(pickle.dumps(agent))
    assert copy.max_concurrency == 3 and copy._hosts == {} and copy.proxy == agent.proxy


MODULE = textwrap.dedent('''
    from agentrl.proxy import Agent

    async def run(task, client):
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["q"]}])
        return reply.choices[0].message.content

    async def broken(task, client):
        raise RuntimeError("no luck")

    def reward(task, answer):
        return 1.0

    agent = Agent(run, reward)
    broken_agent = Agent(broken, reward)
''')


@pytest.fixture
def agent_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "my_agents.py").write_text(MODULE)
    (tmp_path / "rows.jsonl").write_text('{"q": "1+2?"}\n{"q": "2+2?"}\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_agents", None)


def test_the_one_resolver_names_an_agent_and_refuses_a_bare_run(agent_module: Path) -> None:
    assert isinstance(resolve("environment", "my_agents:agent", allow_import=True), Agent)
    with pytest.raises(RegistryError, match=r"wrapped: agent = agentrl.proxy.Agent\(run, reward\)"):
        resolve("environment", "my_agents:run", allow_import=True)


def test_env_check_runs_an_agent_and_reports_its_failures(agent_module: Path) -> None:
    ok = CliRunner().invoke(app, ["env", "check", "my_agents:agent", "--data", "rows.jsonl", "-v"])
    assert ok.exit_code == 0, ok.output
    assert "my_agents:agent: 2 rows, 2 episodes, 0 violation(s)" in ok.output  # named as on the command line
    # -v: each episode's conversation as the proxy recorded it, the answer, the reward
    assert "--- line 1, 1 sequence(s)\n    sequence 0:\n      user: 1+2?\n      assistant: The answer is" in ok.output
    assert "    reward:  1.0" in ok.output
    assert "warning: [reward_floor] every scripted episode (2) scored 1" in ok.output  # never told apart
    bad = CliRunner().invoke(app, ["env", "check", "my_agents:broken_agent", "--data", "rows.jsonl", "--rows", "1"])
    assert bad.exit_code == 1, bad.output
    assert "[exception] line 1: run() raised RuntimeError: no luck (at my_agents.py:9 in broken)" in bad.output


def test_env_check_runs_the_examples_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    for name in ("openai_agent", "smol_agent"):
        result = CliRunner().invoke(app, ["env", "check", f"examples.byo_agent:{name}", "--data",
                                          "examples/data/arithmetic.jsonl", "--rows", "1"])
        assert result.exit_code == 0, result.output


async def test_partial_rollout_buffers_a_cut_agent_and_the_next_step_finishes_it(template: ChatTemplate) -> None:
    agent = Agent(calculator_run, answer_reward)
    client = FakePolicyClient(template.tokenizer, call_then_answer,
                              token_delay_s=lambda r: 0.01 if "slow" in r.text else 0.0)
    data = DataSource.from_rows([{"q": "fast 1+2?"}, {"q": "slow 1+2?"}], shuffle=False)
    scheduler = Scheduler(agent, template, client, data, SchedulerConfig(
        groups_per_step=1, group_size=2, over_sampling=1.0, partial_rollout=True, min_group_size=2), agent=CONFIG)
    first = await scheduler.collect()
    assert [g.prompt_id for g in first.groups] == ["1"] and scheduler.buffered_groups == 1
    second = await scheduler.collect()
    assert second.report.from_buffer == 1 and [g.prompt_id for g in second.groups] == ["2"]
    episodes = second.episodes()
    assert [e.reward for e in episodes] == [1.0, 1.0] and all(e.status is Status.COMPLETED for e in episodes)
    assert all(len(e.sequences) == 1 and e.trajectory.num_model_turns >= 2 for e in episodes)
    await scheduler.shutdown()
    assert agent._hosts == {}
