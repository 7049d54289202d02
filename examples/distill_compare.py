"""Runs and reports the CPU distillation comparison (docs/training.md "Distillation"): from one weak
student, (a) on-policy distillation, (b) GRPO on the task reward, (c) both, on several seeds; held-out
greedy accuracy after every step, and whether distillation reaches the teacher faster than RL.

    python examples/distill_prepare.py --demo-run RUN          # the teacher and the student
    python examples/distill_compare.py run --seeds 0 1 2       # 3 arms x 3 seeds: agentrl train each
    python examples/distill_compare.py report                  # the table, the verdict, the plot

``run`` calls ``agentrl train examples/distill_cpu.toml`` once per arm and seed (``train.seed``,
``rollout.engines.random_seed`` and ``data.train.seed`` all set to the seed), each into
``ROOT/<arm>-seed<S>``; a run folder that already holds its last step is left alone (one cut short is
started again). ``report`` reads
their ``metrics.jsonl`` and the teacher's greedy accuracy (``--teacher-accuracy``, measured by
``agentrl eval`` or the demo run's last evaluation) and prints one JSON line ``RESULT {...}``.

The verdict, per seed: (a) reaches 90% of the teacher's accuracy in fewer steps than (b), and by
the budget's last step (a) is at >= 80% of the teacher while (b) never went above 10%.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ARMS: dict[str, tuple[str, list[str]]] = {
    "distill": ("(a) distillation", []),
    "rl": ("(b) RL, task reward", ["teacher=none"]),
    "both": ("(c) both", ["teacher.task_reward=true"]),
}


def _agentrl() -> str:
    return str(Path(sys.executable).with_name("agentrl"))


def run(args: argparse.Namespace) -> None:
    for seed in args.seeds:
        for arm in args.arms:
            folder = args.root / f"{arm}-seed{seed}"
            if len(_curve(folder) or []) > args.steps:
                print(f"{folder}: done, left alone")
                continue
            if folder.exists():  # a run cut short: started again from scratch
                shutil.rmtree(folder)
            # the arm's own overrides last: an --override of the teacher's fields (teacher.path=...) must not
            # bring back the teacher that the RL arm removes
            cmd = [_agentrl(), "train", str(args.config), f"train.steps={args.steps}",
                   f"train.seed={seed}", f"rollout.engines.random_seed={seed}", f"data.train.seed={seed}",
                   f"logging.run_dir={folder}", "--quiet", *args.override, *ARMS[arm][1]]
            print("+", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)


def _curve(folder: Path) -> list[float] | None:
    """Greedy held-out accuracy before step 1 and after each step (``None``: no metrics yet)."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return None
    out: dict[int, float] = {}
    for line in path.read_text().splitlines():
        metrics = json.loads(line)
        value = metrics.get("eval/greedy/pass@1")
        if value is not None and not metrics.get("final"):
            out[int(metrics["step"])] = float(value)
    return [out[k] for k in sorted(out)]


def _first_reaching(curve: list[float], level: float) -> int | None:
    return next((step for step, acc in enumerate(curve) if acc >= level), None)


def report(args: argparse.Namespace) -> dict[str, Any]:
    teacher = args.teacher_accuracy
    curves: dict[str, dict[str, list[float]]] = {}
    verdicts: dict[str, dict[str, Any]] = {}
    for seed in args.seeds:
        per_arm = {arm: (_curve(args.root / f"{arm}-seed{seed}") or []) for arm in args.arms}
        curves[str(seed)] = per_arm
        a, b = per_arm.get("distill", []), per_arm.get("rl", [])
        if not a or not b:
            continue
        budget = min(len(a), len(b)) - 1
        reach_a, reach_b = _first_reaching(a, 0.9 * teacher), _first_reaching(b, 0.9 * teacher)
        faster = reach_a is not None and (reach_b is None or reach_a < reach_b)
        verdicts[str(seed)] = {
            "budget_steps": budget, "distill_steps_to_90pct": reach_a, "rl_steps_to_90pct": reach_b,
            "distill_at_budget": a[budget], "rl_max_within_budget": max(b[: budget + 1]),
            "distill_faster": faster, "distill_at_least_80pct": a[budget] >= 0.8 * teacher,
            "rl_at_most_10pct": max(b[: budget + 1]) <= 0.10,
        }
        verdicts[str(seed)]["met"] = all(verdicts[str(seed)][k] for k in
                                         ("distill_faster", "distill_at_least_80pct", "rl_at_most_10pct"))
    _table(curves, args.arms)
    if args.plot is not None:
        _plot(curves, args.arms, teacher, args.plot)
    result = {"teacher_greedy_accuracy": teacher, "curves": curves, "verdicts": verdicts,
              "met": bool(verdicts) and all(v["met"] for v in verdicts.values()) and len(verdicts) == len(args.seeds)}
    print("RESULT " + json.dumps(result))
    return result


def _table(curves: dict[str, dict[str, list[float]]], arms: list[str]) -> None:
    for seed, per_arm in curves.items():
        print(f"seed {seed}: held-out greedy accuracy before step 1, then after each step")
        for arm in arms:
            print(f"  {ARMS[arm][0]:<22} " + " ".join(f"{100 * x:5.1f}" for x in per_arm.get(arm, [])))


def _plot(curves: dict[str, dict[str, list[float]]], arms: list[str], teacher: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"distill": "tab:blue", "rl": "tab:red", "both": "tab:green"}
    styles = ["-", "--", ":"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (seed, per_arm) in enumerate(curves.items()):
        for arm in arms:
            curve = per_arm.get(arm, [])
            ax.plot(range(len(curve)), [100 * x for x in curve], styles[k % 3], color=colours[arm],
                    label=f"{ARMS[arm][0]}, seed {seed}")
    ax.axhline(100 * teacher, color="grey", lw=0.8)
    ax.axhline(90 * teacher, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out greedy accuracy (%)")
    ax.set_ylim(-3, 103)
    ax.legend(fontsize=7, ncol=3, loc="center right")
    ax.set_title("The demo's task from a weak student: teacher (grey: 100% and 90% of it)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("run", "report"))
    parser.add_argument("--root", type=Path, default=Path("runs/distill"))
    parser.add_argument("--config", type=Path, default=Path(__file__).with_name("distill_cpu.toml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--teacher-accuracy", type=float, default=1.0)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--override", nargs="*", default=[], help="more KEY=VALUE for every run")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
