"""Data parallel over two gloo processes equals a single process, empty ranks included: replicated
(``sharding="none"``, float64, all-reduced gradients) and sharded (``sharding="fsdp"``, FSDP2: float32
with full activation checkpointing, and bfloat16 compute over float32 sharded master weights against
one process's float32 master weights), which holds half the optimizer state per rank."""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path

import pytest
import torch
from _train_helpers import tiny_model, trajectories

from agentrl.testing import build_tokenizer
from agentrl.testing.ranks import start_ranks
from agentrl.train import (
    LossConfig,
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    TrainingBatch,
    build_training_batch,
)
from agentrl.train.distributed import host_tcp_store
from agentrl.trajectory import Status, Trajectory

pytestmark = pytest.mark.slow


# mode: (sharding, dtype, activation checkpointing); the single-process reference is sharding "none".
MODES = {"none": ("none", "float64", "none"), "fsdp": ("fsdp", "float32", "full"),
         "fsdp-bf16": ("fsdp", "bfloat16", "none")}
TOLERANCE = {"float64": 1e-10, "float32": 1e-6, "bfloat16": 1e-6}
LR = 1e-3


def _config(mode: str = "none", *, reference: bool = False) -> TorchBackendConfig:
    sharding, dtype, ckpt = MODES[mode]
    return TorchBackendConfig(
        device="cpu", dtype=dtype, sharding="none" if reference else sharding,  # type: ignore[arg-type]
        activation_checkpointing="none" if reference else ckpt,  # type: ignore[arg-type]
        packing=PackingConfig(max_tokens=48),
        loss=LossConfig(old_logprobs="recompute", eps_clip_high=0.28, entropy_coef=0.01),
        optimizer=OptimizerConfig(lr=LR, grad_clip=1.0),
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


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full = getattr(tensor, "full_tensor", None)  # a sharded (DTensor) parameter or gradient, gathered
    return (full() if callable(full) else tensor).detach().clone()


def _state_bytes(backend: TorchTrainBackend) -> int:
    total = 0
    for state in backend.optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                local = value.to_local() if hasattr(value, "to_local") else value
                total += local.numel() * local.element_size()
    return total


def _updated(backend: TorchTrainBackend) -> dict[str, torch.Tensor]:
    """What the optimizer steps, by parameter name: float32 master weights, or the (sharded) parameters."""
    if backend.masters is not None:
        return backend.masters.state_dict()
    return {n: p for n, p in backend.model.named_parameters() if p.requires_grad}


def _step(backend: TorchTrainBackend, batch: TrainingBatch) -> dict[str, torch.Tensor]:
    scored = backend.compute_logprobs(batch)  # each rank scores its share; all ranks get everything
    metrics = backend.forward_backward(batch)
    out = {f"grad/{n}": _full(p.grad) for n, p in _updated(backend).items() if p.grad is not None}
    out["loss"] = torch.tensor(metrics["loss"], dtype=torch.float64)
    out["logprobs"] = torch.tensor([v for row in scored for v in row], dtype=torch.float64)
    backend.optim_step()
    out.update({f"param/{n}": _full(p) for n, p in _updated(backend).items()})
    out["optimizer_state_bytes"] = torch.tensor(_state_bytes(backend))
    return out


def _sharded_state(folder: Path) -> dict[str, torch.Tensor]:
    """FSDP state round trips: a checkpoint resumes to the same next step bit for bit, the export
    gathers the whole model (in bfloat16, the serving dtype), ``named_weights`` gathers each tensor."""
    batch = _batches()["full"]
    backend = TorchTrainBackend(tiny_model(0), _config("fsdp"))
    backend.train_step(batch)
    backend.save_checkpoint(folder / "ckpt")
    backend.train_step(batch)
    after = {n: _full(p) for n, p in backend.model.named_parameters()}
    fresh = TorchTrainBackend(tiny_model(5), _config("fsdp"))
    fresh.load_checkpoint(folder / "ckpt")
    fresh.train_step(batch)
    resumed = {n: _full(p) for n, p in fresh.model.named_parameters()}
    out = {f"resume_diff/{n}": (resumed[n] - a).abs().max() for n, a in after.items()}
    out.update({f"named/{n}": t.clone() for n, t in fresh.named_weights()})
    bf16 = TorchTrainBackend(tiny_model(0), dataclasses.replace(_config("fsdp"), export_dtype="bfloat16"),
                             tokenizer=build_tokenizer())
    bf16.export_hf(folder / "export")
    out.update({f"param/{n}": _full(p) for n, p in bf16.model.named_parameters()})
    return out


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from agentrl.train import init_process_group

    torch.set_num_threads(1)  # two processes on a small machine: no thread oversubscription
    init_process_group(rank, world_size, port, torch.device("cpu"), timeout_s=60, hosted=True)
    try:
        results = {}
        for mode in MODES:
            for name, batch in _batches().items():
                backend = TorchTrainBackend(tiny_model(0), _config(mode))
                assert backend.sharded == (MODES[mode][0] == "fsdp")
                results[f"{mode}/{name}"] = _step(backend, batch)
        results["fsdp/state"] = _sharded_state(Path(out_dir))
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()



@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, torch.Tensor]], Path]:
    """One two-rank gloo launch for the module: each rank's results, and the folder it wrote into."""
    folder = tmp_path_factory.mktemp("dp")
    store = host_tcp_store(2, timeout_s=300)  # bound before the ranks start: no port race
    ctx = start_ranks(_worker, (2, store.port, str(folder)), 2)
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            pytest.fail("data-parallel workers did not finish within 240 s")
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(2)], folder


