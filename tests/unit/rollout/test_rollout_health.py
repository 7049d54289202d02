"""EngineGroup's health monitor and the router's worker API, with fake workers behind the real router."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.rollout import (
    EngineError,
    EngineGroup,
    FinishKind,
    HealthConfig,
    Router,
    RouterConfig,
    RouterPolicy,
    SamplingParams,
    SGLangEngine,
)
from agentrl.testing.fake_worker import FakeWorker, FakeWorkerState


async def test_router_worker_api_and_stop() -> None:
    worker = FakeWorker(FakeWorkerState(name="solo"))
    worker.start()
    router = await Router.launch(RouterConfig(policy=RouterPolicy.ROUND_ROBIN))
    try:
        worker_id = await router.add_worker(worker.url)
        listed = await router.workers()
        assert [w["url"] for w in listed] == [worker.url] and listed[0]["id"] == worker_id
        assert await router.remove_worker(worker.url) is True
        assert await router.workers() == []
        assert await router.remove_worker(worker.url) is False
    finally:
        tree = router.process.tree()
        router.stop()
        worker.stop()
    assert tree and not any(p.is_running() and p.status() != "zombie" for p in tree)


async def test_attach_refuses_a_mismatching_engine() -> None:
    worker = FakeWorker(FakeWorkerState(name="a", context_length=4096))
    worker.start()
    try:
        engine = await SGLangEngine.attach(worker.url, {"context_length": 4096, "tp_size": 1})
        assert engine.process is None and engine.alive()
        with pytest.raises(EngineError, match=r"tp_size: engine has 1, expected 2"):
            await SGLangEngine.attach(worker.url, {"tp_size": 2})
        with pytest.raises(EngineError, match="cannot restart attached engine"):
            await engine.restart()
    finally:
        worker.stop()


async def test_monitor_takes_a_dead_engine_out_of_rotation() -> None:
    workers = [FakeWorker(FakeWorkerState(name=f"h{i}")) for i in range(2)]
    for w in workers:
        w.start()
    router = await Router.launch(RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING))
    engines = [await SGLangEngine.attach(w.url) for w in workers]
    group = EngineGroup(router, [], HealthConfig(check_interval_s=0.1, failure_threshold=2, http_timeout_s=1.0))
    try:
        for e in engines:
            await group.add_engine(e)
        group.start_monitor()
        workers[0].stop()  # the engine disappears; it was attached, so it cannot be restarted
        for _ in range(100):
            if any(e.kind == "given_up" for e in group.events):
                break
            await asyncio.sleep(0.1)
        assert group.engine_urls() == [workers[1].url]
        assert [w["url"] for w in await router.workers()] == [workers[1].url]
        kinds = [e.kind for e in group.events if e.url == workers[0].url]
        assert kinds == ["dead", "removed", "given_up"], group.events
        async with group.client(backoff_initial_s=0.01) as client:
            results = [await client.generate([1], SamplingParams(max_new_tokens=2), routing_key=f"k{i}")
                       for i in range(10)]
        assert all(r.finish_reason.kind is FinishKind.LENGTH and r.meta["worker"] == "h1" for r in results)
    finally:
        await group.shutdown()
        workers[1].stop()
    assert not router.process.alive()


async def test_drain_aborts_running_requests_and_waits_idle() -> None:
    workers = [FakeWorker(FakeWorkerState(name=f"d{i}", token_delay_s=0.01)) for i in range(2)]
    for w in workers:
        w.start()
    router = await Router.launch(RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING))
    group = EngineGroup(router, [])
    try:
        for w in workers:
            await group.add_engine(await SGLangEngine.attach(w.url))
        async with group.client() as client:
            tasks = [asyncio.ensure_future(client.generate([1], SamplingParams(max_new_tokens=3000),
                                                           routing_key=f"k{i}")) for i in range(6)]
            await asyncio.sleep(0.3)
            assert sum([await e.active_requests() for e in group.engines]) == 6
            await group.drain(timeout_s=10)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert all(r.aborted and 0 < r.completion_tokens < 3000 for r in results)
        assert [await e.active_requests() for e in group.engines] == [0, 0]
    finally:
        await group.shutdown()
        for w in workers:
            w.stop()


async def test_group_weight_update_pauses_updates_and_continues() -> None:
    workers = [FakeWorker(FakeWorkerState(name=f"u{i}")) for i in range(2)]
    for w in workers:
        w.start()
    router = await Router.launch(RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING))
    group = EngineGroup(router, [])
    try:
        for w in workers:
            await group.add_engine(await SGLangEngine.attach(w.url))
        await group.update_weights_from_disk("/ckpt/step-3", "3", pause_mode="retract")
        await group.update_weights_from_disk("/ckpt/step-4", "4")
        async with group.client() as client:
            res = await client.generate([1], SamplingParams(max_new_tokens=1), routing_key="x")
    finally:
        await group.shutdown()
        for w in workers:
            w.stop()
    for w in workers:
        assert w.state.control_calls == ["/pause_generation", "/update_weights_from_disk",
                                         "/continue_generation", "/update_weights_from_disk"]
        assert w.state.weight_version == "4"
    assert res.weight_version == "4"
