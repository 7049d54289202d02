"""Worker processes for the megatron MoE tests: one spawned world runs every scenario in turn.

A scenario builds the backend for one layout (EP, PP; the rest data parallel) from the tiny Qwen3-MoE,
records what the tests compare (exports, logprobs, metrics, gradients, weights) and saves it from
global rank 0. The routing the trajectories carry is Hugging Face's own, recorded by
:func:`hf_routing` the way an engine returns it (every position but the last token); the parent test
process computes the Hugging Face and torch-backend references itself.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _megatron_workers import launch_plan
from _train_helpers import trajectories, vocab_size
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from agentrl.algorithms.kinds import RoutingReplay
from agentrl.token_data import ROUTED_EXPERTS
from agentrl.train import LossConfig, OptimizerConfig, PackingConfig, TrainingBatch, build_training_batch
from agentrl.trajectory import Trajectory

LOSS = LossConfig(old_logprobs="recompute", eps_clip_high=0.28)
OPTIMIZER = OptimizerConfig(lr=1e-4, grad_clip=1.0)
PACKING = PackingConfig(max_tokens=48)
VOCAB_MULTIPLE = 256
EXPERTS, TOP_K, LAYERS = 8, 2, 2
SHIFT = 3  # the deliberately wrong routing: every expert id moved by 3 (mod 8), still k distinct ids


def hf_moe_model() -> Qwen3MoeForCausalLM:
    """The tiny Qwen3-MoE: 2 layers, 8 experts, top-2, float32; a router with spread-out scores."""
    vocab = (vocab_size() + 63) // 64 * 64
    torch.manual_seed(3)
    config = Qwen3MoeConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            num_experts=EXPERTS, num_experts_per_tok=TOP_K, norm_topk_prob=True,
                            tie_word_embeddings=True, max_position_embeddings=4096)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 0.1)
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.3)
    return model.float().eval()


def hf_routing(model: Qwen3MoeForCausalLM, tokens: list[int]) -> np.ndarray:
    """``[len(tokens) - 1, layers, top_k]`` uint8: the experts the model picks at each position but the last."""
    picked: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda _m, _i, out: picked.append(out[2]))
             for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([tokens]))
    finally:
        for hook in hooks:
            hook.remove()
    rows = torch.stack(picked, dim=1)[:-1]
    return rows.numpy().astype(np.uint8)


def _with_routing(trajs: list[Trajectory], model: Qwen3MoeForCausalLM, *, shift: int = 0) -> list[Trajectory]:
    out = []
    for traj in trajs:
        traj = copy.deepcopy(traj)
        rows = hf_routing(model, traj.tokens)
        traj.write_channel(ROUTED_EXPERTS, 0, ((rows.astype(np.int64) + shift) % EXPERTS).astype(np.uint8))
        out.append(traj)
    return out


def moe_batches(model: Qwen3MoeForCausalLM) -> dict[str, TrainingBatch]:
    """``full``: fan-out groups with the model's own routing; ``permuted``: the same with every expert id
    shifted (replay must follow it); ``missing``: one rollout without routing and one with only its
    first half (the trainer routes those positions and counts them)."""
    base = trajectories(2, 3, seed=31, fan_out=True)
    routed = _with_routing(base, model)
    partial = copy.deepcopy(base[1])
    half = len(partial.tokens) // 2
    partial.write_channel(ROUTED_EXPERTS, 0, hf_routing(model, partial.tokens)[:half])
    return {
        "full": build_training_batch(routed),
        "permuted": build_training_batch(_with_routing(base, model, shift=SHIFT)),
        "missing": build_training_batch([copy.deepcopy(base[0]), partial, *routed[2:]]),
    }


def _main_grads(backend: Any) -> dict[str, torch.Tensor]:
    from agentrl.train.megatron.schedule import unwrap

    return {name: p.main_grad.detach().clone() for name, p in unwrap(backend.model).named_parameters()}


def moe_scenario(ep: int, pp: int, *, replay: str = "rollout", recompute: str = "none", batch: str = "full",
                 steps: int = 1, checkpoint_dir: Path | None = None) -> dict[str, Any]:
    """Build, export (round trip), score ``full``, ``permuted`` and ``batch``, train ``steps`` steps on ``batch``
    (recording the first step's gradients and metrics); optionally save before the last step, resume
    and redo it."""
    from megatron.core import parallel_state

    from agentrl.train.megatron import MegatronBackendConfig, MegatronTrainBackend

    model = hf_moe_model()
    data = moe_batches(model)
    config = MegatronBackendConfig(pipeline_parallel_size=pp, expert_parallel_size=ep, device="cpu",
                                   make_vocab_size_divisible_by=VOCAB_MULTIPLE, packing=PACKING,
                                   loss=dataclasses.replace(LOSS, routing_replay=RoutingReplay(replay)),
                                   optimizer=OPTIMIZER, activation_checkpointing=recompute)  # type: ignore[arg-type]
    backend = MegatronTrainBackend(model.state_dict(), model.config, config)
    out: dict[str, Any] = {"export0": {k: v.clone() for k, v in backend.named_weights()},
                           "layout": dataclasses.replace(backend.layout, tp_group=None, pp_group=None, dp_group=None,
                                                         ep_group=None)}
    for name in sorted({"full", "permuted", batch}):
        out[f"logprobs_{name}"] = backend.compute_logprobs(data[name])
    out["metrics"] = []
    for i in range(steps):
        if checkpoint_dir is not None and i == steps - 1:
            backend.save_checkpoint(checkpoint_dir)
        metrics = backend.forward_backward(data[batch])
        if i == 0:
            out["grads"] = _main_grads(backend)
        metrics.update(backend.optim_step())
        out["metrics"].append(metrics)
    out["export1"] = {k: v.clone() for k, v in backend.named_weights()}
    if checkpoint_dir is not None:
        backend.load_checkpoint(checkpoint_dir)
        out["resumed_metrics"] = backend.train_step(data[batch])
        out["resumed"] = {k: v.clone() for k, v in backend.named_weights()}
    del backend
    parallel_state.destroy_model_parallel()
    return out


def launch_moe(world_size: int, plan: list[tuple[str, dict[str, Any]]], out_dir: Path, *, timeout_s: float
               ) -> dict[str, Any]:
    """Run ``plan`` (scenario keyword arguments; ``checkpoint: True`` adds a checkpoint folder) on
    ``world_size`` spawned gloo processes."""
    return launch_plan(world_size, plan, out_dir, timeout_s=timeout_s, scenario=_run)


def _run(out_dir: str, key: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    ckpt = kwargs.pop("checkpoint", False)
    return moe_scenario(**kwargs, checkpoint_dir=Path(out_dir) / f"ckpt-{key}" if ckpt else None)
