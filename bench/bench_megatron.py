"""Train-step throughput of the megatron backend's RL step vs a plain megatron-core LM step (GPU).

A random Qwen3 (``--model 0.6b``: the Qwen3-0.6B shape; ``1.7b``: Qwen3-1.7B) is converted to a
megatron-core ``GPTModel`` and trained on one synthetic batch of packed sequences:

- **agentrl**: ``MegatronTrainBackend.train_step``: old-logprob recompute (a forward-only pass of
  the schedule), vocab-parallel logprobs and entropy, PPO-clip objective with per-rollout
  denominators, Megatron's forward-backward schedule, grad-norm check and clipping, optimizer step.
- **baseline**: the same model, micro-batches and schedule with a standard LM loss (megatron-core's
  vocab-parallel cross-entropy on the logits), backward, optimizer step; no recompute forward.

Target: agentrl ≥ 0.9× the baseline's tokens/s. Ends with one ``RESULT {json}`` line. Run it on
a GPU machine, one process per GPU (``torchrun --nproc-per-node N bench/bench_megatron.py --tp N``);
it does not run on CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import torch
import torch.distributed as dist

QWEN3: dict[str, dict[str, Any]] = {
    "0.6b": {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "1.7b": {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
}


def synthetic_batch(vocab: int, n_seqs: int, seq_len: int, seed: int) -> Any:
    from agentrl.train import TrainingBatch, TrainSequence

    rng = random.Random(seed)
    seqs = []
    for i in range(n_seqs):
        n = rng.randint(seq_len // 2, seq_len)
        mask = [0] * (n // 4) + [1] * (n - n // 4)
        adv = 1.0 if i % 2 else -1.0
        seqs.append(TrainSequence(
            tokens=[rng.randrange(vocab) for _ in range(n)], loss_mask=mask,
            rollout_logprobs=[-rng.random() * m for m in mask], advantages=[adv * m for m in mask],
            rollout_id=f"r{i}", group_id=f"g{i // 8}", reward=adv, denominator=float(sum(mask))))
    return TrainingBatch.from_sequences(seqs)


def _timed(fn: Any, steps: int) -> float:
    fn()  # warm-up
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def plain_step(backend: Any, batch: Any) -> None:
    """The baseline: the backend's model and optimizer, megatron's LM loss in the same schedule."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from agentrl.train.megatron.schedule import run_schedule

    mbs = backend._plan(batch)
    n_tokens = max(sum(int(mb.loss_mask.sum()) for mb in mbs), 1)

    def score(mb: Any, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        losses = vocab_parallel_cross_entropy(logits[:, None, :].float(), mb.target_ids[:, None])[:, 0]
        loss = (losses * mb.loss_mask).sum() / n_tokens
        return loss, {"loss": loss.detach()}

    backend._zero_grads()
    run_schedule(backend.model, mbs, score, forward_only=False)
    backend._finalize_grads()
    backend.optimizer.prepare_grads()
    backend.optimizer.step_with_ready_grads()
    backend._zero_grads()


def main() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agentrl.train import LossConfig, OptimizerConfig, PackingConfig
    from agentrl.train.megatron import MegatronBackendConfig, MegatronTrainBackend

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(QWEN3), default="0.6b")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_megatron: needs a CUDA GPU (megatron-core on CPU is for tests only)")
    if not dist.is_initialized():
        dist.init_process_group("nccl")  # torchrun sets the rendezvous variables
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(Qwen3Config(**QWEN3[args.model], tie_word_embeddings=args.model == "0.6b"))
    config = MegatronBackendConfig(
        tensor_parallel_size=args.tp, pipeline_parallel_size=args.pp, device="cuda", dtype="bfloat16",
        packing=PackingConfig(max_tokens=args.max_tokens), loss=LossConfig(old_logprobs="recompute", eps_clip_high=0.28),
        optimizer=OptimizerConfig(lr=1e-6))
    backend = MegatronTrainBackend(hf.state_dict(), hf.config, config)
    del hf
    batch = synthetic_batch(QWEN3[args.model]["vocab_size"], args.sequences, args.seq_len, seed=0)
    tokens = sum(len(s.tokens) - 1 for s in batch.sequences)
    ours = _timed(lambda: backend.train_step(batch), args.steps)
    base = _timed(lambda: plain_step(backend, batch), args.steps)
    figures = {"agentrl_tokens_per_s": tokens / ours, "agentrl_ms_per_step": ours * 1e3,
               "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30, "tokens_per_step": tokens,
               "model": args.model, "tp": args.tp, "pp": args.pp}
    baseline = {"plain_tokens_per_s": tokens / base, "plain_ms_per_step": base * 1e3}
    ratios = {"agentrl_vs_plain": round(base / ours, 3)}
    targets = {"agentrl_vs_plain": 0.9}
    met = {k: ratios[k] >= t for k, t in targets.items()}
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                      "met": met}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
