"""Routing replay on the torch backend (agentrl.train.moe): a Qwen3-MoE forward that replays given
experts equals a Hugging Face forward forced to those experts (computed here by hand from the
experts' weights), logprobs and router gradients alike; activation recompute and the shared-prefix
path replay the same; the routing figures count what differs; bad routing and unsupported models
are refused with the reason."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from agentrl.algorithms import RoutingReplay
from agentrl.testing import TINY_MOE_MODEL_CONFIG, build_tokenizer
from agentrl.token_data import ROUTED_EXPERTS
from agentrl.train import (
    LoraSettings,
    LossConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    build_training_batch,
)
from agentrl.train.moe import MoeRouting, check_moe_model
from agentrl.trajectory import Status, Trajectory

LAYERS, TOP_K, EXPERTS = 2, 2, 8


def moe_model(seed: int = 0) -> Qwen3MoeForCausalLM:
    vocab = (len(build_tokenizer()) + 63) // 64 * 64
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=vocab, **TINY_MOE_MODEL_CONFIG))
    model.set_experts_implementation("eager")  # float64: the by-hand reference and the backend alike
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.1)
    return model.to(torch.float64)


def own_routing(model: Qwen3MoeForCausalLM, ids: list[int]) -> np.ndarray:
    """[T, layers, top_k]: the experts the unpatched model picks for ``ids`` (its own router)."""
    picked: dict[int, torch.Tensor] = {}
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, out, i=i: picked.__setitem__(i, out[2]))
             for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return np.stack([picked[i].numpy() for i in range(LAYERS)], axis=1).astype(np.uint8)


def forced_logprobs(model: Qwen3MoeForCausalLM, ids: list[int], experts: np.ndarray) -> torch.Tensor:
    """Log-probs of ``ids[1:]`` with every MoE block's output replaced by a by-hand mixture of the
    ``experts`` given ([T, layers, top_k]) weighted by the router's softmax taken at them."""
    forced = torch.as_tensor(experts.astype(np.int64))

    def mixture(layer: int):
        def hook(block, args, output):
            x = args[0].reshape(-1, args[0].shape[-1])
            probs = torch.softmax(x @ block.gate.weight.T, dim=-1, dtype=torch.float64)
            out = torch.zeros_like(x)
            for t in range(x.shape[0]):
                chosen = forced[t, layer]
                weights = probs[t, chosen] / probs[t, chosen].sum()
                for w, e in zip(weights, chosen.tolist(), strict=True):
                    gate, up = (block.experts.gate_up_proj[e] @ x[t]).chunk(2)
                    out[t] = out[t] + w * (block.experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up))
            return out.reshape(output.shape)
        return hook

    hooks = [layer.mlp.register_forward_hook(mixture(i)) for i, layer in enumerate(model.model.layers)]
    try:
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0]
    finally:
        for h in hooks:
            h.remove()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def trajectory(ids: list[int], experts: np.ndarray | None, prompt: int = 4, *, reward: float = 1.0,
               rid: str = "r0") -> Trajectory:
    tr = Trajectory.from_prompt(ids[:prompt], group_id="g", rollout_id=rid, sample_id=rid)
    tr.append_model(ids[prompt:], [-1.0] * (len(ids) - prompt))
    if experts is not None:  # as an engine returns it: every position but the last sampled token's
        tr.write_channel(ROUTED_EXPERTS, 0, experts[: len(ids) - 1])
    tr.finish(Status.COMPLETED)
    tr.reward = reward
    return tr


def backend(model: Qwen3MoeForCausalLM, replay: str, **config: object) -> TorchTrainBackend:
    return TorchTrainBackend(model, TorchBackendConfig(device="cpu", dtype="float64", loss=LossConfig(
        routing_replay=RoutingReplay(replay)), **config))  # type: ignore[arg-type]


IDS = [5, 17, 300, 42, 9, 81, 1000, 7, 64, 128, 256, 3, 11, 19]


def permuted(model: Qwen3MoeForCausalLM) -> np.ndarray:
    """The model's own experts for IDS shifted by 3: every position routed elsewhere."""
    return ((own_routing(model, IDS).astype(np.int64) + 3) % EXPERTS).astype(np.uint8)


