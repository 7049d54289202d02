"""Shared builders for the train tests: a tiny Qwen3 in memory and real trajectories."""

from __future__ import annotations

import random

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from agentrl.testing import TINY_MODEL_CONFIG, build_tokenizer
from agentrl.trajectory import Status, Trajectory


def vocab_size() -> int:
    return len(build_tokenizer())


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float64) -> Qwen3ForCausalLM:
    """The project's tiny Qwen3 shape (2 layers, head_dim 32), random weights from ``seed``."""
    vocab = (vocab_size() + 63) // 64 * 64
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, **TINY_MODEL_CONFIG))
    return model.to(dtype)


def trajectories(
    n_groups: int = 3, per_group: int = 4, *, seed: int = 0, fan_out: bool = False, max_len: int = 12
) -> list[Trajectory]:
    """Multi-turn trajectories (model, tool, model) with random ids, logprobs and rewards.

    With ``fan_out`` the first rollout of each group yields two sequences (same rollout id/reward).
    """
    rng = random.Random(seed)
    vocab = vocab_size()
    out: list[Trajectory] = []
    for g in range(n_groups):
        for k in range(per_group):
            reward = float(rng.randint(0, 3))
            copies = 2 if fan_out and k == 0 else 1
            for c in range(copies):
                tr = Trajectory.from_prompt([rng.randrange(vocab) for _ in range(rng.randint(2, max_len))],
                                            vocab_size=vocab, group_id=f"g{g}", rollout_id=f"g{g}-r{k}",
                                            sample_id=f"g{g}-r{k}-s{c}", sequence_index=c)
                for turn in range(rng.randint(1, 3)):
                    n = rng.randint(1, max_len)
                    tr.append_model([rng.randrange(vocab) for _ in range(n)],
                                    [-rng.random() * 3 for _ in range(n)])
                    if turn < 2 and rng.random() < 0.7:
                        tr.append_env([rng.randrange(vocab) for _ in range(rng.randint(1, 5))], kind="tool")
                tr.finish(Status.COMPLETED)
                tr.reward = reward
                out.append(tr)
    return out