def test_two_process_gloo_equals_single_process(launched: tuple[list[dict[str, torch.Tensor]], Path]) -> None:
    ranks, _ = launched
    model = tiny_model(0)
    for mode, (sharding, dtype, _) in MODES.items():
        for name, batch in _batches().items():
            expected = _step(TorchTrainBackend(copy.deepcopy(model), _config(mode, reference=True)), batch)
            worst: dict[str, float] = {}
            for key, want in expected.items():
                if key == "optimizer_state_bytes":
                    continue
                kind = key.split("/")[0]
                # Adam moves a weight by ~lr whatever its gradient: where a gradient is at float32 noise
                # level its sign depends on the summation order, so weights agree to ~2·lr only.
                tol = TOLERANCE[dtype] if kind != "param" or dtype == "float64" else 2 * LR
                for r in range(2):
                    got = ranks[r][f"{mode}/{name}"][key]
                    worst[kind] = max(worst.get(kind, 0.0), float((got.double() - want.double()).abs().max()))
                    if dtype == "bfloat16":
                        # bfloat16 forwards of rows packed differently on each rank round differently, and
                        # FSDP's masters start from the float32 weights, one process's from the bfloat16
                        # model: gradients, logprobs, loss and weights agree to bfloat16's precision.
                        rel = float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-12))
                        worst["relative"] = max(worst.get("relative", 0.0), rel)
                        assert rel <= 3e-2, (mode, name, r, key, rel)
                    else:
                        assert torch.allclose(got, want, atol=tol, rtol=0), (mode, name, r, key)
            print(f"{mode} {name} ({dtype}): max |2 ranks - 1 process| " + ", ".join(
                f"{k} {v:.1e}" for k, v in worst.items()))
            assert float(expected["loss"]) != 0.0 or name == "masked"
            state = [int(ranks[r][f"{mode}/{name}"]["optimizer_state_bytes"]) for r in range(2)]
            whole = int(expected["optimizer_state_bytes"])
            print(f"{mode} {name}: optimizer state per rank {state} bytes, one process {whole} bytes")
            if sharding == "fsdp":  # each rank holds half (FSDP pads each parameter to an even split)
                assert all(0.49 * whole <= b <= 0.52 * whole for b in state), (state, whole)
            else:
                assert state == [whole, whole]


def test_sharded_checkpoint_export_and_named_weights(launched: tuple[list[dict[str, torch.Tensor]], Path]) -> None:
    from safetensors import safe_open

    ranks, folder = launched
    for r in range(2):
        state = ranks[r]["fsdp/state"]
        diffs = {k: float(v) for k, v in state.items() if k.startswith("resume_diff/")}
        assert diffs and max(diffs.values()) == 0.0  # the resumed step equals the uninterrupted one, bitwise
        named = {k.removeprefix("named/"): v for k, v in state.items() if k.startswith("named/")}
        assert named["model.embed_tokens.weight"].shape == (1792, 64)  # whole tensors on every rank
        assert torch.equal(named["model.norm.weight"], ranks[1 - r]["fsdp/state"]["named/model.norm.weight"])
    with safe_open(str(folder / "export" / "model.safetensors"), "pt") as f:
        exported = {n: f.get_tensor(n) for n in f.keys()}
    params = {k.removeprefix("param/"): v for k, v in ranks[0]["fsdp/state"].items() if k.startswith("param/")}
    assert set(exported) == set(params) - {"lm_head.weight"}  # tied: written once
    for name, tensor in exported.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, params[name].to(torch.bfloat16)), name
