"""Disk weight sync and the post-sync probe on a real CPU SGLang engine serving the tiny Qwen3 (the
session's shared engine, given back the model's own weights as version "0").

The trainer is :class:`TorchTrainBackend` on the same model folder, both sides in float32 (the
engine casts the bf16 checkpoint on load). Its weights are perturbed (seeded noise) to stand for
a training step, exported with ``export_hf`` and loaded while requests are generating. Checked:
every engine reports the new version; in ``retract`` mode no request is aborted and the in-flight
ones span both versions; in ``abort`` mode every in-flight request is aborted and counted; the
probe passes right after a sync and fails when a trainer update was not synced. Two SGLang facts
the sync relies on are pinned too: an update without a pause waits for the running requests
(none is aborted), and an ``in_place`` pause makes the post-load cache flush fail.

Bound: engine and trainer both compute in float32, so only kernel differences remain (SGLang's
``torch_native`` attention and fused RMSNorm against HF's SDPA): measured mean |Δ| about 1e-6 on
this model; 1e-3 leaves room for other kernels and is far below what a missed update gives
(weights moved by noise of std 0.05: mean |Δ| > 0.05).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

from agentrl.rollout import EngineError, GenerateResult, SamplingParams, SGLangEngine
from agentrl.rollout.client import ClientConfig, InferenceClient
from agentrl.runner.probe import LogprobProbe, ProbeError, backend_scorer, probe_sequences
from agentrl.runner.weights import DiskWeightSync, WeightSyncConfig
from agentrl.testing import build_tiny_model
from agentrl.train import TorchTrainBackend
from agentrl.train.config import TorchBackendConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(900)]

BOUND = 1e-3
IN_FLIGHT = 6
LONG = SamplingParams(max_new_tokens=320, temperature=1.0, ignore_eos=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_engine: str) -> SGLangEngine:
    return await SGLangEngine.attach(tiny_engine)  # the session's float32 engine, weight version "0"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(engine: SGLangEngine) -> AsyncIterator[InferenceClient]:
    async with InferenceClient(ClientConfig(base_url=engine.url, max_retries=0)) as c:
        yield c


@pytest.fixture(scope="module")
def backend() -> TorchTrainBackend:
    torch.set_num_threads(1)
    return TorchTrainBackend.from_pretrained(build_tiny_model(), TorchBackendConfig(device="cpu", dtype="float32"))


def perturb(backend: TorchTrainBackend, seed: int, std: float = 0.05) -> None:
    """Stands for a training step: every parameter moves by seeded noise."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)


async def start_requests(engine: SGLangEngine, client: InferenceClient, tok: Any) -> list[asyncio.Task[GenerateResult]]:
    prompts = [tok.encode(f"request {i}: count the stars", add_special_tokens=False) for i in range(IN_FLIGHT)]
    tasks = [asyncio.ensure_future(client.generate(p, LONG)) for p in prompts]
    deadline = asyncio.get_running_loop().time() + 60
    while (active := await engine.active_requests()) < IN_FLIGHT:
        assert not any(t.done() for t in tasks), f"a request ended before all {IN_FLIGHT} were running"
        assert asyncio.get_running_loop().time() < deadline, f"{active} of {IN_FLIGHT} requests running after 60 s"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # past prefill: every request has sampled some tokens
    return tasks


def describe(results: list[GenerateResult]) -> list[tuple[str, int, tuple[tuple[str, int, int], ...]]]:
    return [(r.finish_reason.kind.value, r.completion_tokens, r.weight_version_spans) for r in results]


