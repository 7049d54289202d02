"""Data parallel over two gloo processes equals a single process (float64, CPU), empty ranks included."""

from __future__ import annotations

import copy
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from _train_helpers import tiny_model, trajectories

from agentrl.train import (
    LossConfig,
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    TrainingBatch,
    build_training_batch,
)
from agentrl.trajectory import Status, Trajectory

pytestmark = pytest.mark.slow


def _config() -> TorchBackendConfig:
    return TorchBackendConfig(
        device="cpu", dtype="float64", packing=PackingConfig(max_tokens=48),
        loss=LossConfig(old_logprobs="recompute", eps_clip_high=0.28, entropy_coef=0.01),
        optimizer=OptimizerConfig(lr=1e-3, grad_clip=1.0),
    )


def _batches() -> dict[str, TrainingBatch]:
    full = build_training_batch(trajectories(3, 4, seed=21, fan_out=True))
    single = build_training_batch(trajectories(1, 1, seed=22))
    masked = Trajectory.from_prompt([5, 6, 7], group_id="g0", rollout_id="masked")
    masked.append_env([8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], kind="tool")
    masked.finish(Status.COMPLETED)
    masked.reward = 0.0
    with_masked = build_training_batch([masked, *trajectories(1, 1, seed=23)])
    return {"full": full, "single": single, "masked": with_masked}


def _step(backend: TorchTrainBackend, batch: TrainingBatch) -> dict[str, torch.Tensor]:
    scored = backend.compute_logprobs(batch)  # each rank scores its share; all ranks get everything
    metrics = backend.forward_backward(batch)
    out = {f"grad/{n}": p.grad.detach().clone() for n, p in backend.model.named_parameters() if p.grad is not None}
    out["loss"] = torch.tensor(metrics["loss"], dtype=torch.float64)
    out["logprobs"] = torch.tensor([v for row in scored for v in row], dtype=torch.float64)
    backend.optim_step()
    out.update({f"param/{n}": p.detach().clone() for n, p in backend.model.named_parameters()})
    return out


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from agentrl.train import init_process_group

    torch.set_num_threads(1)  # two processes on a small machine: no thread oversubscription
    init_process_group(rank, world_size, port, torch.device("cpu"), timeout_s=60)
    try:
        results = {}
        for name, batch in _batches().items():
            backend = TorchTrainBackend(tiny_model(0), _config())
            results[name] = _step(backend, batch)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_process_gloo_equals_single_process(tmp_path: Path) -> None:
    ctx = mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail("data-parallel workers did not finish within 240 s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    model = tiny_model(0)
    for name, batch in _batches().items():
        expected = _step(TorchTrainBackend(copy.deepcopy(model), _config()), batch)
        for key, want in expected.items():
            for r in range(2):
                assert torch.allclose(ranks[r][name][key], want, atol=1e-10, rtol=0), (name, r, key)
        assert float(expected["loss"]) != 0.0 or name == "masked"
