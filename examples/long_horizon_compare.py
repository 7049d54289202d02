"""The long-horizon comparison (docs/environments.md, "Long episodes"): each run's held-out success per step,
one curve per context policy, from the runs' own ``metrics.jsonl``.

    python examples/long_horizon_compare.py runs/long_none runs/long_window runs/long_masked runs/long_summarize \\
        --out docs/images/long_horizon_held_out.png

Prints a table (held-out success greedy and at T = 1 before RL and after the last step, rollout success at
the last step, compactions per episode, the run's wall time) and draws two panels: greedy and T = 1.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _lines(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _series(lines: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(line["step"]), float(line[key])) for line in lines if isinstance(line.get(key), int | float)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    table = []
    curves: dict[str, dict[str, list[tuple[int, float]]]] = {"greedy": {}, "t1": {}}
    for run in args.runs:
        lines = _lines(run)
        row: dict[str, Any] = {"run": run.name}
        for name in curves:
            points = _series(lines, f"eval/{name}/pass@1")
            curves[name][run.name] = points
            row[f"{name} before"] = points[0][1] if points else None
            row[f"{name} after"] = points[-1][1] if points else None
        last = [line for line in lines if "rollout/accuracy" in line]
        row["rollout (last step)"] = last[-1]["rollout/accuracy"] if last else None
        row["compactions/episode"] = last[-1].get("report/metrics/context/compactions_per_episode") if last else None
        row["steps"] = max((int(line["step"]) for line in lines), default=0)
        times = [float(line["time"]) for line in lines if isinstance(line.get("time"), int | float)]
        row["wall (min)"] = round((max(times) - min(times)) / 60, 1) if len(times) > 1 else None
        table.append(row)
    keys = list(table[0])
    print(" | ".join(keys))
    for row in table:
        print(" | ".join(f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k]) for k in keys))
    if args.out is None:
        return
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(9.0, 3.2), dpi=100)
    for i, (name, by_run) in enumerate(curves.items()):
        ax = fig.add_subplot(1, 2, i + 1)
        for run, points in by_run.items():
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.4, label=run)
        ax.set_title(f"held-out success, {'greedy' if name == 'greedy' else 'T = 1'}", fontsize=10)
        ax.set_xlabel("RL step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, format="png")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
