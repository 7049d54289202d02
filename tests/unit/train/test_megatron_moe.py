"""The megatron backend on a tiny Qwen3-MoE (CPU, gloo, float32): conversion, expert parallelism and
routing replay against Hugging Face and the torch backend.

One spawned launch of four processes runs every scenario (see ``_megatron_moe_workers``): EP=1 (four
data-parallel replicas), EP=2 (two expert-parallel groups of two), EP=2 × PP=2, each with the
trajectories carrying Hugging Face's own routing in their ``routed_experts`` channel; EP=2 also on a
deliberately shifted routing, EP=2 × PP=2 on it without, with full and with selective
recomputation, EP=2 on a batch where routing is missing, and EP=1 with replay off. The tests below
only read the results.
"""

from __future__ import annotations

import copy
import importlib.util
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _megatron_moe_workers import LOSS, OPTIMIZER, PACKING, SHIFT, hf_moe_model, launch_moe, moe_batches

from agentrl.token_data import ROUTED_EXPERTS
from agentrl.train import TorchBackendConfig, TorchTrainBackend, TrainingBatch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed"),
]

PLAN: list[tuple[str, dict[str, Any]]] = [
    ("ep1", {"ep": 1, "pp": 1}),
    ("ep2", {"ep": 2, "pp": 1, "batch": "permuted", "steps": 2, "checkpoint": True}),
    ("ep2pp2", {"ep": 2, "pp": 2}),
    ("ep2pp2-shifted", {"ep": 2, "pp": 2, "batch": "permuted"}),
    ("ep2pp2-recompute-full", {"ep": 2, "pp": 2, "batch": "permuted", "recompute": "full"}),
    ("ep2pp2-recompute-selective", {"ep": 2, "pp": 2, "batch": "permuted", "recompute": "selective"}),
    ("ep2-missing", {"ep": 2, "pp": 1, "batch": "missing"}),
    ("ep1-off", {"ep": 1, "pp": 1, "batch": "permuted", "replay": "off"}),
]
SETTINGS = dict(PLAN)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    started = time.perf_counter()
    out = launch_moe(4, copy.deepcopy(PLAN), tmp_path_factory.mktemp("megatron-moe"), timeout_s=300.0)
    print(f"world 4: {time.perf_counter() - started:.1f} s; scenarios (s): {out['timings']}")
    return dict(out["results"])


@pytest.fixture(scope="module")
def hf() -> Any:
    return hf_moe_model()


@pytest.fixture(scope="module")
def data(hf: Any) -> dict[str, TrainingBatch]:
    return moe_batches(hf)


def _forced_gate(gate: Any, rows: torch.Tensor) -> Any:
    """A Qwen3-MoE router that picks ``rows`` (``[T, k]``; own choice where a row is negative) and
    weighs them by the softmax of its own logits over them (``norm_topk_prob``)."""
    def forward(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = F.linear(hidden.reshape(-1, gate.hidden_dim), gate.weight)
        own = torch.topk(torch.softmax(logits, dim=-1), gate.top_k, dim=-1).indices
        idx = torch.where(rows >= 0, rows, own)
        return logits, torch.softmax(logits.gather(1, idx), dim=-1), idx
    return forward


def hf_logprobs(model: Any, batch: TrainingBatch, *, forced: bool = False) -> list[list[float]]:
    """Position-aligned logprobs of each sequence alone under Hugging Face; ``forced``: routed to the
    experts of the sequence's channel (the positions it has)."""
    out = []
    for seq in batch.sequences:
        ids = torch.tensor([seq.tokens])
        gates = [layer.mlp.gate for layer in model.model.layers]
        if forced:
            channel = seq.channels[ROUTED_EXPERTS]
            values = torch.from_numpy(channel.values.astype("int64"))
            values[~torch.from_numpy(channel.present)] = -1
            for i, gate in enumerate(gates):
                gate.forward = _forced_gate(gate, values[:, i, :])
        try:
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0].double()
        finally:
            for gate in gates:
                gate.__dict__.pop("forward", None)
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        out.append([0.0, *lp.tolist()])
    return out


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


