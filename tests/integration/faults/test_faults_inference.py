"""Faults between the rollout and its engine, on the session's real CPU SGLang engine (tiny Qwen3) and
the real sglang-router, with a fault proxy (``_fault_proxy``) injecting what goes wrong on the wire:

- the router answers 5xx, drops connections and loses answers on the way back: retried, the steps
  fill, no prompt lost or trained twice;
- an engine that accepts requests and never answers: each such request ends at its deadline as a
  failure naming the deadline, its member is regenerated, the step fills in bounded time; when
  every request stalls the step ends with every prompt counted as failed, in bounded time;
- a prompt longer than the context: HTTP 400, one request reached the engine, never retried;
- a weight sync that fails on one engine: that engine is named and taken out of the router's
  rotation, the other serves the new version, the next step trains on it.

Every case has a deadline (``pytest.mark.timeout`` for the test, ``asyncio.wait_for`` for each step).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _accounting import check_steps, recording_rows
from _fault_proxy import CUT, PASS, RESET, STALL, FaultProxy, Status

from agentrl.chat import ChatTemplate
from agentrl.environments import ToyArithmeticEnv, make_arithmetic_rows
from agentrl.rollout import (
    AgentConfig,
    ClientConfig,
    EngineGroup,
    InferenceClient,
    PromptTooLongError,
    RouterConfig,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SGLangEngine,
)
from agentrl.rollout.eval import EvalConfig
from agentrl.rollout.scheduler import StepBatch
from agentrl.runner.weights import DiskWeightSync, WeightSyncConfig
from agentrl.testing import build_tiny_model, build_tokenizer
from agentrl.trajectory import ErrorKind
from agentrl.trajectory import Status as EpisodeStatus

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

CONTEXT = 1024  # the shared engine's
SAMPLING = SamplingParams(max_new_tokens=16, temperature=1.0)
STEP_DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(shared_engine: str) -> SGLangEngine:
    return await SGLangEngine.attach(shared_engine)


def make_scheduler(template: ChatTemplate, client: Any, source: Any, **cfg: Any) -> Scheduler:
    settings = {"groups_per_step": 2, "group_size": 2, **cfg}
    return Scheduler(ToyArithmeticEnv, template, client, source, SchedulerConfig(**settings),
                     agent=AgentConfig(sampling=SAMPLING, context_length=CONTEXT))


async def collect(sched: Scheduler) -> StepBatch:
    return await asyncio.wait_for(sched.collect(), STEP_DEADLINE_S)


def cycle(faults: dict[int, Any], period: int = 6) -> Any:
    """A rule for ``/generate``: request ``i`` gets ``faults[i % period]``, or passes (half of them fail
    with ``period=6`` and three faults; a retry is a new request, so it meets the next one)."""

    def rule(path: str, index: int) -> Any:
        return faults.get(index % period, PASS) if path == "/generate" else PASS

    return rule


def engine_errors(episode: Any) -> list[str]:
    """The messages of the episode's typed engine errors."""
    return [e.message for e in episode.trajectory.errors if e.kind is ErrorKind.ENGINE]


async def test_router_5xx_and_dropped_connections_lose_no_prompt(shared_engine: str, engine: SGLangEngine,
                                                                 template: ChatTemplate) -> None:
    group = await EngineGroup.attach([shared_engine], RouterConfig())
    try:
        async with FaultProxy(group.router.url, cycle({0: Status(503), 2: RESET, 4: CUT})) as proxy:
            config = ClientConfig(base_url=proxy.url, via_router=True, max_retries=8, backoff_initial_s=0.05,
                                  backoff_max_s=0.5)
            async with InferenceClient(config, control_urls=group.engine_urls) as client:
                source = recording_rows(make_arithmetic_rows(24, seed=2), seed=2)
                sched = make_scheduler(template, client, source)
                batches = [await collect(sched) for _ in range(3)]
                left = await engine.active_requests()
                await sched.shutdown()
    finally:
        await group.shutdown()
    print(f"\nfault proxy in front of the router: {dict(proxy.actions)}; requests that reached the router "
          f"{proxy.forwarded['/generate']}; regenerated members {[b.report.members_regenerated for b in batches]}")
    assert proxy.actions["status 503"] > 0 and proxy.actions[RESET] > 0 and proxy.actions[CUT] > 0
    assert [b.report.trained for b in batches] == [2, 2, 2]
    assert all(not b.report.failed for b in batches)  # every fault was retried away
    check_steps(source, [b.report for b in batches], [[g.prompt_id for g in b.groups] for b in batches],
                sched.buffered_prompt_ids())
    assert all(ep.status.terminal and ep.status is not EpisodeStatus.FAILED for b in batches for ep in b.episodes())
    assert left == 0


