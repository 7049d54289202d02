"""The torch backend on the tiny Qwen3 (CPU, float64): objective, packing invariance, errors, state."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
from _train_helpers import tiny_model, trajectories, vocab_size

from agentrl.model_folder import ModelFolderError, check_model_folder
from agentrl.testing import build_tokenizer
from agentrl.train import (
    LossConfig,
    NonFiniteLossError,
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    TrainingBatch,
    build_training_batch,
)
from agentrl.trajectory import Status, Trajectory


def _config(**loss: object) -> TorchBackendConfig:
    return TorchBackendConfig(device="cpu", dtype="float64", packing=PackingConfig(max_tokens=4096),
                              loss=LossConfig(**loss),  # type: ignore[arg-type]
                              optimizer=OptimizerConfig(lr=1e-3, grad_clip=None))


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch_near_policy(model: torch.nn.Module, seed: int = 0) -> TrainingBatch:
    """A fan-out batch whose rollout logprobs are the model's own plus noise, so ratios straddle the clip."""
    batch = build_training_batch(trajectories(3, 4, seed=seed, fan_out=True))
    backend = TorchTrainBackend(copy.deepcopy(model), _config())
    rng = random.Random(seed)
    for seq, lps in zip(batch.sequences, backend.compute_logprobs(batch), strict=True):
        seq.rollout_logprobs = [lp + rng.uniform(-0.4, 0.4) if m else 0.0
                                for lp, m in zip(lps, seq.loss_mask, strict=True)]
    return batch


def _reference_ppo_loss(model, ref_model, batch, eps=0.2, eps_high=0.28, dual=3.0, kl_coef=0.05, ent_coef=0.01):
    """Unpacked sequences, a full log_softmax, the formulas written out: PPO with asymmetric and dual
    clip + k3 KL (clamped) − entropy, per-rollout token mean."""
    total = torch.zeros((), dtype=torch.float64)
    for seq in batch.sequences:
        ids = torch.tensor(seq.tokens)[None]
        targets = torch.tensor(seq.tokens[1:])[:, None]
        logp_all = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
        with torch.no_grad():
            ref_lp = torch.log_softmax(ref_model(input_ids=ids).logits[0, :-1], dim=-1).gather(1, targets)[:, 0]
        lp = logp_all.gather(1, targets)[:, 0]
        a = torch.tensor(seq.advantages[1:], dtype=torch.float64)
        m = torch.tensor(seq.loss_mask[1:], dtype=torch.float64)
        ratio = torch.exp(lp - torch.tensor(seq.rollout_logprobs[1:], dtype=torch.float64))
        loss = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - eps, 1 + eps_high))
        loss = torch.where(a < 0, torch.minimum(loss, -dual * a), loss)
        x = lp - ref_lp
        loss = loss + kl_coef * torch.clamp(torch.exp(-x) - 1 + x, -10, 10)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        loss = loss - ent_coef * entropy
        total = total + (loss * m).sum() / seq.denominator
    return total / batch.num_rollouts


def test_loss_and_gradients_match_token_loop_reference() -> None:
    model, ref = tiny_model(0), tiny_model(1)
    batch = _batch_near_policy(model)
    cfg = _config(old_logprobs="rollout", eps_clip_high=0.28, dual_clip_c=3.0, kl_loss_coef=0.05,
                  kl_loss_type="low_var_kl", entropy_coef=0.01)
    backend = TorchTrainBackend(copy.deepcopy(model), cfg, ref_model=copy.deepcopy(ref))
    metrics = backend.forward_backward(batch)
    assert 0 < metrics["clipfrac"] < 1
    ref_model = copy.deepcopy(model)
    expected = _reference_ppo_loss(ref_model, ref, batch)
    expected.backward()
    assert metrics["loss"] == pytest.approx(float(expected.detach()), abs=1e-10)
    got, want = _grads(backend.model), _grads(ref_model)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-10, rtol=0), name


