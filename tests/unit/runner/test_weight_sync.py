"""DiskWeightSync against fake SGLang workers: phases, retries, removal, deadlines, pause modes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from agentrl.rollout import SamplingParams, SGLangEngine
from agentrl.rollout.client import ClientConfig, InferenceClient
from agentrl.runner.weights import DiskWeightSync, WeightSyncConfig, WeightSyncError
from agentrl.testing.fake_worker import FakeWorker, FakeWorkerState

FAST = WeightSyncConfig(retry_delay_s=0.0)


def write_model(folder: Path) -> None:
    """What an export writes, as far as the fake workers care (they load nothing)."""
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")


@pytest.fixture
def workers() -> Iterator[list[FakeWorker]]:
    ws = [FakeWorker(FakeWorkerState(name=f"w{i}")) for i in range(2)]
    for w in ws:
        w.start()
    yield ws
    for w in ws:
        w.stop()


@pytest_asyncio.fixture
async def engines(workers: list[FakeWorker]) -> list[SGLangEngine]:
    return [await SGLangEngine.attach(w.url) for w in workers]


async def test_sync_exports_loads_verifies_continues_and_prunes(tmp_path: Path, workers: list[FakeWorker],
                                                                engines: list[SGLangEngine]) -> None:
    sync = DiskWeightSync(engines, tmp_path / "w", FAST)
    first = await sync.sync(1, write_model)
    assert first.folder == tmp_path / "w" / "v000001" and first.folder.is_dir()
    report = await sync.sync(2, write_model)
    assert report.version == 2 and set(report.engines_updated) == {w.url for w in workers}
    assert report.engines_removed == () and report.retries == 0 and report.aborted_requests == 0
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v000002"]  # keep_folders=1
    for w in workers:
        assert w.state.weight_version == "2" and not w.state.paused
        assert w.state.control_calls[-3:] == ["/pause_generation", "/update_weights_from_disk",
                                              "/continue_generation"]
        assert w.state.pause_modes == ["retract", "retract"]
        assert w.state.updates[-1] == {"model_path": str(report.folder), "weight_version": "2", "flush_cache": True,
                                       "abort_all_requests": False}
    metrics = report.to_metrics()
    assert metrics["sync/engines_updated"] == 2.0 and metrics["sync/version"] == 2.0
    assert all(k.startswith("sync/") and isinstance(v, float) for k, v in metrics.items())
    assert report.total_s >= report.export_s + report.pause_s + report.load_s


async def test_keep_folders_and_a_repeated_version_gets_a_fresh_folder(tmp_path: Path,
                                                                       engines: list[SGLangEngine]) -> None:
    sync = DiskWeightSync(engines, tmp_path, WeightSyncConfig(keep_folders=2, retry_delay_s=0.0))
    (tmp_path / "v000009").mkdir()  # a newer folder (e.g. from a run resumed earlier) is not touched
    for v in (1, 2, 3):
        await sync.sync(v, write_model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000002", "v000003", "v000009"]
    (tmp_path / "v000003" / "stale.bin").write_bytes(b"x")
    await sync.sync(3, write_model)
    assert not (tmp_path / "v000003" / "stale.bin").exists()


async def test_async_export_and_a_bad_export_fail_in_the_export_phase(tmp_path: Path, workers: list[FakeWorker],
                                                                      engines: list[SGLangEngine]) -> None:
    sync = DiskWeightSync(engines, tmp_path, FAST)

    async def export(folder: Path) -> None:
        await asyncio.sleep(0)
        write_model(folder)

    assert (await sync.sync(1, export)).engines_updated
    with pytest.raises(WeightSyncError, match=r"phase 'export'.*weights") as info:
        await sync.sync(2, lambda folder: (folder / "config.json").write_text("{}"))
    assert info.value.phase == "export"
    assert all(w.state.control_calls.count("/pause_generation") == 1 for w in workers)  # never paused for it


async def test_an_update_failing_once_is_retried(tmp_path: Path, workers: list[FakeWorker],
                                                 engines: list[SGLangEngine]) -> None:
    workers[0].state.fail_updates = 1
    report = await DiskWeightSync(engines, tmp_path, FAST).sync(4, write_model)
    assert report.retries == 1 and len(report.engines_updated) == 2 and report.engines_removed == ()
    assert len(workers[0].state.updates) == 2 and len(workers[1].state.updates) == 1
    assert any("injected update failure by w0" in f for f in report.failures)


async def test_an_engine_failing_every_retry_is_removed_and_reported(tmp_path: Path, workers: list[FakeWorker],
                                                                     engines: list[SGLangEngine]) -> None:
    removed: list[str] = []

    async def on_remove(engine: SGLangEngine) -> None:
        removed.append(engine.url)

    workers[1].state.fail_updates = -1
    sync = DiskWeightSync(engines, tmp_path, WeightSyncConfig(retries=2, retry_delay_s=0.0), on_remove=on_remove)
    report = await sync.sync(5, write_model)
    assert report.engines_updated == (workers[0].url,) and report.engines_removed == (workers[1].url,)
    assert removed == [workers[1].url] and report.retries == 2 and len(workers[1].state.updates) == 3
    assert not workers[1].state.paused  # continued although it failed
    assert [e.url for e in sync.engines] == [workers[0].url]
    await sync.sync(6, write_model)  # later syncs skip the removed engine
    assert len(workers[1].state.updates) == 3 and workers[0].state.weight_version == "6"


async def test_an_engine_that_keeps_its_old_version_is_caught_by_verify(tmp_path: Path, workers: list[FakeWorker],
                                                                        engines: list[SGLangEngine]) -> None:
    workers[0].state.keep_version = True
    report = await DiskWeightSync(engines, tmp_path, WeightSyncConfig(retries=1, retry_delay_s=0.0)).sync(
        7, write_model)
    assert report.engines_removed == (workers[0].url,)
    assert any("reports weight_version 'default', expected '7'" in f for f in report.failures)


async def test_no_engine_with_the_new_version_raises_naming_phase_engine_and_cause(
        tmp_path: Path, workers: list[FakeWorker], engines: list[SGLangEngine]) -> None:
    for w in workers:
        w.state.fail_updates = -1
    removed: list[SGLangEngine] = []
    sync = DiskWeightSync(engines, tmp_path, WeightSyncConfig(retries=0), on_remove=removed.append)
    with pytest.raises(WeightSyncError, match=r"phase 'load' on http://127\.0\.0\.1:\d+: .*injected update failure"):
        await sync.sync(8, write_model)
    assert all(not w.state.paused and w.state.control_calls[-1] == "/continue_generation" for w in workers)
    assert removed == [] and sync.engines == engines  # all still on the old version: none taken out
    for w in workers:
        w.state.fail_updates = 0
    assert len((await sync.sync(9, write_model)).engines_updated) == 2


async def test_a_phase_past_its_deadline_names_the_phase_and_continues_the_engines(
        tmp_path: Path, workers: list[FakeWorker], engines: list[SGLangEngine]) -> None:
    workers[0].state.update_delay_s = 2.0
    sync = DiskWeightSync(engines, tmp_path, WeightSyncConfig(load_s=0.3))
    with pytest.raises(WeightSyncError, match=r"phase 'load'.*deadline of 0\.3 s") as info:
        await sync.sync(1, write_model)
    assert info.value.phase == "load"
    assert all(not w.state.paused for w in workers)


async def test_pause_failure_is_retried_then_the_engine_is_removed(tmp_path: Path, workers: list[FakeWorker]) -> None:
    dead = await SGLangEngine.attach(workers[1].url)
    live = await SGLangEngine.attach(workers[0].url)
    workers[1].stop()  # connection refused from now on
    report = await DiskWeightSync([live, dead], tmp_path, WeightSyncConfig(retries=1, retry_delay_s=0.0)).sync(
        3, write_model)
    assert report.engines_updated == (live.url,) and report.engines_removed == (dead.url,)
    assert any(f.startswith(f"pause {dead.url}") for f in report.failures)


@pytest_asyncio.fixture
async def slow_client(workers: list[FakeWorker]) -> AsyncIterator[InferenceClient]:
    workers[0].state.token_delay_s = 0.02
    async with InferenceClient(ClientConfig(base_url=workers[0].url, max_retries=0)) as client:
        yield client


async def _sync_under_load(tmp_path: Path, engine: SGLangEngine, client: InferenceClient,
                           config: WeightSyncConfig) -> tuple[int, list[str]]:
    requests = [asyncio.ensure_future(client.generate([5, 6, 7], SamplingParams(max_new_tokens=40)))
                for _ in range(4)]
    while await engine.active_requests() < 4:
        await asyncio.sleep(0.01)
    report = await DiskWeightSync([engine], tmp_path, config).sync(1, write_model)
    results = await asyncio.gather(*requests)
    return report.aborted_requests, [r.finish_reason.kind.value for r in results]


async def test_retract_keeps_requests_in_flight(tmp_path: Path, engines: list[SGLangEngine],
                                                slow_client: InferenceClient) -> None:
    aborted, kinds = await _sync_under_load(tmp_path, engines[0], slow_client, FAST)
    assert aborted == 0 and kinds == ["length"] * 4


async def test_abort_mode_aborts_and_counts_the_requests(tmp_path: Path, engines: list[SGLangEngine],
                                                         slow_client: InferenceClient) -> None:
    aborted, kinds = await _sync_under_load(tmp_path, engines[0], slow_client,
                                            WeightSyncConfig(pause_mode="abort"))
    assert aborted == 4 and kinds == ["abort"] * 4


async def test_in_place_loads_without_flushing(tmp_path: Path, workers: list[FakeWorker],
                                               engines: list[SGLangEngine]) -> None:
    await DiskWeightSync(engines[:1], tmp_path, WeightSyncConfig(pause_mode="in_place")).sync(1, write_model)
    assert workers[0].state.updates[-1]["flush_cache"] is False and workers[0].state.pause_modes == ["in_place"]


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("pause_mode", "drain", "expected one of 'retract', 'in_place', 'abort'"),
    ("retries", -1, "expected an int >= 0"),
    ("keep_folders", 0, "expected an int >= 1"),
    ("load_s", 0, "expected a number > 0"),
    ("abort_requests", "yes", "expected a bool"),
])
def test_config_errors_name_field_value_and_expectation(field: str, value: object, expected: str) -> None:
    with pytest.raises(ValueError, match=rf"WeightSyncConfig\.{field}={value!r}: {expected}"):
        WeightSyncConfig(**{field: value})  # type: ignore[arg-type]


def test_construction_and_version_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected at least one engine"):
        DiskWeightSync([], tmp_path)
    sync = DiskWeightSync([SGLangEngine("http://127.0.0.1:9", None, None)], tmp_path)
    with pytest.raises(ValueError, match=r"sync\(version=-1\): expected an int >= 0"):
        asyncio.run(sync.sync(-1, write_model))


async def test_an_engine_out_of_rotation_is_skipped_then_brought_to_the_current_version(
        tmp_path: Path, workers: list[FakeWorker], engines: list[SGLangEngine]) -> None:
    """A run's sync includes the engines in rotation only; ``load_current`` gives one coming back the
    version the last sync loaded (waiting for a sync in progress) and includes it in later syncs."""
    out: set[str] = set()
    sync = DiskWeightSync(engines, tmp_path, FAST, eligible=lambda e: e.url not in out)
    assert await sync.load_current(engines[0]) is None  # nothing synced yet: the boot weights are version 0
    await sync.sync(1, write_model)
    out.add(engines[1].url)
    report = await sync.sync(2, write_model)
    assert report.engines_updated == (engines[0].url,) and workers[1].state.weight_version == "1"
    assert await sync.load_current(engines[1]) == "2" and workers[1].state.weight_version == "2"
    out.clear()
    report = await sync.sync(3, write_model)
    assert set(report.engines_updated) == {e.url for e in engines}
    workers[1].state.weight_version, workers[1].state.keep_version = "default", True  # restarted; the load
    with pytest.raises(WeightSyncError, match=rf"phase 'verify' on {engines[1].url}: .*'default', expected '3'"):
        await sync.load_current(engines[1])  # does not take: refused, naming the engine


async def test_engines_dying_during_a_sync_get_the_version_when_they_come_back(
        tmp_path: Path, workers: list[FakeWorker], engines: list[SGLangEngine]) -> None:
    """Every engine is in rotation when the sync starts and dies during it (its load fails, and it has
    left the rotation when the sync judges): the sync does not fail the run; the version is current
    and each engine loads it on its return. An engine that fails while still in rotation does fail it."""
    dead = {"now": False}

    async def serving(engine: SGLangEngine) -> bool:
        return not dead["now"]

    def export_then_die(folder: Path) -> None:
        write_model(folder)
        for w in workers:
            w.state.fail_updates = -1
        dead["now"] = True

    sync = DiskWeightSync(engines, tmp_path, FAST, eligible=serving)
    await sync.sync(1, write_model)
    report = await sync.sync(2, export_then_die)
    assert report.engines_updated == () and len(report.engines_recovering) == 2 and sync.current == 2
    assert report.to_metrics()["sync/engines_recovering"] == 2.0 and report.engines_removed == ()
    for w in workers:
        w.state.fail_updates = 0
    dead["now"] = False
    assert await sync.load_current(engines[0]) == "2" and workers[0].state.weight_version == "2"
    for w in workers:
        w.state.fail_updates = -1
    with pytest.raises(WeightSyncError, match=r"phase 'load'"):  # alive and in rotation: a real failure
        await sync.sync(3, write_model)


class _Pusher:
    """A pusher standing for the trainer: sets the workers' version, or fails as told."""

    def __init__(self, workers: list[FakeWorker], *, fail: str | None = None, moved: bool = False) -> None:
        self.workers, self.fail, self.moved = workers, fail, moved
        self.calls: list[tuple[int, list[str], bool]] = []

    async def push(self, version: int, targets: list[Any], *, flush: bool, exact: bool) -> dict[str, Any]:
        self.calls.append((version, [t.url for t in targets], exact))
        if self.moved:
            return {"moved": True, "errors": {}}
        if self.fail == "raise":
            raise RuntimeError("the train actor died")
        errors: dict[str, str | None] = {}
        for w in self.workers:
            if any(t.url == w.url for t in targets):
                if self.fail == w.state.name:
                    errors[w.url] = "broadcast failed: connection reset by peer"
                else:
                    w.state.weight_version = str(version)
        return {"errors": errors, "bytes": 1024, "buckets": 2, "timings": {"fill_s": 0.01, "transfer_s": 0.02}}


