"""Sandbox faults in the middle of rollouts: ``RetoolMathEnv`` on real bubblewrap sandboxes, the rollout
scheduler, and the in-process fake engine (the random tiny model never calls a tool; the fake engine's
policy does: one ``python`` call, then the answer).

- The whole sandbox pool crashes (every worker SIGKILLed) while episodes are inside tool calls:
  those calls come back to the model as sandbox errors (values, not exceptions), the episodes end
  normally, the step fills, the pool replaces its workers and the next step's calls run again.
- The step fills and aborts while other episodes are inside a tool call, queued on the tool
  concurrency limit (1) and queued on the request limit: the abort settles within its timeout,
  every limiter slot is given back (the next steps run at full width), suspended episodes resume,
  no prompt is lost or trained twice, and no sandbox process is left behind.

Deadlines: ``pytest.mark.timeout`` and ``asyncio.wait_for`` on every step.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from _accounting import check_steps, recording_rows

from agentrl.chat import ChatTemplate
from agentrl.environments import RetoolMathEnv
from agentrl.rollout import AgentConfig, SamplingParams, Scheduler, SchedulerConfig
from agentrl.rollout.scheduler import StepBatch
from agentrl.testing import build_tokenizer
from agentrl.testing.policy import FakePolicyClient, PolicyRequest
from agentrl.tools.sandbox.bwrap import BwrapSandbox

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def rows(n: int, slow_every: int = 1) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        a, b = i + 1, 2 * i + 3
        quick = slow_every > 1 and i % slow_every >= slow_every // 2
        out.append({"prompt": f"{'Quick: ' if quick else ''}What is {a} + {b}?", "label": str(a + b)})
    return out


def python_policy(sleep_s: float) -> Any:
    """Runs ``a + b`` in the python tool (after ``sleep_s``), then answers; 'Quick' rows answer at once."""

    def policy(req: PolicyRequest) -> str:
        a, b = (int(x) for x in QUESTION.findall(req.text)[-1])
        if "Quick: " in req.text.rsplit("<|im_start|>user", 1)[-1] or "<tool_response>" in req.text:
            return f"The answer is \\boxed{{{a + b}}}.<|im_end|>"
        code = f"import time\\ntime.sleep({sleep_s})\\nprint({a} + {b})"
        return f'<tool_call>\n{{"name": "python", "arguments": {{"code": "{code}"}}}}\n</tool_call><|im_end|>'

    return policy


def bwrap_children() -> set[int]:
    me = psutil.Process(os.getpid())
    return {p.pid for p in me.children(recursive=True)
            if "bwrap" in " ".join(p.cmdline() or [p.name()]) and p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture
def no_leftover_sandboxes() -> Iterator[None]:
    before = bwrap_children()
    yield
    deadline = time.monotonic() + 10
    while bwrap_children() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not bwrap_children() - before, "sandbox processes left behind"


def tool_replies(batch: StepBatch) -> list[str]:
    return [str(m.content) for ep in batch.episodes() for m in ep.trajectory.messages if m.role == "tool"]


async def test_the_sandbox_pool_crashing_mid_episode_is_a_tool_error_and_the_run_goes_on(
        no_leftover_sandboxes: None) -> None:
    tok = build_tokenizer()
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    calls: list[str] = []
    policy = python_policy(sleep_s=1.5)

    def counting(req: PolicyRequest) -> str:
        reply = policy(req)
        if "<tool_call>" in reply:
            calls.append(reply)
        return reply

    client = FakePolicyClient(tok, counting)
    async with BwrapSandbox(pool_size=4) as pool:
        source = recording_rows(rows(16), seed=1)
        sched = Scheduler(lambda row: RetoolMathEnv(row, sandbox=pool), template, client, source,
                          SchedulerConfig(groups_per_step=2, group_size=2),
                          agent=AgentConfig(sampling=SamplingParams(max_new_tokens=96)))
        step = asyncio.ensure_future(sched.collect())
        deadline = time.monotonic() + 30
        while len(calls) < 4 and time.monotonic() < deadline:  # every member of the step asked for its call
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.6)  # ... and is inside it now (each sleeps 1.5 s in the sandbox)
        assert len(calls) == 4 and not step.done()
        crashed = pool.worker_pids()
        for pid in crashed:
            os.kill(pid, signal.SIGKILL)
        first = await asyncio.wait_for(step, 60)
        second = await asyncio.wait_for(sched.collect(), 60)
        await sched.shutdown()
    replies_1, replies_2 = tool_replies(first), tool_replies(second)
    print(f"\nkilled {len(crashed)} sandbox workers mid-call; step 1 tool replies {replies_1}; step 2 {replies_2}")
    assert first.report.trained == 2 and second.report.trained == 2
    assert all(not b.report.failed for b in (first, second))
    crashes = [r for r in replies_1 if "sandbox worker exited" in r]
    assert crashes, replies_1  # the crash reached the model as a value
    assert all("killed by SIGKILL" in r and "namespaces" not in r for r in crashes), crashes  # no start-up advice
    assert all(ep.status.terminal for b in (first, second) for ep in b.episodes())
    labels = {g.row["label"] for g in second.groups}
    assert all(any(label in r for label in labels) for r in replies_2), replies_2  # the pool serves again
    check_steps(source, [first.report, second.report], [[g.prompt_id for g in b.groups] for b in (first, second)],
                sched.buffered_prompt_ids())


async def test_an_abort_racing_tool_calls_and_both_limiters_settles_and_gives_every_slot_back(
        no_leftover_sandboxes: None) -> None:
    tok = build_tokenizer()
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    # quick rows fill the step while the slow rows are in their python call, or queued for the one tool
    # slot, or queued for one of the two request slots
    client = FakePolicyClient(tok, python_policy(sleep_s=0.6), token_delay_s=0.002)
    async with BwrapSandbox(pool_size=2) as pool:
        source = recording_rows(rows(24, slow_every=4), seed=2)
        sched = Scheduler(lambda row: RetoolMathEnv(row, sandbox=pool), template, client, source,
                          SchedulerConfig(groups_per_step=2, group_size=2, over_sampling=1.0, partial_rollout=True,
                                          max_tool_concurrency=1, max_requests_per_engine=2, abort_timeout_s=1.0),
                          agent=AgentConfig(sampling=SamplingParams(max_new_tokens=96)))
        batches, took = [], []
        for _ in range(4):
            started = time.monotonic()
            batches.append(await asyncio.wait_for(sched.collect(), 60))
            took.append(time.monotonic() - started)
            assert not client.running, f"requests left running after the step: {client.running}"
        buffered = sched.buffered_prompt_ids()
        await sched.shutdown()
    reports = [b.report for b in batches]
    print(f"\nabort racing tools: steps took {[round(t, 2) for t in took]} s; buffered {[r.buffered for r in reports]}, "
          f"from buffer {[r.from_buffer for r in reports]}, cancelled {[r.metrics['abort/cancelled_tasks'] for r in reports]}, "
          f"settle {[round(r.metrics['abort/settle_s'], 2) for r in reports]} s; peak requests {client.max_running}")
    assert [r.trained for r in reports] == [2, 2, 2, 2]
    assert any(r.buffered for r in reports) and any(r.from_buffer for r in reports)
    assert all(r.metrics["abort/settle_s"] < 1.0 + 2.0 for r in reports)  # the abort timeout, plus slack
    assert client.max_running <= 2
    for b in batches:
        for ep in b.episodes():
            assert ep.status.terminal
            for reply in (m for m in ep.trajectory.messages if m.role == "tool"):
                assert "Traceback" not in str(reply.content)
    check_steps(source, reports, [[g.prompt_id for g in b.groups] for b in batches], buffered)
