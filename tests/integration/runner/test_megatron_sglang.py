"""``train.backend = "megatron"`` at TP=2 on CPU: one training step, then disk weight sync to a real
SGLang engine serving the tiny Qwen3.

Two spawned gloo ranks (with the test-only megatron CPU shim) each build the run's train service
from a :class:`RunConfig`, score probe sequences, take one GRPO step, score again and export the
weights (rank 0 writes). The parent checks, on a real CPU SGLang engine in float32 (the session's
shared engine, given back the tiny model's weights): its logprobs
match the megatron trainer's before the step (same weights, different kernels: bound 1e-3 as in
the torch backend's sync test), it loads the exported folder through :class:`DiskWeightSync`,
and then matches the trainer's post-step logprobs, which moved far beyond the bound.
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.rollout import SGLangEngine
from agentrl.rollout.client import ClientConfig, InferenceClient
from agentrl.runner.probe import LogprobProbe, logprob_mismatch, probe_sequences
from agentrl.runner.weights import DiskWeightSync, WeightSyncConfig
from agentrl.testing import build_tiny_model
from agentrl.testing.ranks import start_ranks
from agentrl.train.distributed import host_tcp_store

pytestmark = [
    pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900),
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed"),
]

BOUND = 1e-3
SHIM_DIR = Path(__file__).resolve().parents[2] / "unit" / "train"


def _batch(vocab: int) -> Any:
    from agentrl.train import TrainingBatch, TrainSequence

    rng = random.Random(0)
    seqs = []
    for i in range(8):
        n = rng.randint(12, 24)
        mask = [0] * 4 + [1] * (n - 4)
        adv = 1.0 if i % 2 else -1.0
        seqs.append(TrainSequence(tokens=[rng.randrange(vocab) for _ in range(n)], loss_mask=mask,
                                  rollout_logprobs=[-1.0 * m for m in mask], advantages=[adv * m for m in mask],
                                  rollout_id=f"r{i}", group_id="g0", reward=adv, denominator=float(sum(mask))))
    return TrainingBatch.from_sequences(seqs)


def _worker(rank: int, port: int, model: str, out_dir: str, probes: list[list[int]]) -> None:
    sys.path.insert(0, str(SHIM_DIR))
    import _megatron_cpu

    _megatron_cpu.install()
    from agentrl.runner.config import RunConfig
    from agentrl.runner.trainer import TrainService
    from agentrl.train import init_process_group

    init_process_group(rank, 2, port, torch.device("cpu"), timeout_s=120, hosted=True)
    try:
        config = RunConfig.from_dict({
            # the engine serves float32; the run exports in model.dtype (bfloat16 by default)
            "model": {"path": model, "dtype": "float32"}, "data": {"train": {"path": "unused.jsonl"}},
            "environment": {"name": "toy_arithmetic"},
            "train": {"backend": "megatron", "tensor_parallel_size": 2, "steps": 1, "optimizer": {"lr": 1e-2}},
        })
        service = TrainService.from_config(config, threads=1)
        before = service.score(probes)
        metrics = service.train(_batch(service.backend.spec.vocab_size), step=0)
        after = service.score(probes)
        service.export(Path(out_dir) / "export")
        if rank == 0:
            torch.save({"before": before, "after": after, "metrics": metrics}, Path(out_dir) / "trainer.pt")
    finally:
        torch.distributed.destroy_process_group()



def _train(model: Path, out: Path, probes: list[list[int]], timeout_s: float = 300) -> dict[str, Any]:
    store = host_tcp_store(2, timeout_s=300)  # bound before the ranks start: no port race
    ctx = start_ranks(_worker, (store.port, str(model), str(out), probes), 2)
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail(f"megatron TP=2 trainer ranks did not finish within {timeout_s:.0f} s")
    result: dict[str, Any] = torch.load(out / "trainer.pt", weights_only=False)
    return result


def _mean_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return logprob_mismatch([v for row in a for v in row[1:]], [v for row in b for v in row[1:]])["mean"]


async def test_megatron_tp2_step_then_disk_sync_to_sglang(tmp_path: Path, tok: Any, tiny_engine: str) -> None:
    model = build_tiny_model()
    probes = probe_sequences(tok, n=4, length=32, seed=0)
    trained = await asyncio.to_thread(_train, model, tmp_path, probes)
    assert trained["metrics"]["train/loss"] != 0.0 and trained["metrics"]["train/skipped"] == 0.0
    moved = _mean_diff(trained["before"], trained["after"])
    assert moved > 20 * BOUND, moved

    engine = await SGLangEngine.attach(tiny_engine)  # the session's float32 engine, on the tiny model's weights
    async with InferenceClient(ClientConfig(base_url=engine.url, max_retries=0)) as client:
        probe = LogprobProbe(probes, bound=BOUND, prompt_length=1)
        engine_before, _ = await probe.engine_logprobs(client)
        before = logprob_mismatch([v for r in engine_before for v in r],
                                  [v for r in trained["before"] for v in r[1:]])
        print(f"\nengine vs megatron (TP=2) before the step: {before}")
        assert before["mean"] <= BOUND

        sync = DiskWeightSync([engine], tmp_path / "weights", WeightSyncConfig())
        report = await sync.sync(1, lambda folder: shutil.copytree(tmp_path / "export", folder,
                                                                    dirs_exist_ok=True))
        assert report.engines_updated == (engine.url,) and await engine.weight_version() == "1"
        engine_after, version = await probe.engine_logprobs(client)
        after = logprob_mismatch([v for r in engine_after for v in r], [v for r in trained["after"] for v in r[1:]])
        print(f"engine vs megatron after the step and the sync: {after}; the step moved {moved:.4f}")
        assert version == "1" and after["mean"] <= BOUND
