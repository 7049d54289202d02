"""EngineGroup's health monitor and the router's worker API, with fake workers behind the real router."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from agentrl.model_folder import ModelFolderError
from agentrl.rollout import (
    EngineConfig,
    EngineError,
    EngineGroup,
    FinishKind,
    HealthConfig,
    Router,
    RouterConfig,
    RouterError,
    RouterPolicy,
    SamplingParams,
    SGLangEngine,
)
from agentrl.rollout.process import ManagedProcess
from agentrl.testing.fake_worker import FakeWorker, FakeWorkerState


@asynccontextmanager
async def _broken_router(tmp_path: Path, reply: bytes | None) -> AsyncIterator[Router]:
    """A Router whose URL drops every connection (``reply=None``) or answers 200 with ``reply``; its
    process is a sleeper, so tests can check that it gets stopped."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if reply is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(reply), reply))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = int(server.sockets[0].getsockname()[1])
    process = ManagedProcess([sys.executable, "-c", "import time; time.sleep(300)"], env={},
                             log_path=tmp_path / "router.log", name="broken-router")
    try:
        yield Router(RouterConfig(port=port), process, port, 0)
    finally:
        process.stop(grace_s=1.0)
        server.close()
        await server.wait_closed()


class _UnrestartableEngine(SGLangEngine):
    """A launched-looking engine whose process is gone and whose restart fails with a plain error."""

    def alive(self) -> bool:
        return False

    async def restart(self) -> None:
        raise RuntimeError("port 1 already in use")


class _SlowStoppingEngine(SGLangEngine):
    """Dead, cannot be restarted (attached-looking: no config), and takes a while to stop."""

    def alive(self) -> bool:
        return False

    def stop(self) -> None:
        time.sleep(0.5)


async def _ticks_while(work: Awaitable[object]) -> int:
    """How often a 10 ms ticker ran while ``work`` was awaited (few if ``work`` blocks the loop)."""
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0)
    try:
        await work
    finally:
        ticker.cancel()
    return ticks


class _UnstoppableEngine(SGLangEngine):
    def stop(self) -> None:
        raise RuntimeError(f"cannot stop {self.url}")


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


class _ThreadStarter:
    """An :class:`EngineStarter` whose "process" is a fake worker in a thread (a run on Ray starts each
    engine through its host actor the same way): stopping it is the engine dying."""

    def __init__(self) -> None:
        self.starts = 0
        self.worker: FakeWorker | None = None

    async def start(self, config: EngineConfig, port: int | None) -> tuple[str, object]:
        self.starts += 1
        self.worker = FakeWorker(FakeWorkerState(name=f"start{self.starts}", weight_version="default"),
                                 port=port or 0)
        url = await asyncio.to_thread(self.worker.start)
        return url, _ThreadProcess(self.worker)


class _ThreadProcess:
    def __init__(self, worker: FakeWorker) -> None:
        self.worker, self.running = worker, True

    @property
    def pid(self) -> int:
        return 0

    def alive(self) -> bool:
        return self.running

    def returncode(self) -> int | None:
        return None if self.running else -9

    def stop(self) -> None:
        if self.running:
            self.running = False
            self.worker.stop()


async def test_a_dead_engine_is_restarted_through_its_starter_and_readmitted_after_the_hook() -> None:
    """The monitor restarts a dead engine through the starter that launched it; ``before_readmit``
    runs on the new process before the router sees it again (a run loads the current weights there)."""
    starter = _ThreadStarter()
    router = await Router.launch(RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING))
    group = await EngineGroup.launch([EngineConfig(model_path="unused", device="cpu")], None,
                                     HealthConfig(check_interval_s=0.1, http_checks=False), starters=[starter])
    await asyncio.to_thread(group.router.stop)
    group.router = router
    engine = group.engines[0]
    await router.add_worker(engine.url)
    seen: list[tuple[str, list[str]]] = []

    async def before_readmit(e: SGLangEngine) -> None:
        seen.append((await e.weight_version(), [w["url"] for w in await router.workers()]))
        assert starter.worker is not None
        starter.worker.state.weight_version = "7"  # what loading the current version does

    group.before_readmit = before_readmit
    try:
        group.start_monitor()
        assert isinstance(engine.process, _ThreadProcess)
        engine.process.stop()  # the engine dies
        for _ in range(200):
            if any(e.kind in ("restarted", "given_up") for e in group.events):
                break
            await asyncio.sleep(0.05)
        assert starter.starts == 2 and [e.kind for e in group.events] == ["dead", "removed", "restarted"]
        assert seen == [("default", [])]  # the hook saw the restarted engine while the router had none
        assert [w["url"] for w in await router.workers()] == [engine.url] and await engine.weight_version() == "7"
    finally:
        await group.shutdown()
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
            deadline = asyncio.get_running_loop().time() + 30
            while (active := sum([await e.active_requests() for e in group.engines])) < 6:
                assert not any(t.done() for t in tasks), "a request ended before all six reached the workers"
                assert asyncio.get_running_loop().time() < deadline, f"{active} of 6 requests reached the workers"
                await asyncio.sleep(0.02)
            await group.drain(timeout_s=10)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert all(r.aborted and 0 < r.completion_tokens < 3000 for r in results)
        assert [await e.active_requests() for e in group.engines] == [0, 0]
    finally:
        await group.shutdown()
        for w in workers:
            w.stop()


