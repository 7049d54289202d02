"""Writes synthetic tool-use conversations of the toy arithmetic task for ``agentrl sft``.

    python examples/sft_arithmetic_data.py data/sft_arithmetic.jsonl --rows 512 --direct-rate 0.5
    python -c "from agentrl.testing import build_tiny_model; build_tiny_model('models/qwen3-tiny')"
    agentrl sft examples/sft_tiny_arithmetic.toml

Each line is ``{"messages": [...], "tools": [...]}``: the environment's opening, a real
``calculator`` call and its output, then the boxed answer (``--direct-rate`` of the rows answer at
once with a wrong number instead, so RL has something to fix). The rows use another seed than the
RL training data, so the held-out questions stay unseen.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentrl.environments import make_arithmetic_rows
from agentrl.sft import arithmetic_conversations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--direct-rate", type=float, default=0.0)
    args = parser.parse_args()
    rows = make_arithmetic_rows(args.rows, seed=args.seed)
    conversations = arithmetic_conversations(rows, direct_rate=args.direct_rate, seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for conversation in conversations:
            f.write(json.dumps(conversation) + "\n")
    print(f"wrote {len(conversations)} conversations to {args.out}")


if __name__ == "__main__":
    main()
