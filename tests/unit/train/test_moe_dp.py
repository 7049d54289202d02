"""A Qwen3-MoE with routing replay sharded over two gloo processes (FSDP2, float32, full activation
checkpointing) equals one process: loss, logprobs, gradients (routers included) and the step's
routing figures summed over the ranks."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from agentrl.algorithms import RoutingReplay
from agentrl.testing import TINY_MOE_MODEL_CONFIG, build_tokenizer
from agentrl.testing.ranks import start_ranks
from agentrl.token_data import ROUTED_EXPERTS
from agentrl.train import (
    LossConfig,
    PackingConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    build_training_batch,
)
from agentrl.train.distributed import host_tcp_store
from agentrl.trajectory import Status, Trajectory

pytestmark = pytest.mark.slow


def moe_model() -> Qwen3MoeForCausalLM:
    vocab = (len(build_tokenizer()) + 63) // 64 * 64
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=vocab, **TINY_MOE_MODEL_CONFIG))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.1)
    return model.float()


def batch() -> object:
    """Six episodes whose engine routing is random (so replay really changes the experts)."""
    rng = np.random.default_rng(3)
    out = []
    for i in range(6):
        n = int(rng.integers(12, 30))
        ids = [int(t) for t in rng.integers(3, 1700, n)]
        tr = Trajectory.from_prompt(ids[:5], group_id=f"g{i // 3}", rollout_id=f"r{i}", sample_id=f"r{i}")
        tr.append_model(ids[5:], [-1.0] * (n - 5))
        routing = np.stack([np.stack([rng.choice(8, 2, replace=False) for _ in range(2)]) for _ in range(n - 1)])
        tr.write_channel(ROUTED_EXPERTS, 0, routing.astype(np.uint8))
        tr.finish(Status.COMPLETED)
        tr.reward = float(i % 3)
        out.append(tr)
    return build_training_batch(out)


def config(sharded: bool) -> TorchBackendConfig:
    return TorchBackendConfig(device="cpu", dtype="float32", sharding="fsdp" if sharded else "none",
                              activation_checkpointing="full" if sharded else "none",
                              packing=PackingConfig(max_tokens=48),
                              loss=LossConfig(routing_replay=RoutingReplay.ROLLOUT))


def step(backend: TorchTrainBackend) -> dict[str, torch.Tensor]:
    b = batch()
    scored = backend.compute_logprobs(b)  # type: ignore[arg-type]
    metrics = backend.forward_backward(b)  # type: ignore[arg-type]
    out = {}
    for name, p in backend.model.named_parameters():
        grad = p.grad
        full = getattr(grad, "full_tensor", None)
        out[f"grad/{name}"] = (full() if callable(full) else grad).detach().clone()
    out["loss"] = torch.tensor(metrics["loss"], dtype=torch.float64)
    out["logprobs"] = torch.tensor([v for row in scored for v in row], dtype=torch.float64)
    out["routed"] = torch.tensor(metrics["moe/routed_tokens"])
    out["router_disagrees"] = torch.tensor(metrics["moe/router_disagrees"])
    out["routing_differs"] = torch.tensor(metrics["moe/routing_differs"])
    return out


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from agentrl.train import init_process_group

    torch.set_num_threads(1)
    init_process_group(rank, world_size, port, torch.device("cpu"), timeout_s=60, hosted=True)
    try:
        backend = TorchTrainBackend(moe_model(), config(sharded=True))
        assert backend.sharded
        torch.save(step(backend), Path(out_dir) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()



def test_two_sharded_ranks_replaying_equal_one_process(tmp_path: Path) -> None:
    store = host_tcp_store(2, timeout_s=300)  # bound before the ranks start: no port race
    ctx = start_ranks(_worker, (2, store.port, str(tmp_path)), 2)
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail("workers did not finish within 240 s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    expected = step(TorchTrainBackend(copy.deepcopy(moe_model()), config(sharded=False)))
    assert float(expected["routing_differs"]) == 0.0 and float(expected["router_disagrees"]) > 0.5
    for r in range(2):
        for key, want in expected.items():
            got = ranks[r][key]
            assert torch.allclose(got.double(), want.double(), atol=1e-6, rtol=0), (r, key)
    assert any("gate.weight" in k and float(v.abs().max()) > 0 for k, v in expected.items())
