"""An engine killed (SIGKILL) in the middle of a rollout step: the real sglang-router over the session's
CPU SGLang engine and one more engine of this module's own (the smallest config: its KV pool
holds 2,048 tokens), the agentrl health monitor, ``ToyArithmeticEnv`` on the tiny Qwen3.

Expected: the monitor takes the dead engine out of rotation, the requests that were on it are retried
on the survivor (or come back as failures and their members are regenerated), the step fills, the
next step runs on what remains, and no prompt is lost or trained twice. Deadline: each step 180 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from _accounting import check_steps, recording_rows

from agentrl.chat import ChatTemplate
from agentrl.environments import ToyArithmeticEnv, make_arithmetic_rows
from agentrl.rollout import (
    AgentConfig,
    EngineConfig,
    EngineGroup,
    HealthConfig,
    RouterConfig,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SGLangEngine,
)
from agentrl.testing import build_tiny_model, build_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(600)]

SAMPLING = SamplingParams(max_new_tokens=48, temperature=1.0)


@pytest_asyncio.fixture(loop_scope="module")
async def group(shared_engine: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EngineGroup]:
    g = await EngineGroup.attach([shared_engine], RouterConfig(),
                                 HealthConfig(check_interval_s=0.3, http_checks=False, restart=False))
    config = EngineConfig(model_path=str(build_tiny_model()), device="cpu", dtype="float32", context_length=1024,
                          max_total_tokens=2048, random_seed=1, startup_timeout_s=600,
                          log_dir=tmp_path_factory.mktemp("victim-engine"), env={"OMP_NUM_THREADS": "1"})
    try:
        victim = await SGLangEngine.launch(config)
        await g.add_engine(victim)
        g.start_monitor()
        yield g
    finally:
        await g.shutdown()


async def test_an_engine_killed_mid_step_loses_no_prompt_and_the_run_goes_on(group: EngineGroup,
                                                                            shared_engine: str) -> None:
    victim = next(e for e in group.engines if e.url != shared_engine)
    assert victim.process is not None
    template = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
    source = recording_rows(make_arithmetic_rows(32, seed=7), seed=7)
    async with group.client(max_retries=8, backoff_initial_s=0.2, backoff_max_s=1.0) as client:
        sched = Scheduler(ToyArithmeticEnv, template, client, source,
                          SchedulerConfig(groups_per_step=4, group_size=2, member_retries=3),
                          agent=AgentConfig(sampling=SAMPLING, context_length=1024), load_probe=group.active_requests)
        step = asyncio.ensure_future(sched.collect())
        while await victim.active_requests() == 0:  # wait until the victim is serving part of the step
            assert not step.done(), "the step ended before the victim served a request"
            await asyncio.sleep(0.05)
        on_victim = await victim.active_requests()
        victim.process.kill_now()
        first = await asyncio.wait_for(step, 180)
        second = await asyncio.wait_for(sched.collect(), 180)
        left = await group.active_requests()
        await sched.shutdown()
    kinds = [e.kind for e in group.events if e.url == victim.url]
    print(f"\nkilled the victim with {on_victim} requests on it; events {kinds}; step 1: regenerated "
          f"{first.report.members_regenerated}, failed {first.report.failed}; step 2 trained {second.report.trained}")
    assert kinds[:2] == ["dead", "removed"], group.events
    assert group.engine_urls() == [shared_engine]
    assert first.report.trained == 4 and second.report.trained == 4
    check_steps(source, [first.report, second.report], [[g.prompt_id for g in b.groups] for b in (first, second)],
                sched.buffered_prompt_ids())
    assert left == 0