def test_replayed_experts_equal_a_forward_forced_to_them_in_logprobs_and_router_gradient() -> None:
    reference = moe_model()
    trained = backend(copy.deepcopy(reference), "rollout")
    experts = permuted(reference)
    batch = build_training_batch([trajectory(IDS, experts)])
    replayed = torch.tensor(trained.compute_logprobs(batch)[0][1:], dtype=torch.float64)
    expected = forced_logprobs(reference, IDS, experts[:-1])
    assert float((replayed - expected.detach()).abs().max()) < 1e-6  # (RMSNorm runs in float32 in HF)
    own = forced_logprobs(reference, IDS, own_routing(reference, IDS)[:-1])
    assert float((replayed - own.detach()).abs().max()) > 1e-3  # replay changed the result: not recomputed routing

    # the router gets a gradient through the replayed experts' gate weights, the one a forced forward gets
    mb = trained._plan(batch, None)[0]
    lp, _, _ = trained.scorer.scores(trained.model, mb)
    lp.sum().backward()
    expected.sum().backward()
    for ours, theirs in zip(trained.model.model.layers, reference.model.layers, strict=True):
        assert ours.mlp.gate.weight.grad is not None and float(ours.mlp.gate.weight.grad.abs().max()) > 1e-6
        assert torch.allclose(ours.mlp.gate.weight.grad, theirs.mlp.gate.weight.grad, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_recompute_replays_the_same_experts(mode: str) -> None:
    reference = moe_model()
    experts = permuted(reference)
    batch = build_training_batch([trajectory(IDS, experts), trajectory(IDS[::-1], permuted(reference)[::-1],
                                                                       rid="r1", reward=0.0)])
    grads = []
    for checkpointing in ("none", mode):
        trained = backend(copy.deepcopy(reference), "rollout", activation_checkpointing=checkpointing)
        trained.forward_backward(batch)
        grads.append({n: p.grad.clone() for n, p in trained.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any("gate.weight" in n for n in grads[0])
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-12), name


def test_a_shared_prefix_runs_once_when_its_routing_agrees_and_per_sequence_when_not() -> None:
    reference = moe_model()
    prompt = list(range(40, 80))  # 40 shared tokens
    seqs = [[*prompt, 7, 8, 9, 10], [*prompt, 11, 12, 13]]
    own = [own_routing(reference, s) for s in seqs]
    shifted = [((o.astype(np.int64) + 1) % EXPERTS).astype(np.uint8) for o in own]
    other_prefix = shifted[1].copy()
    other_prefix[:40] = own[1][:40]  # the second sequence's engine routed the shared prompt differently
    for routing, runs_once in ((shifted, True), ([shifted[0], other_prefix], False)):
        batch = build_training_batch([trajectory(s, r, prompt=40, rid=f"r{i}", reward=float(i))
                                      for i, (s, r) in enumerate(zip(seqs, routing, strict=True))])
        shared = backend(copy.deepcopy(reference), "rollout", shared_prefix_min_tokens=8)
        plain = backend(copy.deepcopy(reference), "rollout", shared_prefix=False)
        assert shared.shared_prefix and (shared._plan(batch, None)[0].prefix is not None) == runs_once
        got, want = shared.compute_logprobs(batch), plain.compute_logprobs(batch)
        for a, b in zip(got, want, strict=True):
            assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-9
        for s, r, lp in zip(seqs, routing, got, strict=True):
            forced = forced_logprobs(reference, s, r[:-1]).detach()
            assert float((torch.tensor(lp[1:], dtype=torch.float64) - forced).abs().max()) < 1e-6


def test_the_step_counts_tokens_whose_routing_differs_and_replay_leaves_none() -> None:
    reference = moe_model()
    engine = own_routing(reference, IDS)
    engine[2:5] = (engine[2:5].astype(np.int64) + 1) % EXPERTS  # 3 positions routed elsewhere by the engine
    other = list(range(100, 110))
    batch_of = lambda: build_training_batch([trajectory(IDS, engine, reward=1.0),  # noqa: E731
                                             trajectory(other, None, rid="r1", reward=0.0)])
    off = backend(copy.deepcopy(reference), "off").train_step(batch_of())
    on = backend(copy.deepcopy(reference), "rollout").train_step(batch_of())
    routed = len(IDS) - 1
    assert off["moe/routed_tokens"] == on["moe/routed_tokens"] == routed
    assert off["moe/unrouted_tokens"] == on["moe/unrouted_tokens"] == len(other) - 1  # no routing: counted
    assert math.isclose(off["moe/routing_differs"], 3 / routed) and off["moe/replay"] == 0.0
    assert on["moe/routing_differs"] == 0.0 and math.isclose(on["moe/router_disagrees"], 3 / routed)
    assert on["moe/replay"] == 1.0


def test_bad_routing_is_refused_with_the_reason() -> None:
    reference = moe_model()
    trained = backend(copy.deepcopy(reference), "rollout")
    wrong_layers = np.zeros((len(IDS), 3, TOP_K), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"rows of shape \(3, 2\); expected \(2, 2\)"):
        trained.compute_logprobs(build_training_batch([trajectory(IDS, wrong_layers)]))
    too_big = np.full((len(IDS), LAYERS, TOP_K), 9, dtype=np.uint8)
    with pytest.raises(ValueError, match=r"ids in \[9, 9\]; expected ids in \[0, 8\)"):
        trained.compute_logprobs(build_training_batch([trajectory(IDS, too_big)]))


def test_unsupported_moe_models_and_adapters_are_refused() -> None:
    with pytest.raises(ValueError, match=r"Qwen3.5-MoE .* not supported yet"):
        check_moe_model({"model_type": "qwen3_5_moe", "text_config": {"num_experts": 256}})
    with pytest.raises(ValueError, match="'mixtral' is a mixture-of-experts model"):
        check_moe_model({"model_type": "mixtral", "num_local_experts": 8})
    check_moe_model({"model_type": "qwen3", "hidden_size": 64})  # dense: fine
    assert MoeRouting.install(torch.nn.Linear(2, 2)) is None
    with pytest.raises(ValueError, match=r"LoRA adapts attention only; expected some of .*not \['down_proj'"):
        TorchTrainBackend(moe_model(), TorchBackendConfig(device="cpu", lora=LoraSettings()))
    attention_only = TorchTrainBackend(moe_model(), TorchBackendConfig(
        device="cpu", dtype="float64", lora=LoraSettings(target_modules=("q_proj", "v_proj"))))
    assert attention_only.adapter is not None and attention_only.routing is not None


def test_weights_sync_under_the_checkpoints_per_expert_names() -> None:
    from safetensors.torch import load_file

    from agentrl.testing import build_tiny_moe_model

    folder = build_tiny_moe_model()
    trained = TorchTrainBackend.from_pretrained(folder, TorchBackendConfig(device="cpu", dtype="bfloat16",
                                                                          master_weights="none"))
    synced = dict(trained.named_weights())
    on_disk = load_file(str(folder / "model.safetensors"))
    assert synced.keys() == on_disk.keys()  # model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight, router, ...
    for name, tensor in on_disk.items():
        assert torch.equal(synced[name], tensor), name


def test_the_viewer_shows_where_the_trainers_routing_differs() -> None:
    from agentrl.inspect import trajectory_html
    from agentrl.token_data import ROUTING_DIFFERS
    from agentrl.train.moe import mark_routing_differences

    reference = moe_model()
    engine = own_routing(reference, IDS)
    engine[[2, 5], 1] = (engine[[2, 5], 1].astype(np.int64) + 1) % EXPERTS  # layer 1 of two positions
    traj = trajectory(IDS, engine)
    trained = backend(copy.deepcopy(reference), "off")
    assert mark_routing_differences(trained, [traj]) == 2
    differs = traj.channels[ROUTING_DIFFERS]
    assert differs.present[:-1].all() and not differs.present[-1]
    assert [int(v) for v in differs.values[:-1]] == [1 if p in (2, 5) else 0 for p in range(len(IDS) - 1)]
    page = trajectory_html(traj)
    assert page.count(' rd"') == 2 and page.count(' nr"') == 1  # two red marks; the last token has no routing
    assert 'data-d="1"' in page and "L0: " in page and "routing</label>" in page
