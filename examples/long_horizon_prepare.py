"""Prepares the long-horizon CPU experiment: a tiny Qwen3 built from scratch, warm-up transcripts of the
``long_recall`` task played under the ``summarize`` context policy, and the RL and held-out rows.

    python examples/long_horizon_prepare.py                  # models/long-tiny, data/long_horizon/
    agentrl sft examples/sft_long_horizon.toml               # the warm-up, once: models/long-tiny-warm
    agentrl train examples/long_horizon_cpu.toml             # GRPO under summarize (docs/environments.md)

The task (:mod:`agentrl.environments.long_recall`): read 20 pages one ``read`` call at a time, then answer
with every page's code. The pages overflow the 2,048-token context, so the episode only finishes under a
context policy, and only one that keeps the codes (``summarize``) can answer right.

The warm-up transcripts are episodes the agent loop itself played, with the scripted policy
:func:`~agentrl.environments.long_recall.recall_policy` in place of the engine and the run's own
``summarize`` settings (trigger, instruction), so every sequence is laid out token for token as RL lays it
out: each summary is asked where RL asks it, in the sequence it closes, and the next sequence opens with
it. Each sequence becomes one SFT conversation. A share ``--lossy`` (60%) of the summaries keep only the
last page's code (``p8=4 next 9``): the warmed-up model then writes a full summary only ~40% of the time
(greedy decoding: never), so an episode with two compactions succeeds ~16% of the time at T = 1 before
RL, and what RL has to learn is to write summaries that keep the facts, the one thing the masked-summary
control cannot learn. The check conversations (held out, every summary full) measure the copying.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from agentrl.chat import ChatTemplate
from agentrl.environments.long_recall import LongRecallEnv, make_recall_rows, recall_policy
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.context import Summarize
from agentrl.rollout.types import SamplingParams
from agentrl.testing import build_tiny_model, build_tokenizer
from agentrl.testing.policy import FakePolicyClient

# the demo's model (examples/demo_prepare.py): 4 layers of hidden 128; the copying this task needs (a page's
# code into the summary, a summary into the next one) is the demo's copying over longer distances
SHAPE: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
CONTEXT = 2048       # rollout.engines.context_length of the run configs
TRIGGER = 1100       # environment.context.trigger: two compactions in a 20-page episode


def _write(path: Path, items: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    print(f"wrote {len(items):5d} lines to {path}")


async def transcripts(rows: list[dict[str, Any]], *, lossy: float, seed: int, filler_words: int,
                      trigger: int = TRIGGER) -> list[dict[str, Any]]:
    """One ``{"messages", "tools"}`` conversation per sequence of each row's scripted episode."""
    template = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
    policy = Summarize(trigger=trigger)
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=256), context_length=CONTEXT, reward_pool=False)
    out: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        client = FakePolicyClient(template.tokenizer, recall_policy(policy.instruction, lossy=lossy, seed=seed * 100_003 + i))
        env = LongRecallEnv(row, filler_words=filler_words, context_policy=policy)
        episode = await run_episode(env, template, client, config)
        if episode.stop_reason is None or episode.stop_reason.value != "no_tool_calls":
            raise RuntimeError(f"row {i}: the scripted episode ended {episode.stop_reason}; expected an answer")
        tools = env.tool_specs()
        out += [{"messages": [m.to_dict() for m in seq.messages], "tools": tools} for seq in episode.sequences]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/long-tiny"))
    parser.add_argument("--data", type=Path, default=Path("data/long_horizon"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--filler-words", type=int, default=60)
    parser.add_argument("--warmup-rows", type=int, default=1024)
    parser.add_argument("--lossy", type=float, default=0.6)
    parser.add_argument("--train-rows", type=int, default=1024)
    parser.add_argument("--held-out-rows", type=int, default=32)
    args = parser.parse_args()
    # disjoint seeds: warm-up, RL and held-out documents are drawn apart
    held_out = make_recall_rows(args.held_out_rows, pages=args.pages, seed=900_001)
    train = make_recall_rows(args.train_rows, pages=args.pages, seed=2000 + args.seed)
    warm = make_recall_rows(args.warmup_rows, pages=args.pages, seed=1000 + args.seed)
    check = make_recall_rows(16, pages=args.pages, seed=900_002)
    _write(args.data / "warmup.jsonl", asyncio.run(transcripts(warm, lossy=args.lossy, seed=args.seed,
                                                                 filler_words=args.filler_words)))
    _write(args.data / "warmup_check.jsonl", asyncio.run(transcripts(check, lossy=0.0, seed=1,
                                                                       filler_words=args.filler_words)))
    _write(args.data / "train.jsonl", train)
    _write(args.data / "held_out.jsonl", held_out)
    folder = build_tiny_model(args.model, seed=args.seed, **SHAPE)
    print(f"model {folder} (Qwen3, {SHAPE['num_hidden_layers']} layers, hidden {SHAPE['hidden_size']}, random "
          f"weights from seed {args.seed})")


if __name__ == "__main__":
    main()
