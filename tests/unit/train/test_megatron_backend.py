"""The megatron backend on CPU (gloo, tiny Qwen3, float32) against Hugging Face and the torch backend.

One spawned launch per world size runs every layout of that size (see ``_megatron_workers``):
world 2: TP2, PP2 and DP2 (TP1·PP1 replicas), tied and untied each, DP2 also with an idle and a
loss-free rank, TP2 also with a KL loss and with a supervised step; world 4: TP2·PP2 (tied and
untied) and PP2·DP2. The tests below only read the results.
"""

from __future__ import annotations

import copy
import importlib.util
import time
from typing import Any

import pytest
import torch
from _megatron_workers import OPTIMIZER, PACKING, batches, hf_model, launch, loss_config, probe_row

from agentrl.train import TorchBackendConfig, TorchTrainBackend

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed"),
]

# TP=1·PP=1 runs as DP=2 (each replica is one rank): a world-1 launch would cost another ~15 s of imports.
LAYOUTS: dict[int, list[tuple[str, dict[str, Any]]]] = {
    2: [("tp2pp1-tied", {"tp": 2, "pp": 1, "tied": True, "steps": ("full", "masked"), "checkpoint": True,
                         "grads": True}),
        ("tp2pp1-recompute-full", {"tp": 2, "pp": 1, "tied": True, "steps": ("full",), "recompute": "full",
                                   "grads": True}),
        ("tp2pp1-recompute-selective", {"tp": 2, "pp": 1, "tied": True, "steps": ("full",),
                                        "recompute": "selective", "grads": True}),
        ("tp2pp1-dense", {"tp": 2, "pp": 1, "tied": True, "steps": ("full",), "attention": "dense",
                          "fused": False}),
        ("tp2pp1-untied", {"tp": 2, "pp": 1, "tied": False, "steps": ("full", "masked", "sft-full"),
                           "export": True}),
        ("tp2pp1-kl", {"tp": 2, "pp": 1, "tied": True, "steps": ("full", "full"), "kl": True}),
        ("tp1pp2-tied", {"tp": 1, "pp": 2, "tied": True, "steps": ("full", "masked")}),
        ("tp1pp2-untied", {"tp": 1, "pp": 2, "tied": False, "steps": ("full", "masked")}),
        ("dp2-tied", {"tp": 1, "pp": 1, "tied": True, "steps": ("full", "masked", "single")}),
        ("dp2-untied", {"tp": 1, "pp": 1, "tied": False, "steps": ("full", "masked")})],
    4: [("tp2pp2-tied", {"tp": 2, "pp": 2, "tied": True, "steps": ("full", "masked")}),
        ("tp2pp2-untied", {"tp": 2, "pp": 2, "tied": False, "steps": ("full", "masked")}),
        ("tp1pp2dp2-tied", {"tp": 1, "pp": 2, "tied": True, "steps": ("full", "masked", "single")})],
}
TIMEOUT_S = {2: 240.0, 4: 300.0}
ALL = [key for plan in LAYOUTS.values() for key, _ in plan]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every layout's results, from one launch per world size (run lazily, once per module)."""
    cache: dict[int, dict[str, Any]] = {}

    class Lazy(dict[str, Any]):
        def __missing__(self, key: str) -> Any:
            world = next(w for w, plan in LAYOUTS.items() if any(k == key for k, _ in plan))
            if world not in cache:
                out = tmp_path_factory.mktemp(f"megatron-world{world}")
                started = time.perf_counter()
                cache[world] = launch(world, copy.deepcopy(LAYOUTS[world]), out, timeout_s=TIMEOUT_S[world])
                print(f"world {world}: {time.perf_counter() - started:.1f} s; scenarios (s): {cache[world]['timings']}")
            self.update(cache[world]["results"])
            return self[key]

    return Lazy()


def _settings(key: str) -> dict[str, Any]:
    return next(kw for plan in LAYOUTS.values() for k, kw in plan if k == key)