def _push_sync(tmp_path: Path, engines: list[SGLangEngine], pusher: _Pusher,
               removed: list[str] | None = None) -> DiskWeightSync:
    from agentrl.runner.weight_push import PushTarget
    from agentrl.runner.weight_transports import PushLoad

    return DiskWeightSync(engines, tmp_path, FAST, on_remove=(lambda e: removed.append(e.url)) if removed is not None
                          else None, transport=PushLoad("distributed", pusher, lambda e: PushTarget(url=e.url)))


async def test_a_push_runs_inside_sglangs_session_and_writes_nothing(tmp_path: Path, workers: list[FakeWorker],
                                                                    engines: list[SGLangEngine]) -> None:
    pusher = _Pusher(workers)
    report = await _push_sync(tmp_path, engines, pusher).sync(3)
    assert report.folder is None and not any(tmp_path.iterdir())
    assert set(report.engines_updated) == {e.url for e in engines}
    [(version, urls, exact)] = pusher.calls  # one push to every engine at once
    assert (version, sorted(urls), exact) == (3, sorted(e.url for e in engines), False)
    metrics = report.to_metrics()
    assert metrics["sync/method_distributed"] == 1.0 and metrics["sync/bytes"] == 1024.0
    assert metrics["sync/push_buckets"] == 2.0 and metrics["sync/push_transfer_s"] == 0.02
    for w in workers:
        calls = [c for c in w.state.control_calls if c != "/continue_generation"]
        assert calls == ["/pause_generation", "/begin_weight_update", "/end_weight_update"]
        assert not w.state.in_update_session


