"""Prepares the long-horizon CPU experiment: a tiny Qwen3 built from scratch, the two stages of its warm-up
(copy drills; transcripts of the ``long_key`` task played under the ``summarize`` context policy), and the
RL and held-out rows.

    python examples/long_horizon_prepare.py                  # models/long-tiny, data/long_horizon/
    agentrl sft examples/sft_long_horizon_copy.toml          # warm-up stage 1, once: models/long-tiny-copy
    agentrl sft examples/sft_long_horizon.toml               # warm-up stage 2, once: models/long-tiny-warm
    agentrl train examples/long_horizon_cpu.toml             # GRPO under summarize (docs/environments.md)

The task (:mod:`agentrl.environments.long_key`): read 24 pages one ``read()`` call at a time until a page
says ``end``, then answer with the key that page 1 gave. The pages overflow the 2,048-token context, so
the episode only finishes under a context policy, and only one that keeps the key (``summarize``) can
answer right.

Stage 1 (``copy.jsonl``) is copying alone: a user message of filler words with ``key D`` somewhere in
it, the reply ``key D``. In the task's transcripts the key's digit is one trained token in thirty to a
hundred, and the 4-layer model never learns to copy it there (measured: chance after 500 steps from
the random model); on the drills it does in ~100 steps, and keeps it through stage 2.

Stage 2 (``warmup.jsonl``) is the task: episodes the agent loop itself played, with the scripted policy
:func:`~agentrl.environments.long_key.key_policy` in place of the engine and the run's own ``summarize``
settings (trigger, instruction), so every sequence is laid out token for token as RL lays it out: each
summary is asked where RL asks it, in the sequence it closes, and the next sequence opens with it. Each
sequence becomes one SFT conversation. A share ``--lossy`` (60%) of the 24-page episodes' summaries
leave the key out (``still reading``), so the warmed-up model keeps the key in a summary only part of
the time and an episode, which needs it kept in both of its summaries, succeeds well below certainty at
T = 1 before RL: what RL has to learn is to write summaries that keep the key, the one thing the
masked-summary control cannot learn. Short documents under early triggers (``--drill-rows``, every
summary full) and half as many copy drills again are mixed in. The check conversations (held out, every
summary full) measure the copying.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path
from typing import Any

from agentrl.chat import ChatTemplate
from agentrl.environments.long_key import LongKeyEnv, key_policy, make_key_rows
from agentrl.environments.long_recall import FILLER_WORDS
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.context import Summarize
from agentrl.rollout.types import SamplingParams
from agentrl.testing import build_tiny_model, build_tokenizer
from agentrl.testing.policy import FakePolicyClient

# the demo's model (examples/demo_prepare.py): 4 layers of hidden 128; the copying this task needs (page 1's
# key into the summary, a summary's key into the next one and into the answer) is of the only digit in view
SHAPE: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
CONTEXT = 2048       # rollout.engines.context_length of the run configs
TRIGGER = 1100       # environment.context.trigger: two compactions in a 24-page episode
DRILL_PAGES = (2, 10)                   # short documents of the copying drills, pages drawn in this range
DRILL_TRIGGERS = (500, 650, 800, 950)   # and their triggers: a summary every two to eight pages


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
        client = FakePolicyClient(template.tokenizer, key_policy(policy.instruction, lossy=lossy, seed=seed * 100_003 + i))
        env = LongKeyEnv(row, filler_words=filler_words, context_policy=policy)
        episode = await run_episode(env, template, client, config)
        if episode.stop_reason is None or episode.stop_reason.value != "no_tool_calls":
            raise RuntimeError(f"row {i}: the scripted episode ended {episode.stop_reason}; expected an answer")
        tools = env.tool_specs()
        out += [{"messages": [m.to_dict() for m in seq.messages], "tools": tools} for seq in episode.sequences]
    return out


def drills(n: int, *, lossy: float, seed: int, filler_words: int) -> list[dict[str, Any]]:
    """Transcripts of ``n`` short documents under early triggers: the same turns as the real episodes, with
    a summary or the answer (each copying the key) every few pages instead of every eleven."""
    rng = random.Random(seed)
    by_trigger: dict[int, list[dict[str, Any]]] = {t: [] for t in DRILL_TRIGGERS}
    for _ in range(n):
        pages = rng.randint(*DRILL_PAGES)
        by_trigger[rng.choice(DRILL_TRIGGERS)] += make_key_rows(1, pages=pages, seed=rng.randrange(2**31))
    out: list[dict[str, Any]] = []
    for trigger, rows in by_trigger.items():
        out += asyncio.run(transcripts(rows, lossy=lossy, seed=seed + trigger, filler_words=filler_words,
                                       trigger=trigger))
    return out


def copy_drills(n: int, *, seed: int) -> list[dict[str, Any]]:
    """``n`` one-turn conversations that teach the copying on its own: a user message of 20 to 300 filler
    words with ``key D`` somewhere in it, the reply ``key D``. In the task's transcripts the key's digit
    is one trained token in thirty to a hundred (the calls are the rest), too rare for the copying to
    form there (measured: chance after 500 steps); here it is one in nine."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        key = rng.choice("0123456789")
        words = [rng.choice(FILLER_WORDS).strip() for _ in range(rng.randint(20, 300))]
        words.insert(rng.randrange(len(words) + 1), f"key {key}")
        out.append({"messages": [{"role": "user", "content": " ".join(words)},
                                 {"role": "assistant", "content": f"key {key}"}]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/long-tiny"))
    parser.add_argument("--data", type=Path, default=Path("data/long_horizon"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pages", type=int, default=24)
    parser.add_argument("--filler-words", type=int, default=60)
    parser.add_argument("--warmup-rows", type=int, default=512)
    parser.add_argument("--drill-rows", type=int, default=3072)
    parser.add_argument("--copy-drills", type=int, default=8000)
    parser.add_argument("--lossy", type=float, default=0.6)
    parser.add_argument("--train-rows", type=int, default=1024)
    parser.add_argument("--held-out-rows", type=int, default=32)
    args = parser.parse_args()
    # disjoint seeds: warm-up, RL and held-out documents are drawn apart
    held_out = make_key_rows(args.held_out_rows, pages=args.pages, seed=900_001)
    train = make_key_rows(args.train_rows, pages=args.pages, seed=2000 + args.seed)
    warm = make_key_rows(args.warmup_rows, pages=args.pages, seed=1000 + args.seed)
    check = make_key_rows(16, pages=args.pages, seed=900_002)
    warmup = asyncio.run(transcripts(warm, lossy=args.lossy, seed=args.seed, filler_words=args.filler_words))
    warmup += drills(args.drill_rows, lossy=0.0, seed=3000 + args.seed, filler_words=args.filler_words)
    warmup += copy_drills(args.copy_drills // 2, seed=5000 + args.seed)  # keeps the copying of stage 1
    random.Random(args.seed).shuffle(warmup)
    _write(args.data / "copy.jsonl", copy_drills(args.copy_drills, seed=4000 + args.seed))
    _write(args.data / "warmup.jsonl", warmup)
    _write(args.data / "warmup_check.jsonl", asyncio.run(transcripts(check, lossy=0.0, seed=1,
                                                                       filler_words=args.filler_words)))
    _write(args.data / "train.jsonl", train)
    _write(args.data / "held_out.jsonl", held_out)
    folder = build_tiny_model(args.model, seed=args.seed, **SHAPE)
    print(f"model {folder} (Qwen3, {SHAPE['num_hidden_layers']} layers, hidden {SHAPE['hidden_size']}, random "
          f"weights from seed {args.seed})")


if __name__ == "__main__":
    main()