@pytest.fixture(scope="module")
def torch_step(hf: Any, data: dict[str, TrainingBatch]) -> dict[str, Any]:
    """The torch backend's first step on ``full`` (Hugging Face routes by itself: its own routing is what
    the channel holds)."""
    backend = TorchTrainBackend(copy.deepcopy(hf), TorchBackendConfig(device="cpu", dtype="float32", packing=PACKING,
                                                                      loss=LOSS, optimizer=OPTIMIZER))
    metrics = backend.train_step(copy.deepcopy(data["full"]))
    return {"metrics": metrics, "weights": {k: v.detach().clone() for k, v in backend.model.state_dict().items()}}


def _split_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from agentrl.train.moe import per_expert_weights

    return dict(per_expert_weights(state.items()))


@pytest.mark.parametrize("key", [k for k, _ in PLAN])
def test_hf_to_megatron_to_hf_is_bit_exact_experts_and_router_included(results: dict[str, Any], hf: Any,
                                                                       key: str) -> None:
    want = _split_experts(hf.state_dict())
    want.pop("lm_head.weight")  # tied to the embedding
    got = results[key]["export0"]
    assert set(got) == set(want)
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in got and "model.layers.0.mlp.gate.weight" in got
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("key", ["ep1", "ep2", "ep2pp2"])
def test_replayed_logprobs_match_hugging_face(results: dict[str, Any], hf: Any, data: dict[str, TrainingBatch],
                                              key: str) -> None:
    err = _max_diff(results[key]["logprobs_full"], hf_logprobs(hf, data["full"]))
    print(f"{key}: max |logprob - HF| {err:.2e} (HF's routing replayed)")
    assert err <= 1e-5


@pytest.mark.parametrize("key", ["ep1", "ep2", "ep2pp2"])
def test_shifted_routing_is_replayed_not_recomputed(results: dict[str, Any], hf: Any,
                                                    data: dict[str, TrainingBatch], key: str) -> None:
    """Every expert id moved by SHIFT: the logprobs follow Hugging Face forced to the same experts and
    are far from its own routing's, so replay cannot pass by routing as the router would."""
    got = results[key]["logprobs_permuted"]
    forced = hf_logprobs(hf, data["permuted"], forced=True)
    natural = hf_logprobs(hf, data["full"])
    print(f"{key}: shifted by {SHIFT}: max |logprob - HF forced| {_max_diff(got, forced):.2e}, "
          f"HF's own routing differs by {_max_diff(forced, natural):.2e}")
    assert _max_diff(got, forced) <= 1e-5
    assert _max_diff(forced, natural) > 1e-2


@pytest.mark.parametrize("key", ["ep1", "ep2pp2"])
def test_train_step_matches_the_torch_backend(results: dict[str, Any], torch_step: dict[str, Any], key: str) -> None:
    got, want = results[key]["metrics"][0], torch_step["metrics"]
    for name in ("loss", "pg_loss", "entropy", "clipfrac"):
        assert abs(got[name] - want[name]) <= 1e-5, (name, got[name], want[name])
    assert abs(got["grad_norm"] - want["grad_norm"]) <= 1e-5 * max(1.0, want["grad_norm"])
    weights = _split_experts(torch_step["weights"])
    err = max(float((t - weights[n]).abs().max()) for n, t in results[key]["export1"].items())
    moved = max(float((results[key]["export1"][n] - t).abs().max()) for n, t in results[key]["export0"].items())
    print(f"{key}: after one step, max |weight - torch backend| {err:.2e} (weights moved up to {moved:.2e})")
    assert err <= 1e-5 and moved > 5e-5
    router = "model.layers.0.mlp.gate.weight"  # the router learns through the replayed experts' gate weights
    assert float((results[key]["export1"][router] - results[key]["export0"][router]).abs().max()) > 1e-6


