"""Train-step throughput of the torch backend vs a plain Hugging Face step, same run, same tokens.

A random Qwen3 (``--model tiny``: the project's 2-layer test shape; ``--model 0.6b``: the Qwen3-0.6B
shape, 28 layers, 151,936 vocabulary) trains on a synthetic batch of packed sequences.

- **agentrl**: ``TorchTrainBackend.train_step``: old-logprob recompute (no-grad forward), chunked
  logprobs and entropy, PPO-clip objective with the per-rollout reducer, gradient accumulation
  over the packed micro-batches, clipping, AdamW.
- **baseline**: the same packed micro-batches through ``model(..., labels=...)`` (cross-entropy),
  backward, AdamW; no recompute forward, so the ratio shows what the RL objective costs.

Prints tokens/s of both and their ratio. Nothing is asserted; run it where the device is.

    .venv/bin/python bench/bench_train_step.py --device cpu --model tiny
    .venv/bin/python bench/bench_train_step.py --device cuda --model 0.6b     # float32 params, bf16 autocast
    .venv/bin/python bench/bench_train_step.py --device cuda --model 0.6b --fused-lm-head --chunk-size 1024
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from agentrl.algorithms import DEFAULT_CHUNK_SIZE
from agentrl.testing import TINY_MODEL_CONFIG, build_tokenizer
from agentrl.train import (
    LossConfig,
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
    TorchTrainBackend,
    TrainingBatch,
    TrainSequence,
    collate,
    device_module,
    plan_micro_batches,
    resolve_device,
)

QWEN3_0_6B: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
}


def build_model(name: str, seed: int) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    if name == "tiny":
        vocab = (len(build_tokenizer()) + 63) // 64 * 64
        return Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, **TINY_MODEL_CONFIG))
    return Qwen3ForCausalLM(Qwen3Config(**QWEN3_0_6B))


def synthetic_batch(vocab: int, n_seqs: int, seq_len: int, seed: int) -> TrainingBatch:
    rng = random.Random(seed)
    seqs = []
    for i in range(n_seqs):
        n = rng.randint(seq_len // 2, seq_len)
        prompt = n // 4
        mask = [0] * prompt + [1] * (n - prompt)
        adv = 1.0 if i % 2 else -1.0
        seqs.append(TrainSequence(
            tokens=[rng.randrange(vocab) for _ in range(n)], loss_mask=mask,
            rollout_logprobs=[-rng.random() * m for m in mask], advantages=[adv * m for m in mask],
            rollout_id=f"r{i}", group_id=f"g{i // 8}", reward=adv, denominator=float(sum(mask)),
        ))
    return TrainingBatch.from_sequences(seqs)


def _sync(device: torch.device) -> None:
    module = device_module(device)
    if module is not None:
        module.synchronize(device)


def time_agentrl(backend: TorchTrainBackend, batch: TrainingBatch, steps: int) -> float:
    backend.train_step(batch)  # warm-up
    _sync(backend.device)
    start = time.perf_counter()
    for _ in range(steps):
        backend.train_step(batch)
    _sync(backend.device)
    return (time.perf_counter() - start) / steps


def time_baseline(model: torch.nn.Module, batch: TrainingBatch, cfg: TorchBackendConfig, device: torch.device,
                  steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optimizer.lr)

    def autocast_ctx() -> Any:
        if cfg.autocast == "none":
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=getattr(torch, cfg.autocast))
    lengths = [len(s.tokens) - 1 for s in batch.sequences]
    mbs = [collate(batch.sequences, idx, device=device) for idx in plan_micro_batches(lengths, cfg.packing)]

    def step() -> None:
        for mb in mbs:
            labels = torch.cat([mb.input_ids[1:], mb.input_ids[:1]])  # any targets: the cost is what counts
            with autocast_ctx():
                out = model(input_ids=mb.input_ids[None], position_ids=mb.position_ids[None], labels=labels[None],
                            use_cache=False)
            out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--model", choices=["tiny", "0.6b"], default="tiny")
    parser.add_argument("--dtype", default="float32", help="parameter dtype")
    parser.add_argument("--autocast", default=None,
                        help="mixed-precision forward: none (default on CPU) or bfloat16 (default elsewhere)")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=None, help="max tokens per sequence (tiny 512, 0.6b 2048)")
    parser.add_argument("--max-tokens", type=int, default=8192, help="micro-batch token budget")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fused-lm-head", action="store_true", help="score from hidden states (no logits)")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="rows per log-softmax chunk")
    args = parser.parse_args()
    device = resolve_device(args.device)
    dtype = args.dtype
    autocast = args.autocast or ("none" if device.type == "cpu" else "bfloat16")
    seq_len = args.seq_len or (512 if args.model == "tiny" else 2048)
    cfg = TorchBackendConfig(
        device=str(device), dtype=dtype, autocast=autocast, packing=PackingConfig(max_tokens=args.max_tokens),
        fused_lm_head=args.fused_lm_head, logprob_chunk_size=args.chunk_size,
        loss=LossConfig(old_logprobs="recompute", eps_clip_high=0.28), optimizer=OptimizerConfig(lr=1e-6),
    )
    model = build_model(args.model, seed=0)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    batch = synthetic_batch(vocab, args.sequences, seq_len, seed=0)
    tokens = sum(len(s.tokens) - 1 for s in batch.sequences)
    backend = TorchTrainBackend(model, cfg)
    ours = time_agentrl(backend, batch, args.steps)
    baseline_model = build_model(args.model, seed=0).to(device=device, dtype=backend.dtype)
    del backend, model
    base = time_baseline(baseline_model, batch, cfg, device, args.steps)
    print(f"model {args.model}, device {device}, params {dtype}, autocast {autocast}, fused {args.fused_lm_head}, "
          f"{args.sequences} sequences, "
          f"{tokens} tokens/step, budget {args.max_tokens}")
    print(f"  agentrl train_step   : {tokens / ours:10.1f} tokens/s ({ours * 1e3:.0f} ms/step)")
    print(f"  plain HF CE step     : {tokens / base:10.1f} tokens/s ({base * 1e3:.0f} ms/step)")
    print(f"  ratio agentrl / plain: {base / ours:.2f} (includes the no-grad old-logprob forward)")
    module = device_module(device)
    figures: dict[str, Any] = {"model": args.model, "device": str(device), "fused_lm_head": args.fused_lm_head,
                               "tokens_per_step": tokens, "agentrl_tokens_per_s": round(tokens / ours, 1),
                               "agentrl_ms_per_step": round(ours * 1e3, 1)}
    if module is not None:
        print(f"  peak device memory   : {module.max_memory_allocated(device) / 2**30:.2f} GiB")
        figures["peak_memory_gib"] = round(module.max_memory_allocated(device) / 2**30, 3)
    baseline = {"plain_tokens_per_s": round(tokens / base, 1), "plain_ms_per_step": round(base * 1e3, 1)}
    # no target: the ratio includes the RL step's no-grad old-logprob forward, which a plain LM step does not run
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline,
                                  "ratios": {"agentrl_vs_plain": round(base / ours, 3)}, "targets": {}}))


if __name__ == "__main__":
    main()