async def test_retract_sync_keeps_requests_and_the_probe_catches_a_skipped_sync(
        engine: SGLangEngine, client: InferenceClient, backend: TorchTrainBackend, tok: Any, tmp_path: Path) -> None:
    sync = DiskWeightSync([engine], tmp_path / "weights", WeightSyncConfig())
    probe = LogprobProbe(probe_sequences(tok, n=4, length=48, seed=0), bound=BOUND, prompt_length=1)
    perturb(backend, seed=1)
    tasks = await start_requests(engine, client, tok)
    report = await sync.sync(1, backend.export_hf)
    results = await asyncio.gather(*tasks)
    print(f"\nretract sync: export {report.export_s:.3f} s, pause {report.pause_s:.3f} s, load {report.load_s:.3f} s, "
          f"verify {report.verify_s:.3f} s, resume {report.resume_s:.3f} s, total {report.total_s:.3f} s; "
          f"in flight: {describe(results)}")
    assert report.engines_updated == (engine.url,) and await engine.weight_version() == "1"
    assert report.aborted_requests == 0
    assert [r.finish_reason.kind.value for r in results] == ["length"] * IN_FLIGHT
    assert all(r.completion_tokens == LONG.max_new_tokens for r in results)
    # the requests were mid-generation: their first tokens came from the old weights, the rest from v1
    assert any([s[0] for s in r.weight_version_spans] == ["0", "1"] for r in results), describe(results)

    passed = await probe.check(client, backend_scorer(backend), expected_version="1")
    print(f"probe after sync: {passed.describe()}")
    assert passed.n == 4 * 47 and passed.mean <= BOUND

    perturb(backend, seed=2)  # a trainer update that is never synced
    with pytest.raises(ProbeError, match="logprob probe failed") as info:
        await probe.check(client, backend_scorer(backend))
    assert info.value.report is not None
    print(f"probe after a skipped sync: {info.value.report.describe()}")
    assert info.value.report.mean > 50 * BOUND

    again = await sync.sync(2, backend.export_hf)  # syncing it makes the probe pass again
    assert (await probe.check(client, backend_scorer(backend), expected_version="2")).passed
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v000002"]
    print(f"idle sync: export {again.export_s:.3f} s, load {again.load_s:.3f} s, total {again.total_s:.3f} s")


async def test_abort_mode_aborts_and_counts_the_requests_in_flight(
        engine: SGLangEngine, client: InferenceClient, backend: TorchTrainBackend, tok: Any, tmp_path: Path) -> None:
    sync = DiskWeightSync([engine], tmp_path, WeightSyncConfig(pause_mode="abort"))
    perturb(backend, seed=3)
    tasks = await start_requests(engine, client, tok)
    report = await sync.sync(3, backend.export_hf)
    results = await asyncio.gather(*tasks)
    print(f"\nabort sync: total {report.total_s:.3f} s, aborted {report.aborted_requests}; {describe(results)}")
    assert [r.finish_reason.kind.value for r in results] == ["abort"] * IN_FLIGHT
    assert report.aborted_requests == IN_FLIGHT and await engine.weight_version() == "3"
    assert all(0 < r.completion_tokens < LONG.max_new_tokens for r in results)


async def test_sglang_update_semantics_the_sync_relies_on(
        engine: SGLangEngine, client: InferenceClient, backend: TorchTrainBackend, tok: Any, tmp_path: Path) -> None:
    folder = backend.export_hf(tmp_path / "v4")
    before = await engine.weight_version()  # "3" after the module's earlier tests; whatever it is, it holds
    # no pause, abort_all_requests=False: the update waits for the running requests, none is aborted
    tasks = await start_requests(engine, client, tok)
    await engine.update_weights_from_disk(folder, "4", abort_all_requests=False)
    finished_first = [t.done() for t in tasks]
    results = await asyncio.gather(*tasks)
    print(f"\nunpaused update: requests done before it returned: {finished_first}; {describe(results)}")
    assert all(finished_first) and [r.finish_reason.kind.value for r in results] == ["length"] * IN_FLIGHT
    assert all([s[0] for s in r.weight_version_spans] == [before] for r in results), (before, describe(results))
    assert await engine.weight_version() == "4"
    # in_place keeps requests in the running batch, so the flush that follows a load fails
    tasks = await start_requests(engine, client, tok)
    await engine.pause_generation("in_place")
    try:
        with pytest.raises(EngineError, match="cache was not flushed"):
            await engine.update_weights_from_disk(folder, "5", flush_cache=True)
    finally:
        await engine.continue_generation()
    results = await asyncio.gather(*tasks)
    assert [r.finish_reason.kind.value for r in results] == ["length"] * IN_FLIGHT
    assert await engine.weight_version() == "4"  # the failed call did not move the version label
    # so DiskWeightSync loads without the flush in in_place mode: requests survive, the version moves
    tasks = await start_requests(engine, client, tok)
    report = await DiskWeightSync([engine], tmp_path / "inplace", WeightSyncConfig(pause_mode="in_place")).sync(
        6, backend.export_hf)
    results = await asyncio.gather(*tasks)
    assert report.aborted_requests == 0 and await engine.weight_version() == "6"
    assert [r.finish_reason.kind.value for r in results] == ["length"] * IN_FLIGHT