async def test_a_stalled_engine_fails_requests_at_their_deadline_and_the_step_goes_on(
        shared_engine: str, engine: SGLangEngine, template: ChatTemplate) -> None:
    stalled = {0, 1, 3}  # the first requests stall: the step must still fill

    def rule(path: str, index: int) -> Any:
        return STALL if path == "/generate" and index in stalled else PASS

    async with FaultProxy(shared_engine, rule) as proxy:
        config = ClientConfig(base_url=proxy.url, deadline_s=3.0, abort_grace_s=0.5, max_retries=0)
        async with InferenceClient(config) as client:
            source = recording_rows(make_arithmetic_rows(16, seed=3), seed=3)
            sched = make_scheduler(template, client, source, member_retries=2)
            started = time.monotonic()
            batch = await collect(sched)
            took = time.monotonic() - started
            await sched.shutdown()
    print(f"\nstalled requests: {proxy.actions[STALL]}; step took {took:.1f} s; "
          f"regenerated {batch.report.members_regenerated}")
    assert proxy.actions[STALL] == len(stalled)
    assert batch.report.trained == 2 and not batch.report.failed
    assert batch.report.members_regenerated >= len(stalled)  # each stalled member was regenerated once
    assert took < 3.0 + 0.5 + 60  # the deadline, its grace, and the regenerated turns
    check_steps(source, [batch.report], [[g.prompt_id for g in batch.groups]], sched.buffered_prompt_ids())


async def test_an_engine_that_never_answers_ends_each_episode_with_a_deadline_failure(
        shared_engine: str, template: ChatTemplate) -> None:
    async with FaultProxy(shared_engine, lambda path, index: STALL if path == "/generate" else PASS) as proxy:
        config = ClientConfig(base_url=proxy.url, deadline_s=1.5, abort_grace_s=0.5, max_retries=2)
        async with InferenceClient(config) as client:
            rows = make_arithmetic_rows(3, seed=4)
            sched = make_scheduler(template, client, recording_rows(rows))
            started = time.monotonic()
            report = await asyncio.wait_for(sched.evaluate(rows, EvalConfig(samples_per_prompt=2, pass_k=(1,))), 30)
            took = time.monotonic() - started
            source = recording_rows(make_arithmetic_rows(4, seed=5))
            failed_step = make_scheduler(template, client, source, member_retries=1)
            batch = await collect(failed_step)
    assert took < 1.5 + 0.5 + 10
    assert len(report.episodes) == 6
    for ep in report.episodes:
        assert ep.status is EpisodeStatus.FAILED
        assert any("deadline of 1.5 s exceeded" in m for m in engine_errors(ep)), ep.trajectory.errors
    # a whole step on an engine that never answers: every prompt is counted as failed, nothing trained
    assert batch.groups == [] and batch.report.data_exhausted
    assert sum(batch.report.failed.values()) == 4 and batch.report.members_regenerated == 4 * 2
    check_steps(source, [batch.report], [[]], failed_step.buffered_prompt_ids())