@pytest.fixture(scope="module")
def torch_reference() -> dict[tuple[bool, tuple[str, ...], bool], dict[str, Any]]:
    """The torch backend (one process, float32) on the same weights and batches. One run per
    (tied, kl) on the longest step list of that kind; shorter lists are its prefixes."""
    cache: dict[tuple[bool, bool], dict[str, Any]] = {}

    def run(tied: bool, kl: bool) -> dict[str, Any]:
        steps = max((kw["steps"] for kw in (_settings(k) for k in ALL)
                     if kw["tied"] == tied and kw.get("kl", False) == kl), key=len)
        backend = TorchTrainBackend(hf_model(tied), TorchBackendConfig(
            device="cpu", dtype="float32", packing=PACKING, loss=loss_config(kl), optimizer=OPTIMIZER),
            ref_model=hf_model(tied) if kl else None)
        data = batches()
        out: dict[str, Any] = {"steps": steps, "logprobs": backend.compute_logprobs(data["full"]), "metrics": []}
        for i, name in enumerate(steps):
            step = backend.sft_step if name.startswith("sft-") else backend.train_step
            out["metrics"].append(step(data[name.removeprefix("sft-")]))
            out[f"weights_after_{i + 1}"] = {k: v.detach().clone() for k, v in backend.model.state_dict().items()}
        return out

    class Lazy(dict[tuple[bool, tuple[str, ...], bool], dict[str, Any]]):
        def __missing__(self, key: tuple[bool, tuple[str, ...], bool]) -> dict[str, Any]:
            tied, steps, kl = key
            if (tied, kl) not in cache:
                cache[(tied, kl)] = run(tied, kl)
            full = cache[(tied, kl)]
            if full["steps"][: len(steps)] != steps:  # a different step list of the same kind: its own run
                raise AssertionError(f"no shared torch reference for steps {steps}; got {full['steps']}")
            return {**full, "metrics": full["metrics"][: len(steps)]}

    return Lazy()


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


@pytest.mark.parametrize("key", ALL)
def test_hf_to_megatron_to_hf_is_bit_exact(results: dict[str, Any], key: str) -> None:
    hf = hf_model(_settings(key)["tied"]).state_dict()
    exported = results[key]["export0"]
    expected = set(hf) - ({"lm_head.weight"} if _settings(key)["tied"] else set())
    assert set(exported) == expected
    for name in expected:
        assert exported[name].dtype == hf[name].dtype and torch.equal(exported[name], hf[name]), name


@pytest.mark.parametrize("key", [k for k in ALL if _settings(k)["pp"] == 1])
def test_logits_match_hugging_face(results: dict[str, Any], key: str) -> None:
    model = hf_model(_settings(key)["tied"])
    ids, _ = probe_row()
    with torch.no_grad():  # the two packed sequences scored alone by Hugging Face
        want = torch.cat([model(input_ids=ids[None, :7]).logits[0], model(input_ids=ids[None, 7:]).logits[0]])
    got = results[key]["logits"]
    vocab = want.shape[-1]
    assert got.shape[-1] == results[key]["padded_vocab"] >= vocab
    err = float((got[:, :vocab] - want).abs().max())
    print(f"{key}: max |logit - HF| {err:.2e}")
    assert err <= 1e-5


@pytest.mark.parametrize("key", ALL)
def test_logprobs_match_torch_backend(results: dict[str, Any], torch_reference: Any, key: str) -> None:
    s = _settings(key)
    want = torch_reference[(s["tied"], s["steps"], s.get("kl", False))]["logprobs"]
    err = _max_diff(results[key]["logprobs"], want)
    print(f"{key}: max |logprob - torch backend (HF)| {err:.2e}")
    assert err <= 1e-5


@pytest.mark.parametrize("key", ALL)
def test_train_steps_match_torch_backend(results: dict[str, Any], torch_reference: Any, key: str) -> None:
    s = _settings(key)
    ref = torch_reference[(s["tied"], s["steps"], s.get("kl", False))]
    for got, want in zip(results[key]["metrics"], ref["metrics"], strict=True):
        packing = () if "dp" in key else ("micro_batches", "packed_tokens")
        kl = ("kl",) if s.get("kl") else ()
        names = ("loss",) if "pg_loss" not in want else ("loss", "pg_loss", "entropy", "clipfrac", *kl)
        for name in (*names, *packing):  # DP packs per rank
            assert abs(got[name] - want[name]) <= 1e-5, (name, got[name], want[name])
        assert abs(got["grad_norm"] - want["grad_norm"]) <= 1e-5 * max(1.0, want["grad_norm"])
    assert results[key]["metrics"][0]["loss"] != 0.0
    if s.get("kl"):  # the second step is off the reference: a non-zero KL from the reference logprobs
        assert results[key]["metrics"][1]["kl"] > 0.0
    for step in range(1, len(s["steps"]) + 1):
        got_w, want_w = results[key][f"export_after_{step}"], ref[f"weights_after_{step}"]
        err = max(float((tensor - want_w[name]).abs().max()) for name, tensor in got_w.items())
        print(f"{key}: after step {step}, max |weight - torch backend| {err:.2e}")
        assert err <= 1e-5, (step, err)
    moved = max(float((results[key]["export1"][n] - results[key]["export0"][n]).abs().max())
                for n in results[key]["export0"])
    assert moved > 5e-5  # the steps did change the weights


