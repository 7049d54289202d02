"""A 64-turn episode under the ``window`` context policy: what its training costs, and whether the agent
loop's work per turn stays flat as the episode grows.

The episode is ``long_recall`` with 64 pages (``agentrl.environments.long_recall``: a ``read`` call and a
~110-token page per turn) played by its scripted policy on a fake engine (no model: only the agent
loop's own work is timed), under ``Window(trigger=1000)`` in a 2,048-token context: past the trigger
it compacts to about half of it, so a new sequence starts every few turns.

- **Training tokens.** What the trainer reads: every sequence's tokens, summed. Against the rollout's
  *unique* tokens (the opening once, plus every token appended after it in any sequence). Target:
  at most 2x. Baseline in the same run: one re-rendered sample per turn (each turn's own prompt, as
  the window showed it, plus the turn: the "quadratic" way of training a windowed agent, one sample
  per step); and, for reference, the same window without hysteresis (``target`` just under the
  trigger: a new sequence on every turn once the window is full).
- **CPU per turn.** The agent loop's process CPU between consecutive requests, with the fake engine's
  own work taken out, at turn 64 against turn 1 (the median over ``--repeats`` episodes; compaction
  turns included where they fall). Target: within 2x. Baseline in the same run: the same 64 turns with
  no context policy and no context limit, where every turn's bridge renders the whole, growing
  conversation.

    .venv/bin/python bench/bench_long_horizon.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

from agentrl.chat import ChatTemplate
from agentrl.environments import EnvLimits
from agentrl.environments.long_recall import LongRecallEnv, make_recall_rows, recall_policy
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.context import Summarize, Window
from agentrl.rollout.types import GenerateResult, SamplingParams
from agentrl.testing import build_tokenizer
from agentrl.testing.policy import FakePolicyClient
from agentrl.trajectory import SegmentKind

TURNS = 64
LIMITS = EnvLimits(max_turns=TURNS + 8, max_tool_calls=TURNS + 8)


class TimedClient:
    """The fake engine, with the process CPU of each request's own work and the moment each arrived."""

    def __init__(self, inner: FakePolicyClient) -> None:
        self.inner = inner
        self.arrivals: list[float] = []
        self.inside: list[float] = []

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, **kw: Any) -> GenerateResult:
        start = time.process_time()
        self.arrivals.append(start)
        result = await self.inner.generate(input_ids, sampling, **kw)
        self.inside.append(time.process_time() - start)
        return result

    def loop_cpu_per_turn(self) -> list[float]:
        """CPU between request k and k+1 outside the engine: turn k+1's parse, step, bridge (and compaction)."""
        return [self.arrivals[k + 1] - self.arrivals[k] - self.inside[k] for k in range(len(self.arrivals) - 1)]


async def _episode(template: ChatTemplate, policy: Window | None, context: int | None) -> tuple[Any, TimedClient]:
    row = make_recall_rows(1, pages=TURNS, seed=11)[0]
    client = TimedClient(FakePolicyClient(template.tokenizer, recall_policy(Summarize().instruction)))
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=512), context_length=context, reward_pool=False)
    env = LongRecallEnv(row, context_policy=policy, limits=LIMITS)
    return await run_episode(env, template, client, config), client