async def test_a_prompt_longer_than_the_context_is_rejected_once_and_never_retried(shared_engine: str) -> None:
    async with FaultProxy(shared_engine) as proxy:
        async with InferenceClient(ClientConfig(base_url=proxy.url, max_retries=5)) as client:
            started = time.monotonic()
            with pytest.raises(PromptTooLongError, match="context length") as info:
                await asyncio.wait_for(client.generate([5] * (CONTEXT + 10), SamplingParams(max_new_tokens=4)), 30)
            took = time.monotonic() - started
    print(f"\ntoo-long prompt: {info.value} ({took:.2f} s)")
    assert proxy.forwarded["/generate"] == 1 and proxy.seen["/generate"] == 1
    assert info.value.status == 400 and took < 5.0


async def test_a_row_beyond_the_context_fails_its_group_once_and_the_step_goes_on(
        shared_engine: str, template: ChatTemplate) -> None:
    # the agent is not told the context, so the engine is the one to refuse the prompt (HTTP 400)
    rows = make_arithmetic_rows(8, seed=8)
    rows[0]["question"] = "What is 3 * 4? " + "far too long " * 600
    async with FaultProxy(shared_engine) as proxy:
        async with InferenceClient(ClientConfig(base_url=proxy.url, max_retries=5)) as client:
            source = recording_rows(rows, shuffle=False)
            sched = Scheduler(ToyArithmeticEnv, template, client, source,
                              SchedulerConfig(groups_per_step=2, group_size=2, member_retries=2),
                              agent=AgentConfig(sampling=SAMPLING, context_length=None))
            batch = await collect(sched)
            await sched.shutdown()
    report = batch.report
    print(f"\nrow beyond the context: failed {report.failed}, {report.failure_examples}; engine answers "
          f"{dict(proxy.statuses)}")
    assert report.trained == 2 and report.failed == {"prompt_too_long": 1}
    assert proxy.statuses[400] == 2  # one request per member, never retried nor regenerated
    assert "prompt 1: sample 1:" in report.failure_examples["prompt_too_long"]
    assert "context length" in report.failure_examples["prompt_too_long"]  # the engine's own words
    check_steps(source, [report], [[g.prompt_id for g in batch.groups]], sched.buffered_prompt_ids())


async def test_a_weight_sync_failing_on_one_engine_takes_it_out_and_the_run_goes_on(
        shared_engine: str, engine: SGLangEngine, template: ChatTemplate, tmp_path: Path) -> None:
    # two URLs to the one CPU engine: the second through a proxy that fails every weight load with a 500,
    # as an engine whose load breaks would; the router serves both until the sync takes the second out
    def rule(path: str, index: int) -> Any:
        return Status(500) if path == "/update_weights_from_disk" else PASS

    seed1 = build_tiny_model(seed=1)
    async with FaultProxy(shared_engine, rule) as proxy:
        group = await EngineGroup.attach([shared_engine, proxy.url], RouterConfig())
        try:
            sync = DiskWeightSync(group.engines, tmp_path / "weights", WeightSyncConfig(retries=1, retry_delay_s=0.1),
                                  on_remove=group.take_out)
            report = await asyncio.wait_for(sync.sync(1, lambda folder: shutil.copytree(seed1, folder, dirs_exist_ok=True)), 120)
            workers = {w["url"] for w in await group.router.workers()}
            async with group.client(max_retries=4) as client:
                source = recording_rows(make_arithmetic_rows(12, seed=6), seed=6)
                sched = make_scheduler(template, client, source)
                sched.set_policy_version(1)
                batch = await collect(sched)
                await sched.shutdown()
        finally:
            await group.shutdown()
            await engine.update_weights_from_disk(build_tiny_model(seed=0), "default")
    print(f"\nsync with one failing engine: updated {report.engines_updated}, removed {report.engines_removed}, "
          f"failures {report.failures}")
    assert report.engines_updated == (shared_engine,) and report.engines_removed == (proxy.url,)
    assert any(proxy.url in f and "500" in f for f in report.failures), report.failures
    assert proxy.seen["/update_weights_from_disk"] == 2  # tried, retried once, then taken out
    assert workers == {shared_engine}
    assert batch.report.trained == 2 and set(batch.report.weight_versions) == {"1"}
    check_steps(source, [batch.report], [[g.prompt_id for g in batch.groups]], sched.buffered_prompt_ids())
