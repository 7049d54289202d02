"""InferenceClient against fake workers behind the real sglang-router (retries, 4xx, deadline, abort,
session affinity, request fields surviving the router's re-serialisation)."""

from __future__ import annotations

import time

import pytest

from agentrl.rollout import (
    ClientConfig,
    FinishKind,
    InferenceClient,
    PromptTooLongError,
    RequestRejectedError,
    SamplingParams,
)
from agentrl.rollout.client import ROUTER_DROPPED_SAMPLING_KEYS
from agentrl.rollout.process import free_port
from agentrl.rollout.types import AbortCause
from agentrl.testing.fake_worker import FakeCluster


def _client(cluster: FakeCluster, **kw: object) -> InferenceClient:
    config = ClientConfig(base_url=cluster.router.url, backoff_initial_s=0.01, **kw)  # type: ignore[arg-type]
    return InferenceClient(config, control_urls=cluster.urls)


async def test_generate_through_router_returns_worker_answer(cluster: FakeCluster) -> None:
    params = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=5, min_p=0.05, min_new_tokens=1,
                            stop=("zz",), stop_token_ids=(999,), repetition_penalty=1.05, frequency_penalty=0.1,
                            presence_penalty=0.2, sampling_seed=3, regex="[0-9]+", logit_bias={15: -2.0})
    async with _client(cluster) as client:
        res = await client.generate([10, 11, 12], params, rid="req-1", routing_key="s1", top_logprobs_num=2)
    assert res.output_ids == (13, 14, 15, 16, 17)
    assert res.output_logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert res.finish_reason.kind is FinishKind.LENGTH and res.rid == "req-1" and res.attempts == 1
    assert res.weight_version == "default" and res.prompt_tokens == 3
    seen = [r for w in cluster.workers for r in w.state.requests]
    assert len(seen) == 1
    body = seen[0]
    # every sampling field but the one sglang-router 0.3.2 is known to drop survived its re-serialisation
    sent = params.to_payload()
    assert ROUTER_DROPPED_SAMPLING_KEYS == {"spaces_between_special_tokens", "logit_bias"}
    assert body["sampling_params"] == {k: v for k, v in sent.items() if k not in ROUTER_DROPPED_SAMPLING_KEYS}
    assert body["input_ids"] == [10, 11, 12] and body["rid"] == "req-1"
    assert body["return_logprob"] is True and body["top_logprobs_num"] == 2


async def test_a_router_bound_client_refuses_what_the_router_would_drop(cluster: FakeCluster) -> None:
    biased = SamplingParams(max_new_tokens=2, logit_bias={15: -2.0})
    async with _client(cluster, via_router=True) as client:
        with pytest.raises(ValueError, match="logit_bias would be dropped by sglang-router"):
            await client.generate([10], biased)
        ok = await client.generate([10], SamplingParams(max_new_tokens=2, regex="[0-9]+"))  # kept by the router
    assert ok.completion_tokens == 2
    assert [r["sampling_params"].get("regex") for w in cluster.workers for r in w.state.requests] == ["[0-9]+"]


async def test_routing_key_keeps_a_session_on_one_worker(cluster: FakeCluster) -> None:
    served: dict[str, set[str]] = {}
    async with _client(cluster) as client:
        for key in [f"episode-{i}" for i in range(12)]:
            for _ in range(4):
                res = await client.generate([1, 2], SamplingParams(max_new_tokens=1), routing_key=key)
                served.setdefault(key, set()).add(res.meta["worker"])
    assert all(len(workers) == 1 for workers in served.values()), served
    assert set().union(*served.values()) == {"w0", "w1"}  # keys do spread over both workers


async def test_5xx_is_retried_then_succeeds(cluster: FakeCluster) -> None:
    for w in cluster.workers:
        w.state.fail_next = 2
    async with _client(cluster) as client:
        res = await client.generate([5], SamplingParams(max_new_tokens=2), routing_key="retry-me")
    assert res.finish_reason.kind is FinishKind.LENGTH and res.attempts == 3
    rids = [r["rid"] for w in cluster.workers for r in w.state.requests]
    assert len(rids) == 3 and len(set(rids)) == 3  # each attempt has its own rid


async def test_retries_exhausted_come_back_aborted(cluster: FakeCluster) -> None:
    for w in cluster.workers:
        w.state.fail_next = 100
    async with _client(cluster, max_retries=2) as client:
        res = await client.generate([5], SamplingParams(max_new_tokens=2), routing_key="k")
    assert res.aborted and res.attempts == 3 and res.output_ids == ()
    assert res.finish_reason.status_code == 500 and "injected failure" in (res.finish_reason.message or "")
    assert res.finish_reason.cause is AbortCause.UNAVAILABLE and res.finish_reason.cause.failure
    assert sum(len(w.state.requests) for w in cluster.workers) == 3