def test_ratio_one_gradient_is_the_policy_gradient() -> None:
    model = tiny_model(0)
    batch = build_training_batch(trajectories(2, 3, seed=3, fan_out=True))
    backend = TorchTrainBackend(copy.deepcopy(model), _config(old_logprobs="recompute"))
    metrics = backend.forward_backward(batch)
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-12) and metrics["clipfrac"] == 0.0
    scored = TorchTrainBackend(copy.deepcopy(model), _config()).compute_logprobs(batch)
    # -(1/B) Σ_s (1/D_s) Σ_t m A ∇ℓ, through unpacked forwards.
    total = torch.zeros((), dtype=torch.float64)
    for seq, packed_lp in zip(batch.sequences, scored, strict=True):
        logp = torch.log_softmax(model(input_ids=torch.tensor(seq.tokens)[None]).logits[0, :-1], dim=-1)
        lp = logp.gather(1, torch.tensor(seq.tokens[1:])[:, None]).squeeze(1)
        assert packed_lp[0] == 0.0
        assert torch.allclose(torch.tensor(packed_lp[1:], dtype=torch.float64), lp.detach(), atol=1e-12, rtol=0)
        weights = torch.tensor([a * m for a, m in zip(seq.advantages[1:], seq.loss_mask[1:], strict=True)],
                               dtype=torch.float64)
        total = total - (weights * lp).sum() / seq.denominator
    (total / batch.num_rollouts).backward()
    got, want = _grads(backend.model), _grads(model)
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-10, rtol=0), name


@pytest.mark.parametrize("loss", [
    {"old_logprobs": "rollout", "dual_clip_c": 3.0, "kl_loss_coef": 0.1, "kl_loss_type": "k2", "entropy_coef": 0.01,
     "opsm_delta": 0.05},
    {"policy_loss": "gspo", "old_logprobs": "rollout", "eps_clip": 0.05, "eps_clip_high": 0.06},
    {"policy_loss": "cispo", "old_logprobs": "recompute", "correction": "tis", "tis_clip": 1.2},
    {"aggregation": "seq_mean_token_sum_norm", "constant_normalizer": 64.0, "old_logprobs": "rollout"},
    {"aggregation": "token_mean", "old_logprobs": "rollout", "correction": "none"},
])
def test_packing_invariance_three_packings(loss: dict[str, object]) -> None:
    model, ref = tiny_model(0), tiny_model(1)
    batch = _batch_near_policy(model, seed=5)
    n = len(batch.sequences)
    order = list(range(n))
    random.Random(7).shuffle(order)
    order = [0] + [i for i in order if i not in (0, 1)] + [1]  # sequences 0 and 1 are one fan-out rollout
    packings = {
        "one": [list(range(n))],
        "each": [[i] for i in range(n)],
        # Irregular: the two sequences of each fan-out rollout land in different micro-batches.
        "shuffled": [order[:3], order[3:4], order[4:9], order[9:]],
    }
    assert batch.sequences[0].rollout_id == batch.sequences[1].rollout_id
    results = {}
    for name, plan in packings.items():
        backend = TorchTrainBackend(copy.deepcopy(model), _config(**loss), ref_model=copy.deepcopy(ref))
        metrics = backend.forward_backward(batch, micro_batches=plan)
        assert metrics["micro_batches"] == len(plan)
        results[name] = (metrics, _grads(backend.model))
    base_metrics, base_grads = results["one"]
    assert base_metrics["loss"] != 0.0
    for name in ("each", "shuffled"):
        metrics, grads = results[name]
        for key in ("loss", "pg_loss", "clipfrac", "ppo_kl", "entropy"):
            assert metrics[key] == pytest.approx(base_metrics[key], abs=1e-6), (name, key)
        for pname, g in base_grads.items():
            assert torch.allclose(grads[pname], g, atol=1e-6, rtol=0), (name, pname)
            assert float((grads[pname] - g).abs().max()) < 1e-9


def test_nan_loss_stops_with_diagnostics_and_no_update() -> None:
    model = tiny_model(0)
    batch = build_training_batch(trajectories(1, 3, seed=8))
    seq = batch.sequences[1]
    t = seq.loss_mask.index(1)
    seq.advantages[t] = float("nan")
    backend = TorchTrainBackend(copy.deepcopy(model), _config())
    before = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step 0") as info:
        backend.train_step(batch)
    assert seq.rollout_id in info.value.diagnostics["rollout_ids"]
    assert info.value.diagnostics["nonfinite_advantages"] == 1
    assert backend.step == 0
    for n, p in backend.model.named_parameters():
        assert torch.equal(p, before[n])


