"""Writes "fix the failing test" tasks as JSONL (generated packages with an injected bug).

    python examples/prepare_fix_the_test.py -n 2000 --seed 0 -o data/fix_the_test/train.jsonl
    python examples/prepare_fix_the_test.py -n 64 --seed 1 -o data/fix_the_test/eval.jsonl

Each row is a small Python package whose ``core.py`` holds a bug that one of its unittest tests shows,
plus hidden tests the reward runs on the model's fixed source (see
``agentrl.environments.fix_test``). ``examples/data/fix_the_test.jsonl`` is 8 rows of seed 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from agentrl.environments.fix_test_data import make_fix_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=2000, help="how many tasks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    rows = make_fix_rows(args.n, seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    print(f"wrote {len(rows)} tasks to {args.out}")


if __name__ == "__main__":
    main()
