"""How long ``agentrl train CONFIG --dry-run`` takes: every check of a config (schema, cross-field
rules, environment, template, model folder, first data rows, the machine) before anything starts.

Target: ≤ 2 s wall, since a mistake should be reported before a user looks away. Baseline measured
in the same run: a bare ``python -c pass`` (the interpreter's floor) and the import of the training
stack (``agentrl.runner.api``: torch and Ray) that the checks used to pay before them.

    .venv/bin/python bench/bench_cli.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model

TARGET_S = 2.0


def _wall(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        times.append(time.perf_counter() - t0)
        if proc.returncode not in (0, 2):
            raise SystemExit(f"{cmd}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = folder / "train.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(64, seed=0)))
        config = folder / "run.toml"
        config.write_text(f'[model]\npath = "{build_tiny_model()}"\ndtype = "float32"\n[data.train]\npath = "{data}"\n'
                          '[environment]\nname = "toy_arithmetic"\n[rollout.engines]\nmax_total_tokens = 4096\n'
                          f'[train]\nsteps = 2\n[logging]\nrun_dir = "{folder / "run"}"\n')
        exe = [sys.executable, "-m", "agentrl.cli.main", "train", str(config)]
        dry = _wall([*exe, "--dry-run"], args.repeats)
        mistake = _wall([*exe, "train.stpes=3"], args.repeats)
    floor = _wall([sys.executable, "-c", "pass"], args.repeats)
    stack = _wall([sys.executable, "-c", "import agentrl.runner.api"], args.repeats)
    print(f"dry run {dry:.2f} s   config mistake {mistake:.2f} s   python -c pass {floor:.2f} s   "
          f"import of the training stack {stack:.2f} s   (median of {args.repeats})")
    figures = {"dry_run_s": round(dry, 3), "mistake_s": round(mistake, 3)}
    baseline = {"python_floor_s": round(floor, 3), "training_stack_import_s": round(stack, 3)}
    ratios = {"dry_run_vs_stack_import": round(dry / stack, 3), "mistake_vs_stack_import": round(mistake / stack, 3)}
    targets = {"dry_run_s": TARGET_S, "mistake_s": TARGET_S}
    met = {key: figures[key] <= limit for key, limit in targets.items()}
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met}))


if __name__ == "__main__":
    main()