def _checkpoint(tmp_path: Path, name: str) -> Path:
    """A folder that passes the up-front model-folder check (the fake workers load nothing)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


async def test_group_weight_update_pauses_updates_and_continues(tmp_path: Path) -> None:
    workers = [FakeWorker(FakeWorkerState(name=f"u{i}")) for i in range(2)]
    for w in workers:
        w.start()
    router = await Router.launch(RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING))
    group = EngineGroup(router, [])
    try:
        for w in workers:
            await group.add_engine(await SGLangEngine.attach(w.url))
        await group.update_weights_from_disk(_checkpoint(tmp_path, "step-3"), "3", pause_mode="retract")
        await group.update_weights_from_disk(str(_checkpoint(tmp_path, "step-4")), "4")
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


@pytest.mark.parametrize("reply", [None, b"not json"], ids=["dropped", "bad-json"])
async def test_router_failures_are_router_errors(tmp_path: Path, reply: bytes | None) -> None:
    async with _broken_router(tmp_path, reply) as router:
        with pytest.raises(RouterError, match="/workers"):
            await router.workers()
        with pytest.raises(RouterError):
            await router.add_worker("http://127.0.0.1:1", timeout_s=0.5)


async def test_monitor_gives_up_when_router_and_restart_fail(tmp_path: Path) -> None:
    async with _broken_router(tmp_path, None) as router:
        engine = _UnrestartableEngine("http://127.0.0.1:1", EngineConfig(model_path="m"), process=None)
        group = EngineGroup(router, [engine], HealthConfig(http_checks=False))
        await group.check_once()
        tracked = group._tracked[0]
        assert tracked.restart_task is not None
        await asyncio.wait_for(tracked.restart_task, 5)
        assert [e.kind for e in group.events] == ["dead", "removed", "given_up"]
        assert "port 1 already in use" in group.events[-1].detail
        assert group.engine_urls() == []


async def test_shutdown_stops_everything_even_when_steps_fail(tmp_path: Path) -> None:
    worker = FakeWorker(FakeWorkerState(name="s"))
    worker.start()
    try:
        async with _broken_router(tmp_path, None) as router:
            attached = await SGLangEngine.attach(worker.url)
            group = EngineGroup(router, [attached])
            await group.shutdown()  # deregistering fails: the router drops the connection
            assert not router.process.alive() and group.engine_urls() == []

        async with _broken_router(tmp_path, None) as router:
            first = _UnstoppableEngine("http://127.0.0.1:2", None, process=None)
            sleeper = ManagedProcess([sys.executable, "-c", "import time; time.sleep(300)"], env={},
                                     log_path=tmp_path / "engine.log", name="sleeper")
            second = SGLangEngine("http://127.0.0.1:3", None, process=sleeper)
            group = EngineGroup(router, [first, second])
            with pytest.raises(RuntimeError, match="cannot stop"):
                await group.shutdown()
            assert not sleeper.alive() and not router.process.alive()
    finally:
        worker.stop()


class _PauseRefusingWorker(FakeWorker):
    async def _control(self, request: web.Request) -> web.Response:
        if request.path == "/pause_generation":
            self.state.control_calls.append(request.path)
            return web.Response(text="cannot pause now", status=503)
        return await super()._control(request)


async def test_a_weight_update_from_a_folder_that_is_not_a_model_fails_before_pausing(tmp_path: Path) -> None:
    worker = FakeWorker(FakeWorkerState(name="m"))
    worker.start()
    router = await Router.launch(RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING))
    group = EngineGroup(router, [])
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    try:
        await group.add_engine(await SGLangEngine.attach(worker.url))
        with pytest.raises(ModelFolderError, match=r"model_path: '.*no-such' does not exist"):
            await group.update_weights_from_disk(tmp_path / "no-such", "5", pause_mode="abort")
        with pytest.raises(ModelFolderError, match=r"'.*half' is not a model folder: it lacks weights"):
            await group.engines[0].update_weights_from_disk(tmp_path / "half", "5")
    finally:
        await group.shutdown()
        worker.stop()
    assert worker.state.control_calls == []


async def test_group_weight_update_continues_every_engine_when_a_pause_fails(tmp_path: Path) -> None:
    good, refusing = FakeWorker(FakeWorkerState(name="g")), _PauseRefusingWorker(FakeWorkerState(name="r"))
    for w in (good, refusing):
        w.start()
    router = await Router.launch(RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING))
    group = EngineGroup(router, [])
    try:
        for w in (good, refusing):
            await group.add_engine(await SGLangEngine.attach(w.url))
        with pytest.raises(EngineError, match="cannot pause now"):
            await group.update_weights_from_disk(_checkpoint(tmp_path, "step-5"), "5", pause_mode="abort")
    finally:
        await group.shutdown()
        for w in (good, refusing):
            w.stop()
    for w in (good, refusing):
        assert w.state.control_calls == ["/pause_generation", "/continue_generation"]
        assert w.state.weight_version == "default"


async def test_stopping_engines_does_not_block_the_event_loop(tmp_path: Path) -> None:
    async with _broken_router(tmp_path, None) as router:
        group = EngineGroup(router, [_SlowStoppingEngine("http://127.0.0.1:4", None, process=None)],
                            HealthConfig(http_checks=False))
        assert await _ticks_while(group.check_once()) >= 10  # takes the dead engine out and stops it
        assert [e.kind for e in group.events][:2] == ["dead", "removed"]
    async with _broken_router(tmp_path, None) as router:
        group = EngineGroup(router, [_SlowStoppingEngine("http://127.0.0.1:5", None, process=None)])
        assert await _ticks_while(group.shutdown()) >= 10