@pytest.mark.parametrize(("parallel", "serial"), [("tp2pp1-tied", "dp2-tied"), ("tp2pp1-untied", "dp2-untied"),
                                                  ("tp1pp2-tied", "dp2-tied"), ("tp1pp2-untied", "dp2-untied"),
                                                  ("tp2pp2-tied", "dp2-tied"), ("tp2pp2-untied", "dp2-untied"),
                                                  ("tp1pp2dp2-tied", "dp2-tied")])
def test_parallel_layouts_equal_tp1_pp1(results: dict[str, Any], parallel: str, serial: str) -> None:
    a, b = results[parallel], results[serial]
    assert _max_diff(a["logprobs"], b["logprobs"]) <= 1e-5
    for ma, mb in zip(a["metrics"], b["metrics"], strict=False):  # the first two steps: full, masked
        assert abs(ma["loss"] - mb["loss"]) <= 1e-5
    for name, tensor in a["export_after_2"].items():
        assert float((tensor - b["export_after_2"][name]).abs().max()) <= 1e-5, name


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recomputation_leaves_the_gradients_unchanged(results: dict[str, Any], mode: str) -> None:
    base, recomputed = results["tp2pp1-tied"]["grads"], results[f"tp2pp1-recompute-{mode}"]["grads"]
    assert set(base) == set(recomputed)
    worst = max(float((recomputed[n] - g).abs().max()) for n, g in base.items())
    print(f"megatron TP2 recompute {mode}: max |grad - grad without recompute| {worst:.1e}")
    assert worst <= 1e-6 and max(float(g.abs().max()) for g in base.values()) > 1e-3
    # Each micro-batch of the first step is scored (no grad) and trained: recomputation adds one forward.
    n = int(results["tp2pp1-tied"]["metrics"][0]["micro_batches"])
    assert results["tp2pp1-tied"]["layer_calls"] == {"linear_qkv": 2 * n, "linear_fc1": 2 * n}
    assert results[f"tp2pp1-recompute-{mode}"]["layer_calls"] == (
        {"linear_qkv": 3 * n, "linear_fc1": 3 * n} if mode == "full" else {"linear_qkv": 2 * n, "linear_fc1": 3 * n})


@pytest.mark.parametrize("key", [k for k in ALL if _settings(k)["pp"] == 1])
def test_packed_documents_cannot_see_each_other(results: dict[str, Any], key: str) -> None:
    """Per-document core attention (the default on CPU) and the dense block mask: changing the first
    packed document changes nothing in the second one's logits."""
    assert results[key]["isolation"] == 0.0


def test_export_writes_the_serving_dtype(results: dict[str, Any]) -> None:
    r = results["tp2pp1-untied"]  # a float32 trainer exporting for bfloat16 engines
    assert r["export_dtypes"] == ["torch.bfloat16"] and r["export_config_dtype"] == "bfloat16"


def test_tp2_pads_the_vocabulary_differently(results: dict[str, Any]) -> None:
    # 1792 rows: a multiple of 128 (no padding at TP1) but not of 256, so TP2 scores over 256 padding rows
    assert results["dp2-tied"]["padded_vocab"] == 1792
    assert results["tp2pp1-tied"]["padded_vocab"] == 2048


def test_resume_from_checkpoint_repeats_the_step_bitwise(results: dict[str, Any]) -> None:
    r = results["tp2pp1-tied"]
    assert r["resumed_metrics"]["loss"] == r["metrics"][-1]["loss"]
    for name, tensor in r["export1"].items():
        assert torch.equal(r["resumed"][name], tensor), name


@pytest.mark.parametrize("key", ["dp2-tied", "tp1pp2dp2-tied"])
def test_data_parallel_with_an_idle_and_a_loss_free_rank(results: dict[str, Any], key: str) -> None:
    r = results[key]  # "masked": one DP rank trains only a rollout without trainable tokens;
    assert len(r["metrics"]) == 3  # "single": one DP rank has no sequence at all — neither hangs
    assert r["metrics"][2]["micro_batches"] == 1.0