def test_routing_metrics_with_replay(results: dict[str, Any], data: dict[str, TrainingBatch]) -> None:
    positions = sum(len(s.tokens) - 1 for s in data["full"].sequences)
    for key in ("ep1", "ep2pp2"):
        m = results[key]["metrics"][0]
        print(f"{key}: near-tie flips without replay: {m['moe/router_disagrees']:.4f} of {int(m['moe/routed_tokens'])} "
              "positions")
        assert (m["moe/routed_tokens"], m["moe/unrouted_tokens"], m["moe/routing_differs"]) == (positions, 0.0, 0.0)
        assert 0.0 <= m["moe/router_disagrees"] <= 0.05  # fp32 on both sides: a near tie at most
    shifted = results["ep2"]["metrics"][0]  # the trainer's router never picks the shifted experts
    assert shifted["moe/routing_differs"] == 0.0 and shifted["moe/router_disagrees"] == 1.0


def test_replay_off_measures_the_mismatch_and_routes_by_the_trainer(results: dict[str, Any], hf: Any,
                                                                     data: dict[str, TrainingBatch]) -> None:
    r = results["ep1-off"]
    assert r["metrics"][0]["moe/routing_differs"] == 1.0 == r["metrics"][0]["moe/router_disagrees"]
    assert _max_diff(r["logprobs_permuted"], hf_logprobs(hf, data["full"])) <= 1e-5


def test_missing_routing_is_routed_by_the_trainer_and_counted(results: dict[str, Any], hf: Any,
                                                              data: dict[str, TrainingBatch]) -> None:
    r, batch = results["ep2-missing"], data["missing"]
    absent = sum(len(s.tokens) - 1 - (int(s.channels[ROUTED_EXPERTS].present[:-1].sum())
                                      if ROUTED_EXPERTS in s.channels else 0) for s in batch.sequences)
    m = r["metrics"][0]
    assert absent > 0 and m["moe/unrouted_tokens"] == absent and m["moe/unrouted_sequences"] == 2
    assert m["moe/routed_tokens"] == sum(len(s.tokens) - 1 for s in batch.sequences) - absent
    assert _max_diff(r["logprobs_missing"], hf_logprobs(hf, batch)) <= 1e-5


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recomputation_replays_the_same_experts(results: dict[str, Any], mode: str) -> None:
    """Recomputation re-runs each MoE layer's router in the backward pass (REPLAY_BACKWARD; full: the
    whole layer, selective: the MoE layer): with the shifted routing, the gradients equal those without
    recomputation. At PP=2 the 1F1B schedule runs a micro-batch's backward after the next one's
    forward, so the routing must come from the recomputed micro-batch, not the latest forward."""
    base, recomputed = results["ep2pp2-shifted"]["grads"], results[f"ep2pp2-recompute-{mode}"]["grads"]
    assert set(base) == set(recomputed)
    # at least 3 over the two data-parallel ranks: each runs 2 or more (expert-parallel ranks run as many)
    assert int(results["ep2pp2-shifted"]["metrics"][0]["micro_batches"]) >= 3
    worst = max(float((recomputed[n] - g).abs().max()) for n, g in base.items())
    print(f"EP2 x PP2 {mode} recompute, shifted routing: max |grad - grad without recompute| {worst:.1e}")
    assert worst <= 1e-6 and max(float(g.abs().max()) for g in base.values()) > 1e-3


def test_expert_parallel_layout_and_resume(results: dict[str, Any]) -> None:
    layout = results["ep2pp2"]["layout"]
    assert (layout.ep_size, layout.pp_size, layout.dp_size, layout.tp_size) == (2, 2, 2, 1)
    r = results["ep2"]
    assert r["resumed_metrics"]["loss"] == r["metrics"][-1]["loss"]
    for name, tensor in r["export1"].items():
        assert torch.equal(r["resumed"][name], tensor), name
