"""Worker processes for the megatron backend tests: each launch runs several scenarios in one world.

A scenario builds the backend for one layout (TP, PP, DP, tied or untied embeddings) from a tiny
Qwen3, records what the tests compare (exports, logprobs, logits, metrics, weights after steps)
and saves it from global rank 0. The parent test process computes the Hugging Face and torch
backend references itself (it has no process group, so the torch backend is single-process there).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _train_helpers import trajectories, vocab_size
from transformers import Qwen3Config, Qwen3ForCausalLM

from agentrl.testing import TINY_MODEL_CONFIG
from agentrl.testing.ranks import start_ranks
from agentrl.train import LossConfig, OptimizerConfig, PackingConfig, TrainingBatch, build_training_batch
from agentrl.train.distributed import host_tcp_store
from agentrl.trajectory import Status, Trajectory

LOSS = LossConfig(old_logprobs="recompute", eps_clip_high=0.28, entropy_coef=0.01)
# Adam's first step moves every weight by about lr·g/(|g| + eps): where |g| is at float32 noise level
# (rows of rarely predicted tokens, ~1e-8) that ratio depends on summation order, so weights can differ
# by up to ~lr between two correct backends. lr 1e-4 keeps that below the 1e-5 comparison while every
# weight still moves by ~1e-4 (lr 1e-3 gave 1.3e-5 at TP=2).
OPTIMIZER = OptimizerConfig(lr=1e-4, grad_clip=1.0)
PACKING = PackingConfig(max_tokens=48)
# The tiny model has 1792 rows = 7 × 256: no padding at TP=1, 256 padding rows at TP=2 (multiple of 512).
VOCAB_MULTIPLE = 256


def hf_model(tied: bool) -> Qwen3ForCausalLM:
    """The tiny Qwen3 (head_dim 32 ≠ hidden/heads), float32; the untied one has its own lm_head."""
    vocab = (vocab_size() + 63) // 64 * 64
    torch.manual_seed(0 if tied else 1)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, **{**TINY_MODEL_CONFIG, "tie_word_embeddings": tied}))
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 0.1)  # a non-uniform next-token distribution
    return model.float().eval()


def batches() -> dict[str, TrainingBatch]:
    """``full``: fan-out groups; ``masked``: two rollouts, one with no trainable token (so one DP
    rank, or one micro-batch, has nothing to train on); ``single``: one sequence (an idle DP rank)."""
    masked = Trajectory.from_prompt([5, 6, 7], group_id="g0", rollout_id="masked")
    masked.append_env([8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], kind="tool")
    masked.finish(Status.COMPLETED)
    masked.reward = 0.0
    return {
        "full": build_training_batch(trajectories(2, 3, seed=21, fan_out=True)),
        "masked": build_training_batch([masked, *trajectories(1, 1, seed=23)]),
        "single": build_training_batch(trajectories(1, 2, seed=22)[:1]),
    }


def probe_row() -> tuple[torch.Tensor, torch.Tensor]:
    """Two packed sequences (7 and 5 tokens) for the logits comparison."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab_size(), (12,), generator=gen)
    return ids, torch.cat([torch.arange(7), torch.arange(5)])


def _gather_logits(backend: Any) -> torch.Tensor | None:
    from agentrl.train.megatron import packed_forward
    from agentrl.train.megatron.schedule import unwrap

    layout = backend.layout
    if layout.pp_size > 1:
        return None
    ids, pos = probe_row()
    with torch.no_grad():
        local = packed_forward(unwrap(backend.model), ids, pos, attention=backend.attention)
    parts = [torch.empty_like(local) for _ in range(layout.tp_size)]
    torch.distributed.all_gather(parts, local.contiguous(), group=layout.tp_group)
    return torch.cat(parts, dim=-1)


def _isolation(backend: Any) -> float | None:
    """Max |change| of the second packed document's logits when the first one's tokens change
    (0.0: the documents cannot see each other). None on pipeline-parallel layouts."""
    from agentrl.train.megatron import packed_forward
    from agentrl.train.megatron.schedule import unwrap

    if backend.layout.pp_size > 1:
        return None
    ids, pos = probe_row()
    changed = ids.clone()
    changed[:7] = (changed[:7] + 11) % vocab_size()
    outs = []
    with torch.no_grad():
        for row in (ids, changed):
            local = packed_forward(unwrap(backend.model), row, pos, attention=backend.attention)
            outs.append(local[7:])
    return float((outs[0] - outs[1]).abs().max())


def _main_grads(backend: Any) -> dict[str, torch.Tensor]:
    from agentrl.train.megatron.schedule import unwrap

    return {name: p.main_grad.detach().clone() for name, p in unwrap(backend.model).named_parameters()}


def loss_config(kl: bool) -> LossConfig:
    """The shared loss, or with a KL penalty to the frozen initial weights (reference logprobs)."""
    return dataclasses.replace(LOSS, kl_loss_coef=0.1) if kl else LOSS