async def test_an_unavailable_engine_is_waited_for_beyond_the_retries(cluster: FakeCluster) -> None:
    """``unavailable_wait_s``: while every engine is down (a restart in progress) a request keeps trying
    past ``max_retries`` until that long after its first failure; then it comes back aborted."""
    for w in cluster.workers:
        w.state.fail_next = 12
    async with _client(cluster, max_retries=1, backoff_max_s=0.05,
                       unavailable_wait_s=30.0) as client:
        res = await client.generate([5], SamplingParams(max_new_tokens=2), routing_key="k")
    assert not res.aborted and res.attempts == 13
    for w in cluster.workers:
        w.state.fail_next = 1000
    async with _client(cluster, max_retries=1, backoff_max_s=0.05,
                       unavailable_wait_s=0.5) as client:
        t0 = time.monotonic()
        res = await client.generate([5], SamplingParams(max_new_tokens=2), routing_key="k")
    assert res.aborted and res.finish_reason.cause is AbortCause.UNAVAILABLE and res.attempts > 2
    assert 0.5 <= time.monotonic() - t0 < 5


async def test_requests_go_through_the_current_adapter_when_one_is_set(cluster: FakeCluster) -> None:
    """LoRA: the router passes ``lora_path`` through; the weight sync moves the client's adapter, and a
    result says the adapter's version (SGLang reports the base weights' version)."""
    async with _client(cluster) as client:
        base = await client.generate([5], SamplingParams(max_new_tokens=1), routing_key="a")
        client.set_adapter("policy-v3", 3)
        assert client.adapter == "policy-v3"
        through = await client.generate([6], SamplingParams(max_new_tokens=1), routing_key="b")
        with pytest.raises(ValueError, match="expected an adapter name or None"):
            client.set_adapter("", 4)
    bodies = [r for w in cluster.workers for r in w.state.requests]
    assert sorted(b.get("lora_path", "-") for b in bodies) == ["-", "policy-v3"]
    assert through.weight_version == "3" and base.weight_version != "3"


async def test_4xx_is_never_retried(cluster: FakeCluster) -> None:
    async with _client(cluster) as client:
        with pytest.raises(PromptTooLongError, match="context length"):
            await client.generate(list(range(100)), SamplingParams(max_new_tokens=5000), routing_key="k")
        for w in cluster.workers:
            w.state.fail_next, w.state.fail_status = 1, 422
        with pytest.raises(RequestRejectedError) as info:
            await client.generate([1], SamplingParams(max_new_tokens=1), routing_key="k")
    assert info.value.status == 422
    assert sum(len(w.state.requests) for w in cluster.workers) == 2


async def test_deadline_aborts_and_returns_partial_tokens(cluster: FakeCluster) -> None:
    for w in cluster.workers:
        w.state.token_delay_s = 0.02
    async with _client(cluster) as client:
        t0 = time.monotonic()
        res = await client.generate([1], SamplingParams(max_new_tokens=1000), routing_key="slow", deadline_s=1.0)
        elapsed = time.monotonic() - t0
    assert res.aborted and 0 < len(res.output_ids) < 1000
    assert len(res.output_logprobs) == len(res.output_ids)
    # the engine reports a plain abort; the client knows it was its own deadline, and says so
    assert res.finish_reason.cause is AbortCause.DEADLINE and "deadline exceeded" in (res.finish_reason.message or "")
    assert elapsed < 10.0  # cut at the deadline: the whole generation takes 20 s


async def test_abort_by_rid_mid_generation(cluster: FakeCluster) -> None:
    import asyncio

    for w in cluster.workers:
        w.state.token_delay_s = 0.01
    async with _client(cluster) as client:
        task = asyncio.ensure_future(client.generate([1], SamplingParams(max_new_tokens=2000), rid="victim"))
        other = asyncio.ensure_future(client.generate([1], SamplingParams(max_new_tokens=20), rid="bystander"))
        deadline = time.monotonic() + 30
        while not any("victim" in w.state.running for w in cluster.workers):  # reached a worker through the router
            assert time.monotonic() < deadline and not task.done(), "the request did not reach a worker"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # some tokens in (one every 10 ms)
        assert await client.abort("victim") == 2  # broadcast to both engines
        # sglang-router itself does not serve /abort_request: without control URLs nothing is reached
        async with InferenceClient(ClientConfig(base_url=cluster.router.url)) as bare:
            assert await bare.abort("victim") == 0
        res, ok = await asyncio.wait_for(asyncio.gather(task, other), 10)
    assert res.aborted and 0 < res.completion_tokens < 2000
    assert res.finish_reason.cause is AbortCause.CLIENT and not res.finish_reason.cause.failure
    assert ok.finish_reason.kind is FinishKind.LENGTH and ok.completion_tokens == 20


async def test_transport_errors_retry_then_abort_without_hanging() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    config = ClientConfig(base_url=dead, max_retries=3, backoff_initial_s=0.01, connect_timeout_s=1.0)
    async with InferenceClient(config) as client:
        t0 = time.monotonic()
        res = await client.generate([1], SamplingParams(max_new_tokens=1))
    assert res.aborted and res.attempts == 4 and "Connect call failed" in (res.finish_reason.message or "")
    assert res.finish_reason.cause is AbortCause.UNAVAILABLE
    assert time.monotonic() - t0 < 5