def test_clear_errors_for_vocab_and_batch_problems() -> None:
    model = tiny_model(0)
    rows = model.get_input_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match=rf"vocab_size: the tokenizer has {rows + 5} tokens .* {rows} rows"):
        TorchTrainBackend(copy.deepcopy(model), _config(), vocab_size=rows + 5)
    backend = TorchTrainBackend(copy.deepcopy(model), _config(), vocab_size=vocab_size())
    with pytest.raises(ValueError, match="batch: expected at least one training sequence, got an empty batch"):
        backend.train_step(TrainingBatch(sequences=[], num_rollouts=0))
    batch = build_training_batch(trajectories(1, 2, seed=9))
    batch.sequences[1].tokens[2] = rows + 3
    with pytest.raises(ValueError, match=rf"batch.sequences\[1\].tokens: id {rows + 3} .* outside"):
        backend.train_step(batch)
    with pytest.raises(ValueError, match=r"ref_model: loss\.kl_loss_coef > 0 needs a reference model"):
        TorchTrainBackend(copy.deepcopy(model), _config(kl_loss_coef=0.1))
    with pytest.raises(ValueError, match="device: expected 'auto' or one of"):
        TorchTrainBackend(copy.deepcopy(model), TorchBackendConfig(device="tpu"))


def test_a_padding_id_trains_like_any_sampled_token() -> None:
    # The agent loop keeps ids in [len(tokenizer), embedding rows) verbatim and trainable; so does the trainer.
    model = tiny_model(0)
    rows = model.get_input_embeddings().weight.shape[0]
    padding = vocab_size() + 1
    assert vocab_size() < padding < rows
    traj = Trajectory.from_prompt([5, 6, 7], vocab_size=rows, group_id="g", rollout_id="r")
    traj.append_model([11, padding, 12], [-1.0, -2.0, -1.5])
    traj.finish(Status.COMPLETED)
    traj.reward = 1.0
    other = Trajectory.from_dict({**traj.to_dict(), "rollout_id": "r2", "reward": 0.0})
    batch = build_training_batch([traj, other])
    backend = TorchTrainBackend(copy.deepcopy(model), _config(), vocab_size=vocab_size())
    logprobs = backend.compute_logprobs(batch)[0]
    assert math.isfinite(logprobs[4]) and logprobs[4] < 0
    before = backend.model.get_input_embeddings().weight[padding].detach().clone()
    metrics = backend.train_step(batch)
    assert math.isfinite(metrics["loss"])
    assert not torch.equal(backend.model.get_input_embeddings().weight[padding], before)


