"""The scheduler on real components: sglang-router + the session's real CPU SGLang engine serving the tiny Qwen3,
``ToyArithmeticEnv`` and ``RetoolMathEnv`` with real bubblewrap sandboxes, partial rollout on.

The tiny model has random weights: stop strings end its turns at random points, so groups finish
at different times, the step fills up while other groups are mid-turn, and those are aborted on the
engine, buffered and resumed by the next step. The checks are about control, not skill: no request
left on the engine after an abort, resumed turns continue from their sampled tokens (the engine's
re-scoring of the whole buffer reproduces the stored logprobs across the abort), every prompt
accounted for, and no sandbox process left behind.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import psutil
import pytest
import pytest_asyncio

from agentrl.chat import ChatTemplate
from agentrl.data import DataSource
from agentrl.environments import RetoolMathEnv, ToyArithmeticEnv, make_arithmetic_rows
from agentrl.rollout import (
    AgentConfig,
    EngineGroup,
    InferenceClient,
    RouterConfig,
    RouterPolicy,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
)
from agentrl.testing import build_tokenizer
from agentrl.trajectory import SegmentKind

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(600)]

CONTEXT = 1024
SAMPLING = SamplingParams(max_new_tokens=64, temperature=1.0, stop=("e",))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def group(tmp_path_factory: pytest.TempPathFactory, tiny_engine: str) -> AsyncIterator[EngineGroup]:
    # the session's engine (the tiny model, context 1024) behind a router of this module's own
    logs = tmp_path_factory.mktemp("router-logs")
    g = await EngineGroup.attach([tiny_engine], RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING, log_dir=logs))
    try:
        yield g
    finally:
        await g.shutdown()


@pytest_asyncio.fixture(loop_scope="module")
async def client(group: EngineGroup) -> AsyncIterator[InferenceClient]:
    async with group.client(max_retries=4) as c:
        yield c


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())


def scheduler(group: EngineGroup, client: InferenceClient, template: ChatTemplate, env: Any,
              rows: list[dict[str, Any]]) -> Scheduler:
    return Scheduler(env, template, client, DataSource.from_rows(rows, seed=3),
                     SchedulerConfig(groups_per_step=2, group_size=3, over_sampling=1.0, partial_rollout=True),
                     agent=AgentConfig(sampling=SAMPLING, context_length=CONTEXT), load_probe=group.active_requests)


async def rescore_matches(client: InferenceClient, traj: Any) -> None:
    scored = await client.generate(traj.tokens, SamplingParams(max_new_tokens=0), logprob_start_len=0)
    model = [i for s in traj.segments if s.kind is SegmentKind.MODEL for i in range(s.start, s.end)]
    stored = [traj.logprobs[i - traj.prompt_length] for i in model]
    assert [scored.input_logprobs[i] for i in model] == pytest.approx(stored, abs=0.05)


async def run_two_steps(sched: Scheduler, client: InferenceClient) -> None:
    first = await sched.collect()
    r1 = first.report
    r1.check()
    assert r1.trained == 2 and r1.metrics["abort/engine_requests_left"] == 0
    buffered = {g.row.prompt_id: [m.runner.traj.response_length if m.runner and m.runner.started else 0
                                  for m in g.members] for g in sched._buffer}
    partial = {g.row.prompt_id: sum(m.runner.partial_turn_tokens for m in g.members if m.runner)
               for g in sched._buffer}
    # members queued on the engine when the abort came have no tokens yet; the others were cut mid-turn
    assert r1.buffered == len(buffered) >= 1
    second = await sched.collect()
    r2 = second.report
    r2.check()
    assert r2.from_buffer == len(buffered) and r2.metrics["abort/engine_requests_left"] == 0
    resumed = [g for g in second.groups if g.prompt_id in buffered]
    still = {g.row.prompt_id: g for g in sched._buffer if g.row.prompt_id in buffered}
    assert resumed or still
    for g in resumed:  # step 2 finished step 1's episodes: their first turns were cut and continued
        for ep in g.episodes:
            assert ep.status.terminal
            await rescore_matches(client, ep.trajectory)
        cut = [s for ep in g.episodes for s in ep.trajectory.segments_of(SegmentKind.MODEL)
               if s.finish_reason == "abort"]
        assert bool(cut) == (partial[g.prompt_id] > 0)  # a cut turn keeps its first span, then continues
    for pid, g in still.items():  # or made progress and waits again
        now = [m.runner.traj.response_length if m.runner and m.runner.started else 0 for m in g.members]
        assert sum(now) >= sum(buffered[pid])


class ReadyRetoolEnv(RetoolMathEnv):
    """RetoolMathEnv whose opening runs one real sandboxed ``print`` (the random model never calls the
    tool itself), so every episode holds a live bubblewrap sandbox while it runs or waits in the buffer."""

    async def reset(self) -> list[Any]:
        opening = await super().reset()
        assert self.python is not None
        result = await self.python(code="print('ready')")
        assert "ready" in result.content, result
        return opening


def live_runners(sched: Scheduler) -> list[Any]:
    """The buffered members whose environment was reset and is still open (a sandbox each)."""
    return [m.runner for g in sched._buffer for m in g.members
            if m.runner is not None and m.runner.started and not m.runner.done]


def bwrap_children() -> list[psutil.Process]:
    me = psutil.Process(os.getpid())
    return [p for p in me.children(recursive=True) if "bwrap" in " ".join(p.cmdline() or [p.name()])]


async def test_toy_arithmetic_two_steps_with_partial_rollout(group: EngineGroup, client: InferenceClient,
                                                             template: ChatTemplate) -> None:
    sched = scheduler(group, client, template, ToyArithmeticEnv, make_arithmetic_rows(64, seed=1))
    await run_two_steps(sched, client)
    await sched.shutdown()
    assert sched.buffered_groups == 0


async def test_retool_math_with_real_sandboxes_leaves_nothing_running(group: EngineGroup, client: InferenceClient,
                                                                      template: ChatTemplate) -> None:
    before = {p.pid for p in bwrap_children()}
    rows = [{"prompt": f"What is {i} + {i}?", "label": str(2 * i)} for i in range(64)]
    sched = scheduler(group, client, template, ReadyRetoolEnv, rows)
    await run_two_steps(sched, client)
    # the buffered episodes that had started hold their sandboxes open; a step whose leftovers all
    # finished or had not started yet leaves none, so a few more steps are run until one does
    live = live_runners(sched)
    for _ in range(4):
        if live:
            break
        (await sched.collect()).report.check()
        live = live_runners(sched)
    assert live, "no step left a started episode in the buffer"
    assert len({p.pid for p in bwrap_children()} - before) >= len(live)
    await sched.shutdown()
    left = [p for p in bwrap_children() if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline() for p in left]