def _tokens(episode: Any) -> dict[str, int]:
    seqs = episode.sequences
    trained = sum(len(s.tokens) for s in seqs)
    unique = seqs[0].prompt_length + sum(s.response_length for s in seqs)
    per_turn = sum(seg.end for s in seqs for seg in s.segments if seg.kind is SegmentKind.MODEL)
    return {"trained": trained, "unique": unique, "per_turn_samples": per_turn, "sequences": len(seqs),
            "model_turns": sum(s.num_model_turns for s in seqs)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    template = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
    window = Window(trigger=1000)
    asyncio.run(_episode(template, window, 2048))  # warm the caches (templates, tokenizer) outside the figures
    runs: dict[str, list[list[float]]] = {"window": [], "none": []}
    episodes: dict[str, Any] = {}
    for _ in range(args.repeats):  # alternating, so a busy moment of the machine hits both
        for name, policy, context in (("window", window, 2048), ("none", None, None)):
            episode, client = asyncio.run(_episode(template, policy, context))
            assert episode.stop_reason is not None and episode.stop_reason.value == "no_tool_calls", episode.stop_reason
            runs[name].append(client.loop_cpu_per_turn())
            episodes[name] = episode
    no_hysteresis, _ = asyncio.run(_episode(template, Window(trigger=1000, target=999), 2048))
    tok = _tokens(episodes["window"])
    flat = _tokens(no_hysteresis)

    def at(name: str, turn: int) -> float:  # turn 1 is the CPU from the first answer to the second request
        return statistics.median(r[turn - 1] for r in runs[name]) * 1e3

    def mean(name: str, turns: range) -> float:
        return statistics.mean(statistics.median(r[t - 1] for r in runs[name]) for t in turns) * 1e3

    cpu = {name: {"turn_1_ms": round(at(name, 1), 3), f"turn_{TURNS}_ms": round(at(name, TURNS - 1), 3),
                  "first_8_mean_ms": round(mean(name, range(1, 9)), 3),
                  "last_8_mean_ms": round(mean(name, range(TURNS - 8, TURNS)), 3)} for name in runs}
    starts = [s.num_model_turns for s in episodes["window"].sequences]
    compaction_turns = [sum(starts[:k + 1]) for k in range(len(starts) - 1)]  # the turn after which each happened
    cpu["window"]["compaction_turn_median_ms"] = round(statistics.median(at("window", t) for t in compaction_turns
                                                                         if t < TURNS), 3)
    window_ratio = cpu["window"][f"turn_{TURNS}_ms"] / cpu["window"]["turn_1_ms"]
    none_ratio = cpu["none"][f"turn_{TURNS}_ms"] / cpu["none"]["turn_1_ms"]
    figures = {"turns": tok["model_turns"], "sequences": tok["sequences"], "trained_tokens": tok["trained"],
               "unique_tokens": tok["unique"], "cpu_per_turn_window": cpu["window"], "repeats": args.repeats}
    baseline = {"per_turn_samples_tokens": tok["per_turn_samples"],
                "no_hysteresis": {"trained_tokens": flat["trained"], "sequences": flat["sequences"],
                                  "ratio_to_unique": round(flat["trained"] / flat["unique"], 3)},
                "cpu_per_turn_no_policy": cpu["none"]}
    ratios = {"trained_over_unique": round(tok["trained"] / tok["unique"], 3),
              "per_turn_samples_over_unique": round(tok["per_turn_samples"] / tok["unique"], 3),
              "trained_vs_per_turn_samples": round(tok["per_turn_samples"] / tok["trained"], 2),
              "cpu_turn_last_over_first_window": round(window_ratio, 2),
              "cpu_turn_last_over_first_no_policy": round(none_ratio, 2),
              "cpu_last_8_over_first_8_window": round(cpu["window"]["last_8_mean_ms"] / cpu["window"]["first_8_mean_ms"], 2),
              "cpu_last_8_over_first_8_no_policy": round(cpu["none"]["last_8_mean_ms"] / cpu["none"]["first_8_mean_ms"], 2)}
    targets = {"trained_over_unique": 2.0, "cpu_turn_last_over_first_window": 2.0}
    met = {"trained_over_unique": ratios["trained_over_unique"] <= 2.0,
           "cpu_turn_last_over_first_window": window_ratio <= 2.0}
    print(f"window, {tok['model_turns']} turns in {tok['sequences']} sequences: trained {tok['trained']} tokens, "
          f"unique {tok['unique']} ({ratios['trained_over_unique']}x); one sample per turn would train "
          f"{tok['per_turn_samples']} ({ratios['per_turn_samples_over_unique']}x); no hysteresis: {flat['trained']} in "
          f"{flat['sequences']} sequences")
    print(f"agent-loop CPU per turn (median of {args.repeats}): window turn 1 {cpu['window']['turn_1_ms']} ms, turn "
          f"{TURNS} {cpu['window'][f'turn_{TURNS}_ms']} ms ({window_ratio:.2f}x); no policy turn 1 "
          f"{cpu['none']['turn_1_ms']} ms, turn {TURNS} {cpu['none'][f'turn_{TURNS}_ms']} ms ({none_ratio:.2f}x)")
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met}))


if __name__ == "__main__":
    main()
