"""Bridging vs re-rendering: per-turn cost of building the next prompt in a long tool episode.

An episode of 16 tool turns with ~500-token tool outputs is replayed turn by turn. At each turn
the next prompt's ids are built two ways, measured in the same run on the same data:

- **naive**: re-render the whole conversation with the template and re-tokenise all of it (what a
  loop without a bridge does; it is also where decode→re-encode drift comes from);
- **session**: ``BridgeSession.step`` (the agent loop's path): one render of the conversation,
  the check that it starts with the text the token buffer decodes to, and tokenising only the new
  segment;
- **stateless**: ``ChatTemplate.bridge`` (two renders, history and history + new messages, the
  prefix check, and tokenising only the new segment).

All three must give the same ids (checked every turn). The script prints the cost per turn
(best of interleaved repeats, the order rotating) and the ratios naive/session and naive/stateless per template; the target is bridging >= 10x
cheaper at turn 16.

    .venv/bin/python bench/bench_bridge.py [--turns 16] [--tool-tokens 500] [--repeats 6]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from collections.abc import Callable
from typing import Any

from agentrl.chat import BridgeOutcome, BridgeSession, ChatTemplate
from agentrl.testing import build_tokenizer

CALC = {"type": "function", "function": {
    "name": "python", "description": "Run Python code and return its standard output.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code."}},
                   "required": ["code"]}}}
TARGET_RATIO = 10.0  # bridging at least 10x cheaper than re-rendering at turn 16
_WORDS = ("value result step total python print compute answer number list check error output "
          "the a of to and in is for sum product loop range").split()


def _tool_output(rng: random.Random, template: ChatTemplate, n_tokens: int) -> str:
    """Text of roughly ``n_tokens`` tokens under this tokenizer: numbers and words, like program output."""
    lines: list[str] = []
    while len(template.tokenize("\n".join(lines))) < n_tokens:
        lines.append(" ".join(rng.choice(_WORDS) if rng.random() < 0.6 else str(rng.randint(0, 99999))
                              for _ in range(8)))
    return "\n".join(lines)


def _assistant(turn: int) -> dict[str, Any]:
    code = f"total = sum(i * i for i in range({turn * 10}))\nprint(total)"
    return {"role": "assistant", "reasoning_content": f"Step {turn}: compute the next partial sum.",
            "content": "", "tool_calls": [{"type": "function", "function": {"name": "python",
                                                                            "arguments": {"code": code}}}]}


def _seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start



def run(name: str, turns: int, tool_tokens: int, repeats: int) -> tuple[float, float, float]:
    """Replays the episode under template ``name``; returns (naive, session, stateless) seconds at the last turn."""
    template = ChatTemplate.from_name(name, tokenizer=build_tokenizer())
    rng = random.Random(0)
    opening = [{"role": "user", "content": "Compute the partial sums, one tool call per step."}]
    session = BridgeSession(template, opening, tools=[CALC])
    messages: list[dict[str, Any]] = list(opening)
    ids = list(session.prompt_ids)
    costs = (0.0, 0.0, 0.0)
    print(f"\n[{name}] turn  tokens   naive_ms session_ms stateless_ms  naive/session naive/stateless")
    for turn in range(1, turns + 1):
        reply = _assistant(turn)
        prompt_text = template.render(messages, tools=[CALC], add_generation_prompt=True)
        full_text = template.render([*messages, reply], tools=[CALC])
        # What the model samples: the canonical text of its reply, closed by <|im_end|>.
        sampled = template.tokenize(full_text[len(prompt_text):full_text.rindex(template.turn_close)])
        sampled.append(template.turn_close_id)
        messages.append(reply)
        new = [{"role": "tool", "content": _tool_output(rng, template, tool_tokens)}]
        context = [*ids, *sampled]

        def naive(msgs: list[dict[str, Any]] = messages, new: list[dict[str, Any]] = new) -> list[int]:
            return template.encode([*msgs, *new], tools=[CALC], add_generation_prompt=True)

        def stateless(ctx: list[int] = context, msgs: list[dict[str, Any]] = messages,
                      new: list[dict[str, Any]] = new) -> list[int]:
            result = template.bridge(ctx, msgs, new, tools=[CALC])
            assert result.outcome is BridgeOutcome.APPEND, result.reason
            return result.ids

        def stepped(sess: BridgeSession, sampled: list[int] = sampled, reply: dict[str, Any] = reply,
                    new: list[dict[str, Any]] = new) -> list[int]:
            result = sess.step(sampled, reply, new)
            assert result.outcome is BridgeOutcome.APPEND, result.reason
            return result.ids

        def session_copy(sess: BridgeSession = session) -> BridgeSession:
            clone = copy.copy(sess)
            clone.messages = list(sess.messages)
            return clone

        expected = naive()
        if context + stateless() != expected:
            raise SystemExit(f"[{name}] turn {turn}: stateless bridge ids differ from the full render's ids")
        # Interleaved repeats, best of each: the machine may be shared, and noise only adds time. The
        # order rotates each repeat: what runs right after the full render finds the caches cold, and
        # no side should always be the one that does.
        samples: list[list[float]] = []
        for repeat in range(repeats):
            clone = session_copy()
            ways: list[Callable[[], Any]] = [naive, lambda c=clone: stepped(c), stateless]
            times = [0.0] * 3
            for k in range(3):
                way = (repeat + k) % 3
                times[way] = _seconds(ways[way])
            samples.append(times)
        naive_t, session_t, stateless_t = (min(col) for col in zip(*samples, strict=True))
        ids = context + stepped(session)
        if ids != expected:
            raise SystemExit(f"[{name}] turn {turn}: session bridge ids differ from the full render's ids")
        messages.extend(new)
        costs = (naive_t, session_t, stateless_t)
        print(f"[{name}] {turn:4d} {len(ids):7d} {naive_t * 1e3:10.3f} {session_t * 1e3:10.3f} "
              f"{stateless_t * 1e3:12.3f} {naive_t / session_t:13.1f}x {naive_t / stateless_t:14.1f}x")
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--tool-tokens", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--templates", nargs="+", default=["qwen3", "qwen3_5", "qwen3_coder"])
    args = parser.parse_args()
    summary = [(name, *run(name, args.turns, args.tool_tokens, args.repeats)) for name in args.templates]
    print(f"\nAt turn {args.turns} (~{args.tool_tokens}-token tool outputs), per-turn cost (best of {args.repeats}):")
    for name, naive_t, session_t, stateless_t in summary:
        print(f"  {name:12s} naive {naive_t * 1e3:7.3f} ms | session {session_t * 1e3:6.3f} ms, "
              f"ratio {naive_t / session_t:5.1f}x | stateless {stateless_t * 1e3:6.3f} ms, "
              f"ratio {naive_t / stateless_t:5.1f}x   (target >= 10x)")
    figures = {name: {"session_ms": round(s * 1e3, 4), "stateless_ms": round(st * 1e3, 4)} for name, _, s, st in summary}
    baseline = {name: {"naive_ms": round(n * 1e3, 4)} for name, n, _, _ in summary}
    ratios: dict[str, float] = {}
    for name, naive_t, session_t, stateless_t in summary:
        ratios[f"{name}_naive_over_session"] = round(naive_t / session_t, 2)
        ratios[f"{name}_naive_over_stateless"] = round(naive_t / stateless_t, 2)
    targets = {f"{name}_naive_over_session": TARGET_RATIO for name, *_ in summary}
    met = {key: ratios[key] >= limit for key, limit in targets.items()}
    print("RESULT " + json.dumps({"figures": {"turn": args.turns, **figures}, "baseline": baseline, "ratios": ratios,
                                  "targets": targets, "met": met}))


if __name__ == "__main__":
    main()