async def test_bad_arguments_are_reported() -> None:
    with pytest.raises(ValueError, match="base_url='router:1'"):
        ClientConfig(base_url="router:1")
    async with InferenceClient(ClientConfig(base_url="http://127.0.0.1:1")) as client:
        with pytest.raises(TypeError, match="SamplingParams"):
            await client.generate([1], {"max_new_tokens": 1})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="input_ids"):
            await client.generate([], SamplingParams())


async def test_deadline_when_the_abort_never_arrives(cluster: FakeCluster) -> None:
    for w in cluster.workers:
        w.state.token_delay_s = 0.02
    # no control URLs: the abort reaches no engine, so the grace timer must end the call
    config = ClientConfig(base_url=cluster.router.url, abort_grace_s=0.3)
    async with InferenceClient(config, control_urls=list) as client:
        t0 = time.monotonic()
        res = await client.generate([1], SamplingParams(max_new_tokens=1000), deadline_s=0.2)
        elapsed = time.monotonic() - t0
        assert res.aborted and res.output_ids == () and "did not answer" in (res.finish_reason.message or "")
        assert res.finish_reason.cause is AbortCause.DEADLINE
        assert 0.4 < elapsed < 3.0
        # the client stays usable, and its task was not left cancelled
        ok = await client.generate([1], SamplingParams(max_new_tokens=2))
    assert ok.finish_reason.kind is FinishKind.LENGTH


async def test_abort_of_a_waiting_request_and_duplicate_rids(cluster: FakeCluster) -> None:
    import asyncio

    for w in cluster.workers:
        w.state.token_delay_s = 0.01
    async with _client(cluster, max_concurrency=1) as client:
        first = asyncio.ensure_future(client.generate([1], SamplingParams(max_new_tokens=30), rid="first"))
        waiting = asyncio.ensure_future(client.generate([1], SamplingParams(max_new_tokens=30), rid="waiting"))
        await asyncio.sleep(0.1)
        with pytest.raises(ValueError, match="rid='first'"):
            await client.generate([1], SamplingParams(max_new_tokens=1), rid="first")
        await client.abort("waiting")  # still queued behind the concurrency limit
        done_first, done_waiting = await asyncio.wait_for(asyncio.gather(first, waiting), 10)
    assert done_first.finish_reason.kind is FinishKind.LENGTH
    assert done_waiting.aborted and done_waiting.attempts == 0 and "before the request was sent" in (
        done_waiting.finish_reason.message or "")
    assert done_waiting.finish_reason.cause is AbortCause.CLIENT
    assert [r["rid"] for w in cluster.workers for r in w.state.requests] == ["first"]


async def test_every_answer_is_parsed_in_a_turn_of_the_pacer_the_scheduler_shares(tok: object) -> None:
    """Each answer the client receives is parsed only after a turn of the client's pacer, which a
    scheduler on this client shares (one pacer per loop); a burst still comes back whole."""
    import asyncio

    from agentrl.chat import ChatTemplate
    from agentrl.data import DataSource
    from agentrl.environments import ToyArithmeticEnv, make_arithmetic_rows
    from agentrl.rollout import Scheduler, SchedulerConfig
    from agentrl.rollout.pacing import Pacer
    from agentrl.testing.fake_worker import FakeWorker

    class CountingPacer(Pacer):
        turns = 0

        async def turn(self) -> None:
            self.turns += 1
            await super().turn()

    worker = FakeWorker()
    url = worker.start()
    try:
        async with InferenceClient(ClientConfig(base_url=url)) as client:
            client.pacer = CountingPacer(budget_s=1e-9)
            results = await asyncio.gather(*(client.generate([10 + i], SamplingParams(max_new_tokens=4), rid=f"b{i}")
                                             for i in range(64)))
            assert [r.output_ids for r in results] == [tuple(range(11 + i, 15 + i)) for i in range(64)]
            assert client.pacer.turns == 64
            template = ChatTemplate.from_name("qwen3", tokenizer=tok)
            sched = Scheduler(ToyArithmeticEnv, template, client, DataSource.from_rows(make_arithmetic_rows(4)),
                              SchedulerConfig(groups_per_step=1, group_size=2))
            assert sched.pacer is client.pacer
    finally:
        worker.stop()


async def test_a_pacer_queues_what_arrives_in_a_spent_pass_and_releases_it_in_order() -> None:
    """Slices that ask for a turn in one loop pass past its budget wait for later passes, each of which
    releases about what fits; all run, first come first served."""
    import asyncio

    from agentrl.rollout.pacing import Pacer

    pacer = Pacer(budget_s=1e-9)
    order: list[int] = []

    async def slice_(i: int) -> None:
        await pacer.turn()
        order.append(i)

    # gather starts the 64 tasks in one loop pass: the first opens the pass, the rest find it spent
    await asyncio.wait_for(asyncio.gather(*(slice_(i) for i in range(64))), 10)
    assert order == list(range(64))
    assert pacer.queued == 63