@pytest.mark.parametrize("fail", ["w1", "raise"])
async def test_a_push_that_broke_off_is_not_retried_and_its_engines_are_taken_out(
        tmp_path: Path, workers: list[FakeWorker], engines: list[SGLangEngine], fail: str) -> None:
    """An engine a push reached and did not finish holds part of the weights (or is blocked in a dead
    trainer's broadcast): taken out at once, its session closed; a retry would only wait on it."""
    removed: list[str] = []
    pusher = _Pusher(workers, fail=fail)
    sync = _push_sync(tmp_path, engines, pusher, removed)
    if fail == "raise":  # no engine took the version: the run stops, naming the push
        with pytest.raises(WeightSyncError, match=r"push failed: RuntimeError: the train actor died"):
            await sync.sync(4)
    else:
        report = await sync.sync(4)
        assert report.engines_updated == (engines[0].url,) and report.engines_removed == (engines[1].url,)
        assert removed == [engines[1].url] and report.retries == 0
    assert len(pusher.calls) == 1
    assert all(not w.state.in_update_session for w in workers)


async def test_a_restarted_engine_is_pushed_the_current_version_only_while_the_trainer_holds_it(
        tmp_path: Path, workers: list[FakeWorker], engines: list[SGLangEngine]) -> None:
    from agentrl.runner.weight_transports import WeightsMovedError

    pusher = _Pusher(workers)
    sync = _push_sync(tmp_path, engines, pusher)
    await sync.sync(5)
    workers[1].state.weight_version = "default"  # restarted on the base weights
    assert await sync.load_current(engines[1]) == "5" and pusher.calls[-1] == (5, [engines[1].url], True)
    pusher.moved = True
    with pytest.raises(WeightsMovedError, match=r"moved past version 5"):
        await sync.load_current(engines[1])
