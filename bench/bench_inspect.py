"""Large runs stay usable: indexing 10,000 saved episodes, and the viewer of a 16k-token episode.

In the same run, on the same files:

- **index**: ``RunIndex.of_run`` over a run folder written by the real ``RunDirectory`` (``--steps``
  files of ``--per-step`` synthetic episodes of ``--tokens`` tokens; target ≤ 10 s for 10,000),
  against the bare cost of reading those files: gzip plus the standard library's ``json.loads``
  of every line;
- **viewer size**: the viewer page (token texts from the test tokenizer) of one episode of
  ``--long`` tokens (target ≤ 2 MB), against the episode's own JSON record;
- **viewer open**: navigation to the first painted frame after ``load`` in headless Chromium,
  median of ``--repeats`` (target ≤ 2 s), against a page of the same episode's JSON in a ``<pre>``.

``--screenshots DIR`` also writes the docs' screenshots there (the showcase episode's viewer, and
the report of a 4-step fake-engine run with the real trainer).

    .venv/bin/python bench/bench_inspect.py [--steps 10 --per-step 1000 --tokens 512 --long 16384]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import html
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl import Episode, SegmentKind, Status, StopReason, Trajectory
from agentrl.chat import Message
from agentrl.inspect import RunIndex, token_decoder, write_run_report, write_viewer
from agentrl.runner.rundir import RunDirectory
from agentrl.testing import build_tokenizer
from agentrl.testing.chromium import HeadlessChromium, chromium_path
from agentrl.testing.episodes import showcase_episode, synthetic_episode

TARGETS = {"index_s": 10.0, "viewer_bytes": 2_000_000, "viewer_open_s": 2.0}


def _write_run(root: Path, steps: int, per_step: int, tokens: int) -> int:
    distinct = [synthetic_episode(tokens, seed=i, turns=4, index=i % 8) for i in range(min(per_step, 1000))]
    run = RunDirectory(root, config_hash="bench")
    run.write_config({"bench": True})
    for step in range(1, steps + 1):
        episodes = [distinct[i % len(distinct)] for i in range(per_step)]
        run.write_trajectories(step, episodes)
        run.append_metrics(step, {"rollout/reward_mean": 0.5})
    return steps * per_step


def _baseline_read(root: Path) -> float:
    started = time.perf_counter()
    n = 0
    for path in sorted((root / "trajectories").glob("step_*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                json.loads(line)
                n += 1
    return time.perf_counter() - started


def _long_episode(n_tokens: int, tok: Any) -> Episode:
    """About ``n_tokens`` tokens of real text (so the viewer shows real token texts)."""
    rng = random.Random(0)
    words = ["the", "model", "calls", "a", "tool", "result", "=", "42", "\n", "def", "f(x):", "return", "x", "*", "7",
             "print(", ")", "é", "世界", "→", "answer"]

    def ids(n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            out.extend(tok.encode(" ".join(rng.choice(words) for _ in range(64)), add_special_tokens=False))
        return out[:n]

    turns = 8
    prompt = n_tokens // 16
    per = (n_tokens - prompt) // (2 * turns)
    traj = Trajectory.from_prompt(ids(prompt), messages=[Message("user", "long task")], sample_id="long:0")
    for t in range(turns):
        traj.messages.append(Message("assistant", f"turn {t}"))
        traj.append_model(ids(per), [-min(15.0, rng.expovariate(2.0)) for _ in range(per)], weight_version=str(t // 3),
                          finish_reason="stop", message_index=len(traj.messages) - 1)
        traj.messages.append(Message("tool", f"result {t}", name="python"))
        traj.append_env(ids(n_tokens - len(traj.tokens) if t == turns - 1 else per), kind=SegmentKind.TOOL,
                        message_index=len(traj.messages) - 1)
    traj.finish(Status.COMPLETED, StopReason.MAX_TURNS)
    traj.reward = 1.0
    return Episode(sequences=[traj])


async def _open_times(pages: dict[str, Path], repeats: int) -> dict[str, float]:
    out: dict[str, list[float]] = {name: [] for name in pages}
    async with HeadlessChromium() as browser:
        for _ in range(repeats):
            for name, path in pages.items():
                load = await browser.load(path.resolve().as_uri())
                if load.errors:
                    raise SystemExit(f"{name}: console errors {load.errors}")
                out[name].append(load.seconds)
    return {name: statistics.median(times) for name, times in out.items()}


async def _shoot(pages: dict[Path, Path], height: int) -> None:
    async with HeadlessChromium(width=1280, height=height) as browser:
        for page, png in pages.items():
            await browser.load(page.resolve().as_uri())
            png.write_bytes(await browser.screenshot(full_page=False))


def _screenshots(dest: Path, work: Path) -> None:
    from agentrl.testing.runner import build_fake_runner, fake_run_config

    dest.mkdir(parents=True, exist_ok=True)
    viewer = write_viewer(showcase_episode(), work / "showcase.html", decoder=token_decoder(build_tokenizer()))
    config = fake_run_config(work / "fake", steps=4, rows=8, checkpoint_every=None)
    runner, _ = build_fake_runner(config)
    asyncio.run(runner.run())
    report = write_run_report(config.run_dir(), work / "report")
    asyncio.run(_shoot({viewer: dest / "inspect_viewer.png", report: dest / "inspect_report.png"}, height=1500))
    print(f"screenshots: {dest / 'inspect_viewer.png'} {dest / 'inspect_report.png'}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--per-step", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--long", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--screenshots", type=Path, default=None)
    args = parser.parse_args()
    if chromium_path() is None:
        sys.exit("bench_inspect: no chromium on PATH (scripts/setup/apt.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="bench-inspect-") as tmp:
        work = Path(tmp)
        n = _write_run(work / "run", args.steps, args.per_step, args.tokens)
        baseline_read_s = _baseline_read(work / "run")
        started = time.perf_counter()
        index = RunIndex.of_run(work / "run")
        index_s = time.perf_counter() - started
        assert len(index) == n, (len(index), n)
        print(f"index: {n} episodes in {index_s:.2f} s (gzip + json.loads of the same lines: {baseline_read_s:.2f} s)")

        tok = build_tokenizer()
        episode = _long_episode(args.long, tok)
        viewer = write_viewer(episode, work / "long.html", decoder=token_decoder(tok))
        raw = json.dumps(episode.to_dict())
        plain = work / "plain.html"
        plain.write_text(f"<!doctype html><meta charset=utf-8><pre>{html.escape(raw)}</pre>", encoding="utf-8")
        viewer_bytes = viewer.stat().st_size
        opened = asyncio.run(_open_times({"viewer": viewer, "plain": plain}, args.repeats))
        print(f"viewer: {len(episode.trajectory.tokens)} tokens, {viewer_bytes / 1e6:.2f} MB (raw JSON "
              f"{len(raw) / 1e6:.2f} MB); opens in {opened['viewer']:.3f} s (the JSON in a <pre>: {opened['plain']:.3f} s)")
        if args.screenshots is not None:
            _screenshots(args.screenshots, work)
    figures = {"episodes": n, "tokens_per_episode": args.tokens, "index_s": round(index_s, 3),
               "long_episode_tokens": len(episode.trajectory.tokens), "viewer_bytes": viewer_bytes,
               "viewer_open_s": round(opened["viewer"], 3)}
    baseline = {"json_loads_s": round(baseline_read_s, 3), "raw_json_bytes": len(raw),
                "plain_json_page_open_s": round(opened["plain"], 3)}
    ratios = {"index_vs_json_loads": round(index_s / baseline_read_s, 2),
              "viewer_vs_raw_json_bytes": round(viewer_bytes / len(raw), 2),
              "viewer_vs_plain_page_open": round(opened["viewer"] / opened["plain"], 2)}
    met = {"index_s": index_s <= TARGETS["index_s"], "viewer_bytes": viewer_bytes <= TARGETS["viewer_bytes"],
           "viewer_open_s": opened["viewer"] <= TARGETS["viewer_open_s"]}
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": TARGETS,
                                  "met": met}))


if __name__ == "__main__":
    main()
