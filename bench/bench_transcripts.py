"""Scripted conversations → episodes: the transcript helper vs the agent loop with a scripted client.

For ``--n`` toy-arithmetic conversations (system prompt, question, a calculator call, its result, the
boxed answer; ``agentrl.sft.arithmetic_conversations``) each template builds the episodes two ways,
in the same run on the same data:

- **helper**: ``TranscriptBuilder.episode`` (one render per assistant turn, openings cached);
- **agent loop**: ``run_episode`` with a ``ScriptedClient`` replying each assistant turn's text and
  an environment replaying the tool results (what tests and the CPU prototype used before).

Both must give the same tokens, masks and segments (checked for every conversation). Prints the
milliseconds per transcript (best of ``--repeats``) and the speed-up per template.

    .venv/bin/python bench/bench_transcripts.py [--n 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit" / "sft"))

from agentrl.chat import TEMPLATE_NAMES, ChatTemplate
from agentrl.environments import make_arithmetic_rows
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.types import SamplingParams
from agentrl.sft import TranscriptBuilder, arithmetic_conversations
from agentrl.testing import build_tokenizer
from agentrl.testing.scripted import ScriptedClient, ScriptedTurn
from agentrl.trajectory import SegmentKind


def _replay_env() -> Any:
    from test_transcript import ReplayEnv  # the tests' replaying environment

    return ReplayEnv


async def _loop_all(template: ChatTemplate, rows: Sequence[dict[str, Any]], texts: list[list[str]]) -> list[Any]:
    env_cls = _replay_env()
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=512))
    out = []
    for row, turn_texts in zip(rows, texts, strict=True):
        client = ScriptedClient(template.tokenizer, [ScriptedTurn(t, logprob=0.0, weight_version=None)
                                                     for t in turn_texts])
        out.append(await run_episode(env_cls(row["messages"], row["tools"]), template, client, config))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tok = build_tokenizer()
    rows = arithmetic_conversations(make_arithmetic_rows(args.n, seed=7))
    result: dict[str, Any] = {"n": args.n}
    for name in TEMPLATE_NAMES:
        template = ChatTemplate.from_name(name, tokenizer=tok)
        helper_s, loop_s = float("inf"), float("inf")
        for _ in range(args.repeats):
            builder = TranscriptBuilder(template)
            t0 = time.perf_counter()
            episodes = [builder.episode(r["messages"], tools=r["tools"]) for r in rows]
            helper_s = min(helper_s, time.perf_counter() - t0)
            texts = [[template.decode(e.trajectory.tokens[s.start:s.end]) for s in e.trajectory.segments
                      if s.kind is SegmentKind.MODEL] for e in episodes]
            t0 = time.perf_counter()
            looped = asyncio.run(_loop_all(template, rows, texts))
            loop_s = min(loop_s, time.perf_counter() - t0)
        for ours, theirs in zip(episodes, looped, strict=True):
            a, b = ours.trajectory, theirs.trajectory
            assert (a.tokens, a.loss_mask, a.segments) == (b.tokens, b.loss_mask, b.segments), name
        helper_ms, loop_ms = helper_s / args.n * 1e3, loop_s / args.n * 1e3
        print(f"{name:12s} helper {helper_ms:6.2f} ms/transcript   agent loop {loop_ms:6.2f} ms/transcript   "
              f"x{loop_ms / helper_ms:.1f}")
        result[name] = {"helper_ms": round(helper_ms, 3), "agent_loop_ms": round(loop_ms, 3),
                        "speedup": round(loop_ms / helper_ms, 2)}
    per_template = {name: r for name, r in result.items() if isinstance(r, dict)}
    figures = {"n": args.n, **{name: {"helper_ms": r["helper_ms"]} for name, r in per_template.items()}}
    baseline = {name: {"agent_loop_ms": r["agent_loop_ms"]} for name, r in per_template.items()}
    ratios = {name: r["speedup"] for name, r in per_template.items()}
    targets = {name: 1.0 for name in per_template}  # the helper must be faster than laying out through the agent loop
    met = {name: ratios[name] > t for name, t in targets.items()}
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met}))


if __name__ == "__main__":
    main()
