"""Prints what the real-model recipe (``make demo-real``) achieved: held-out greedy accuracy of the
model before any training, after the warm-up and after RL, how much of the gain is RL's, the curve of
the held-out evaluations, and where the time went.

    python examples/demo_real_summary.py runs/demo-real-seed0-...  [--plot accuracy.png]

It reads the run folder ``agentrl train`` wrote (``metrics.jsonl``, ``warmup.json``, ``summary.json``)
and the evaluation of the untrained model that ``make demo-real`` writes into it first
(``evals/base-model/greedy.json``, by ``agentrl eval --model ... --out``). ``--plot`` draws held-out
greedy accuracy against the minutes since ``agentrl train`` started its warm-up (the untrained model's
figure, measured just before by its own command, at 0).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SET = "greedy"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--plot", type=Path, default=None, help="write the accuracy curve (PNG) here")
    args = parser.parse_args()
    run = args.run_dir
    base = json.loads((run / "evals" / "base-model" / f"{SET}.json").read_text(encoding="utf-8"))
    key = f"eval/{SET}/pass@1"
    lines = [m for m in _lines(run / "metrics.jsonl") if key in m]
    points = {m["step"]: (m[key], m["eval/" + SET + "/tool_calls_per_episode"]) for m in lines}  # "final" repeats a step
    curve = [(step, acc, calls) for step, (acc, calls) in sorted(points.items())]
    warm = json.loads((run / "warmup.json").read_text(encoding="utf-8"))
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    before, (_, warmed, _), (last_step, after, _) = base["pass_at_k"]["1"], curve[0], curve[-1]
    print(f"held-out greedy accuracy ({base['prompts']} questions):")
    print(f"  before any training    {before:6.1%}   (tool calls per episode {base['tool_calls_per_episode']:.2f})")
    print(f"  after the warm-up      {warmed:6.1%}   ({warm['steps']} SFT steps, {warm['seconds'] / 60:.1f} min)")
    print(f"  after {last_step} RL steps       {after:6.1%}   ({summary['wall_s'] / 60:.1f} min with the evaluations)")
    print(f"  rise {100 * (after - before):+.1f} points, RL's share {100 * (after - warmed):+.1f} points")
    print("curve (step: greedy accuracy, tool calls per episode): "
          + ", ".join(f"{s}: {a:.1%} ({c:.2f})" for s, a, c in curve))
    if args.plot is not None:
        # the warm-up started when the first eval line's time, less the warm-up and that eval, says
        start = lines[0]["time"] - warm["seconds"] - lines[0].get(f"eval/{SET}/wall_s", 0.0)
        timed = {m["step"]: ((m["time"] - start) / 60, m[key]) for m in lines}
        plot(args.plot, before, warm["seconds"] / 60, sorted(timed.items()))
        print(f"wrote {args.plot}")


def plot(path: Path, before: float, warmup_min: float, timed: list[tuple[int, tuple[float, float]]]) -> None:
    """Held-out greedy accuracy against wall minutes: untrained, after the warm-up, after RL steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    xs, ys = [0.0] + [t for _, (t, _) in timed], [before] + [a for _, (_, a) in timed]
    ax.plot(xs, [100 * y for y in ys], marker="o", color="tab:orange", label="held-out greedy accuracy")
    ax.axvspan(0, warmup_min, color="tab:blue", alpha=0.12, label="warm-up (SFT) while the engine boots")
    ax.annotate("untrained", (0, 100 * before), textcoords="offset points", xytext=(4, 6), fontsize=8)
    for step, (t, acc) in timed:
        ax.annotate("warmed up" if step == 0 else f"RL step {step}", (t, 100 * acc), textcoords="offset points",
                    xytext=(-20 if step else 4, 6 if acc < 0.9 else -14), fontsize=8)
    ax.set_xlabel("minutes since agentrl train started")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-5, 105)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", fontsize=8)
    ax.set_title("SmolLM2-135M-Instruct learns the calculator tool on 2 CPU cores")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