class _LeakyModel(torch.nn.Module):
    """Wraps a causal LM but always attends over the whole row (ignores packed position ids)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.inner.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor, **kw: object):  # type: ignore[no-untyped-def]
        kw["attention_mask"] = torch.ones_like(input_ids)
        return self.inner(input_ids=input_ids, **kw)


def test_packing_check_rejects_models_that_leak_across_sequences() -> None:
    with pytest.raises(RuntimeError, match="packed sequences leak attention"):
        TorchTrainBackend(_LeakyModel(tiny_model(0)), _config())


def test_checkpoint_round_trip_reproduces_the_next_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    batch = build_training_batch(trajectories(2, 2, seed=10))
    backend = TorchTrainBackend(tiny_model(0), _config())
    backend.train_step(batch)
    backend.save_checkpoint(tmp_path / "ckpt")
    rng_after_save = torch.rand(4)
    backend.train_step(batch)
    expected = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    fresh = TorchTrainBackend(tiny_model(3), _config())
    torch.rand(7)  # move the RNG; loading must put it back where it was at save time
    fresh.load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(torch.rand(4), rng_after_save)
    assert fresh.step == 1
    # Same weights and Adam moments: the next step lands on the same parameters.
    fresh.train_step(batch)
    for n, p in fresh.model.named_parameters():
        assert torch.allclose(p, expected[n], atol=1e-12, rtol=0), n
    with pytest.raises(FileNotFoundError, match=r"no trainer\.pt"):
        fresh.load_checkpoint(tmp_path / "missing")


def test_export_hf_loads_back_with_transformers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    backend = TorchTrainBackend(tiny_model(0), _config())
    backend.train_step(build_training_batch(trajectories(1, 2, seed=11)))
    with pytest.raises(ValueError, match="export_hf: no tokenizer to write"):
        backend.export_hf(tmp_path / "hf")
    out = backend.export_hf(tmp_path / "hf", tokenizer=build_tokenizer())
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    check_model_folder(out)  # weights, config and tokenizer: an engine can start from it
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float64)
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, backend.model(input_ids=ids).logits, atol=1e-12)
    names = dict(backend.named_weights())
    assert "model.embed_tokens.weight" in names


def test_from_pretrained_tiny_model_trains_in_float32(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from agentrl.testing import build_tiny_model

    with pytest.raises(ModelFolderError, match=r"from_pretrained: path: '.*missing' does not exist"):
        TorchTrainBackend.from_pretrained(tmp_path / "missing")
    backend = TorchTrainBackend.from_pretrained(
        build_tiny_model(), TorchBackendConfig(device="cpu", dtype="float32"), with_ref_model=True,
    )
    assert backend.tokenizer is not None and len(backend.tokenizer) == vocab_size()
    exported = backend.export_hf(tmp_path / "hf")  # the folder's own tokenizer goes along
    assert (exported / "tokenizer.json").is_file()
    batch = build_training_batch(trajectories(2, 2, seed=12))
    before = backend.model.get_input_embeddings().weight.detach().clone()
    metrics = backend.train_step(batch)
    assert metrics["grad_norm"] > 0 and backend.step == 1
    assert not torch.equal(before, backend.model.get_input_embeddings().weight)
    lps = backend.compute_logprobs(batch, reference=True)
    assert [len(x) for x in lps] == [len(s.tokens) for s in batch.sequences]


def test_steps_move_logprobs_in_the_direction_of_the_advantage() -> None:
    batch = build_training_batch(trajectories(2, 4, seed=13))
    cfg = TorchBackendConfig(device="cpu", dtype="float64", loss=LossConfig(old_logprobs="detached"),
                             optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0, grad_clip=1.0))
    backend = TorchTrainBackend(tiny_model(0), cfg)

    def mean_logprob(sign: float) -> float:
        values = [lp for seq, lps in zip(batch.sequences, backend.compute_logprobs(batch), strict=True)
                  for lp, a, m in zip(lps, seq.advantages, seq.loss_mask, strict=True) if m and a * sign > 0]
        return sum(values) / len(values)

    up, down = mean_logprob(+1), mean_logprob(-1)
    for _ in range(5):
        backend.train_step(batch)
    assert mean_logprob(+1) > up + 0.05
    assert mean_logprob(-1) < down - 0.05


def test_two_steps_on_one_batch_keep_the_first_policy_as_old() -> None:
    batch = build_training_batch(trajectories(2, 3, seed=14))
    cfg = TorchBackendConfig(device="cpu", dtype="float64", loss=LossConfig(old_logprobs="recompute"),
                             optimizer=OptimizerConfig(lr=1e-2, grad_clip=None))
    backend = TorchTrainBackend(tiny_model(0), cfg)
    backend.fill_old_logprobs(batch)
    first = backend.train_step(batch)
    second = backend.train_step(batch)
    assert first["ppo_kl"] == pytest.approx(0.0, abs=1e-12)
    assert abs(second["ppo_kl"]) > 1e-4  # ratio relative to the policy before the first step
    # Without stored old logprobs every step starts again from ratio 1.
    fresh = build_training_batch(trajectories(2, 3, seed=14))
    backend.train_step(fresh)
    assert backend.train_step(fresh)["ppo_kl"] == pytest.approx(0.0, abs=1e-12)


def test_reference_logprobs_carried_by_the_batch_are_used() -> None:
    model = tiny_model(0)
    cfg = _config(old_logprobs="recompute", kl_loss_coef=0.1, kl_loss_type="k2")
    backend = TorchTrainBackend(copy.deepcopy(model), cfg, ref_model=tiny_model(1))
    batch = build_training_batch(trajectories(2, 3, seed=16))
    # The policy's own logprobs as the reference: the KL is 0 only if the reference model is not re-run.
    for seq, lps in zip(batch.sequences, backend.compute_logprobs(batch), strict=True):
        seq.ref_logprobs = lps
    assert backend.forward_backward(batch)["kl"] == pytest.approx(0.0, abs=1e-12)
    fresh = build_training_batch(trajectories(2, 3, seed=16))
    assert backend.forward_backward(fresh)["kl"] > 1e-4


def test_bfloat16_autocast_keeps_float32_parameters() -> None:
    cfg = TorchBackendConfig(device="cpu", dtype="float32", autocast="bfloat16",
                             optimizer=OptimizerConfig(lr=1e-6, grad_clip=None))
    backend = TorchTrainBackend(tiny_model(0, torch.float32), cfg)
    before = backend.model.get_input_embeddings().weight.detach().clone()
    metrics = backend.train_step(build_training_batch(trajectories(1, 3, seed=15)))
    after = backend.model.get_input_embeddings().weight.detach()
    assert after.dtype == torch.float32 and metrics["grad_norm"] > 0
    # An update of lr 1e-6 is visible in float32 (it would round away in bfloat16 weights).
    assert 0 < float((after - before).abs().max()) < 1e-5


def test_prompt_only_rollouts_count_but_are_not_run() -> None:
    from agentrl.trajectory import Status, Trajectory

    trajs = trajectories(1, 2, seed=16)
    empty = Trajectory.from_prompt([7], group_id="g0", rollout_id="empty")
    empty.finish(Status.TRUNCATED)
    empty.reward = 0.0
    batch = build_training_batch([*trajs, empty])
    assert batch.num_rollouts == 3
    backend = TorchTrainBackend(tiny_model(0), _config())
    # The one-token sequence alone in a micro-batch: that micro-batch is skipped, not run empty.
    metrics = backend.forward_backward(batch, micro_batches=[[0, 1], [2]])
    assert metrics["micro_batches"] == 1
    assert backend.compute_logprobs(batch)[2] == [0.0]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_other_causal_lms_train_and_dropout_is_off(arch: str) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    vocab = vocab_size()
    torch.manual_seed(0)
    if arch == "llama":
        model: torch.nn.Module = LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=0, eos_token_id=0, pad_token_id=0))
    else:  # learned absolute positions and dropout 0.1 everywhere
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4,
                                           bos_token_id=0, eos_token_id=0))
    model.train()
    backend = TorchTrainBackend(model, _config(old_logprobs="recompute"), vocab_size=vocab)
    batch = build_training_batch(trajectories(2, 3, seed=17))
    metrics = backend.forward_backward(batch, micro_batches=[[0, 1, 2], [3, 4, 5]])
    # Full GRPO groups at ratio 1: the loss is minus the mean advantage (0) and no drift from dropout.
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-12)
    assert metrics["loss"] == pytest.approx(0.0, abs=1e-12)
    assert backend.optim_step()["grad_norm"] > 0


def test_fused_lm_head_matches_the_logits_path() -> None:
    model = tiny_model(0)
    batch = _batch_near_policy(model, seed=18)
    results = []
    for fused in (False, True):
        cfg = TorchBackendConfig(device="cpu", dtype="float64", fused_lm_head=fused,
                                 loss=LossConfig(old_logprobs="recompute", eps_clip_high=0.28, entropy_coef=0.01),
                                 optimizer=OptimizerConfig(grad_clip=None))
        backend = TorchTrainBackend(copy.deepcopy(model), cfg)
        metrics = backend.forward_backward(batch, micro_batches=[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11, 12]])
        results.append((metrics, _grads(backend.model), backend.compute_logprobs(batch)))
    (m0, g0, lp0), (m1, g1, lp1) = results
    for key in ("loss", "pg_loss", "entropy"):
        assert m1[key] == pytest.approx(m0[key], abs=1e-10), key
    for name, g in g0.items():
        assert torch.allclose(g1[name], g, atol=1e-10, rtol=0), name
    assert all(torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-10) for a, b in zip(lp0, lp1, strict=True))


def test_fused_lm_head_refuses_models_it_cannot_reproduce() -> None:
    from transformers import Qwen3ForCausalLM

    class ScaledLogits(Qwen3ForCausalLM):  # logit scaling the fused path does not know about
        def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2.0
            return out

    base = tiny_model(0)
    scaled = ScaledLogits(base.config).to(torch.float64)
    scaled.load_state_dict(base.state_dict())
    cfg = TorchBackendConfig(device="cpu", dtype="float64", fused_lm_head=True)
    with pytest.raises(ValueError, match="fused_lm_head: log-probs from hidden states differ"):
        TorchTrainBackend(scaled, cfg)
    biased = tiny_model(0)
    biased.lm_head = torch.nn.Linear(64, biased.lm_head.out_features, bias=True).to(torch.float64)
    with pytest.raises(ValueError, match="fused_lm_head: the model's output embedding is not a bias-free"):
        TorchTrainBackend(biased, cfg)
    # Automatic (the default): both fall back to the logits path, which scores them right.
    auto = TorchBackendConfig(device="cpu", dtype="float64")
    for model in (scaled, biased):
        backend = TorchTrainBackend(model, auto)
        assert backend.scorer.head(backend.model) is None


def test_non_finite_gradient_stops_before_the_update() -> None:
    backend = TorchTrainBackend(tiny_model(0), _config())
    norm = backend.model.model.norm.weight
    norm.register_hook(lambda g: g * float("inf"))
    before = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    with pytest.raises(NonFiniteLossError, match="non-finite gradient norm at step 0"):
        backend.train_step(build_training_batch(trajectories(1, 3, seed=19)))
    assert backend.step == 0
    for n, p in backend.model.named_parameters():
        assert torch.equal(p, before[n]), n