def scenario(tp: int, pp: int, tied: bool, steps: tuple[str, ...], *, kl: bool = False,
             checkpoint_dir: Path | None = None, recompute: str = "none", attention: str = "auto",
             fused: bool = True, grads: bool = False, export_dir: Path | None = None) -> dict[str, Any]:
    """Build, export (round trip), score, train ``steps`` batches, export again; optionally check resume.
    ``grads``: keep the first step's gradients (Megatron's main grads, before the optimizer)."""
    from megatron.core import parallel_state

    from agentrl.train.megatron import MegatronBackendConfig, MegatronTrainBackend

    model = hf_model(tied)
    config = MegatronBackendConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp, device="cpu",
                                   make_vocab_size_divisible_by=VOCAB_MULTIPLE,
                                   packing=PACKING, loss=loss_config(kl), optimizer=OPTIMIZER,
                                   activation_checkpointing=recompute, attention=attention,  # type: ignore[arg-type]
                                   fused_lm_head=fused, export_dtype="bfloat16" if export_dir else "auto")
    backend = MegatronTrainBackend(model.state_dict(), model.config, config, with_ref_model=kl)
    out: dict[str, Any] = {"padded_vocab": backend.padded_vocab}
    out["export0"] = {k: v.clone() for k, v in backend.named_weights()}
    out["logits"] = _gather_logits(backend)
    out["isolation"] = _isolation(backend)
    if export_dir is not None:  # written in bfloat16 (the serving dtype) by a float32 trainer
        import json

        from safetensors import safe_open

        from agentrl.testing import build_tokenizer

        backend.export_hf(export_dir, tokenizer=build_tokenizer())
        if torch.distributed.get_rank() == 0:
            with safe_open(str(export_dir / "model.safetensors"), "pt") as f:
                out["export_dtypes"] = sorted({str(f.get_tensor(n).dtype) for n in f.keys()})
            out["export_config_dtype"] = json.loads((export_dir / "config.json").read_text())["dtype"]
    data = batches()
    out["logprobs"] = backend.compute_logprobs(data["full"])
    out["metrics"] = []
    calls = {"linear_qkv": 0, "linear_fc1": 0}  # the first step's forwards of layer 0's first projections
    from agentrl.train.megatron.schedule import unwrap

    layer = unwrap(backend.model).decoder.layers[0]
    hooks = [sub.register_forward_hook(lambda *_, n=n: calls.__setitem__(n, calls[n] + 1))
             for n, sub in (("linear_qkv", layer.self_attention.linear_qkv), ("linear_fc1", layer.mlp.linear_fc1))]
    for i, name in enumerate(steps):
        if checkpoint_dir is not None and i == len(steps) - 1:
            backend.save_checkpoint(checkpoint_dir)
        # "sft-<batch>": a supervised step on that batch; otherwise an RL step
        metrics = backend.forward_backward(data[name.removeprefix("sft-")],
                                           objective="sft" if name.startswith("sft-") else "policy")
        if grads and i == 0:
            out["grads"] = _main_grads(backend)
        if i == 0:
            out["layer_calls"] = dict(calls)
            for hook in hooks:
                hook.remove()
        metrics.update(backend.optim_step())
        out["metrics"].append(metrics)
        out[f"export_after_{i + 1}"] = {k: v.clone() for k, v in backend.named_weights()}
    out["export1"] = out[f"export_after_{len(steps)}"]
    if checkpoint_dir is not None:  # resume before the last step and redo it: the same weights, bitwise
        backend.load_checkpoint(checkpoint_dir)
        assert not steps[-1].startswith("sft-")
        out["resumed_metrics"] = backend.train_step(data[steps[-1]])
        out["resumed"] = {k: v.clone() for k, v in backend.named_weights()}
    del backend
    parallel_state.destroy_model_parallel()
    return out


def _dense(out_dir: str, key: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    ckpt = kwargs.pop("checkpoint", False)
    export = kwargs.pop("export", False)
    return scenario(**kwargs, checkpoint_dir=Path(out_dir) / f"ckpt-{key}" if ckpt else None,
                    export_dir=Path(out_dir) / f"export-{key}" if export else None)


Scenario = Callable[[str, str, dict[str, Any]], dict[str, Any]]


def _worker(rank: int, world_size: int, port: int, out_dir: str, plan: list[tuple[str, dict[str, Any]]],
            run: Scenario) -> None:
    import _megatron_cpu

    _megatron_cpu.install()
    from agentrl.train import init_process_group

    torch.set_num_threads(1)
    init_process_group(rank, world_size, port, torch.device("cpu"), timeout_s=120, hosted=True)
    try:
        results: dict[str, Any] = {}
        timings: dict[str, float] = {}
        for key, kwargs in plan:
            started = time.perf_counter()
            results[key] = run(out_dir, key, kwargs)
            timings[key] = time.perf_counter() - started
        if rank == 0:
            torch.save({"results": results, "timings": timings}, Path(out_dir) / "results.pt")
    finally:
        torch.distributed.destroy_process_group()



def launch_plan(world_size: int, plan: list[tuple[str, dict[str, Any]]], out_dir: Path, *, timeout_s: float,
                scenario: Scenario) -> dict[str, Any]:
    """Run each ``(key, kwargs)`` of ``plan`` through ``scenario(out_dir, key, kwargs)`` on ``world_size``
    spawned gloo processes (the CPU shim installed); kill them and raise after ``timeout_s``."""
    store = host_tcp_store(world_size, timeout_s=300)  # bound before the ranks start: no port race
    ctx = start_ranks(_worker, (world_size, store.port, str(out_dir), plan, scenario), world_size)
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                proc.kill()
            raise TimeoutError(f"megatron workers (world size {world_size}) did not finish within {timeout_s:.0f} s")
    loaded: dict[str, Any] = torch.load(out_dir / "results.pt", weights_only=False)
    return loaded


def launch(world_size: int, plan: list[tuple[str, dict[str, Any]]], out_dir: Path, *, timeout_s: float
           ) -> dict[str, Any]:
    """Run the dense scenarios of ``plan`` on ``world_size`` spawned gloo processes."""
    return launch_plan(world_size, plan, out_dir, timeout_s=timeout_s, scenario=_dense)
