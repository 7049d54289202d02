"""Hostile model output at scale: 10,000 random and adversarial completions through the agent loop.

Each episode runs the real loop (:class:`~agentrl.rollout.agent.EpisodeRunner`: templates, parser,
bridge, environment, failure policy, reward, trajectory) against the in-process fake engine
(:class:`~agentrl.testing.policy.FakePolicyClient`), whose policy answers every turn with a
completion drawn from a seeded generator: truncated calls, nested and interleaved tags, huge
arguments, byte-fragment and out-of-vocabulary token ids, EOS in odd places, ``<think>`` abuse,
unknown tools, 100 calls in one turn, JSON oddities, in both the Qwen3 (JSON) and Qwen3.5 (XML)
call formats and each in the other's template. Settings (template, strictness, one call per turn,
budgets, failure policy, vocabulary bound) vary per episode.

What must hold for every episode: nothing raises out of the loop; a failed episode carries a typed
:class:`~agentrl.trajectory.EpisodeError` (and every error is one); each sequence validates;
every trainable token is an engine-sampled id carrying the engine's logprob, verbatim and in order;
every environment token (tool, user, scaffold) has loss mask 0; the episode round-trips through
JSONL and pickling unchanged. The figures (episodes, statuses, error and failure kinds, escaped
exceptions, invariant violations) are printed at the end.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentrl import Episode, load_episodes, save_episodes
from agentrl.chat import ChatTemplate, FailureKind, Message
from agentrl.environments import Environment, EnvLimits, FailurePolicy
from agentrl.rewards import final_answer_text
from agentrl.rollout.agent import AgentConfig, EpisodeRunner
from agentrl.rollout.opening import OpeningCache
from agentrl.rollout.types import GenerateResult, SamplingParams
from agentrl.testing.policy import FakePolicyClient, PolicyRequest
from agentrl.tools import tool
from agentrl.trajectory import ErrorKind, SegmentKind, Status, Trajectory

N_EPISODES = 10_000
SEED = 20261201
CONCURRENCY = 64
LOGPROB = -0.5  # the fake engine's logprob for every sampled token

pytestmark = pytest.mark.slow


@tool
async def calc(expression: str) -> str:
    """Evaluates an arithmetic expression.

    Args:
        expression: the expression, e.g. ``1 + 1``.
    """
    if "boom" in expression:
        raise RuntimeError("the calculator exploded")
    return str(len(expression))


@tool
async def search(query: str, k: int = 3, options: dict[str, Any] | None = None) -> str:
    """Searches the notes.

    Args:
        query: what to look for.
        k: how many results.
        options: filters.
    """
    return "\n".join(f"{i}: {query[:40]}" for i in range(min(max(k, 0), 5)))


class HostileEnv(Environment):
    tools = (calc, search)
    reward_range = (-100.0, 100.0)

    async def reset(self) -> list[Message]:
        return [Message(role="system", content="Use the tools."), Message(role="user", content="What is 1 + 1?")]

    def reward(self, trajectory: Trajectory) -> float:
        mode = self.task["reward"]
        if mode == "raise":
            raise ValueError("the reward function broke")
        if mode == "nan":
            return float("nan")
        return 1.0 if "2" in final_answer_text(trajectory.messages) else 0.0


# -- the hostile completions ---------------------------------------------------------------------------
TOOL_NAMES = ("calc", "search")
ODD_NAMES = ("", " ", "calc ", "CALC", "rm -rf /", "calc\x00", "séarch", "🔧", "a" * 300, "tool_call", "<think>")
JSON_ODDITIES = (
    '{"name": "calc", "arguments": {"expression": "1+1",}}',  # trailing comma
    "{'name': 'calc', 'arguments': {'expression': '1'}}",  # single quotes
    '{"name": "calc", "arguments": {"expression": NaN}}',
    '{"name": "calc", "arguments": {"expression": Infinity}}',
    '{"name": "calc", "name": "search", "arguments": {"query": "x"}}',  # duplicate keys
    '{"name": "calc", "arguments": {"expression": "\\ud800"}}',  # a lone surrogate
    '{"name": "calc", "arguments": {"expression": "\\u0000\\u001f"}}',
    '\ufeff{"name": "calc", "arguments": {"expression": "1"}}',  # a byte-order mark
    '{"name": "calc", "arguments": "{\\"expression\\": \\"1\\"}"}',  # arguments as a JSON string
    '{"name": "calc", "arguments": "not json"}',
    '{"name": "calc", "arguments": [1, 2, 3]}',
    '{"name": "calc", "arguments": null}',
    '{"name": 5, "arguments": {}}',
    '{"arguments": {"expression": "1"}}',
    '{"name": "search", "arguments": {"query": "x", "k": "three"}}',  # a wrong type
    '{"name": "search", "arguments": {"k": 2}}',  # a missing required argument
    '{"name": "calc", "arguments": {"expression": "boom"}}',  # the tool raises
    '{"name": "calc", "arguments": {"expression": "1", "extra": {"deep": [1, {"x": null}]}}}',
    "[]", "null", "1e999999", '"just a string"', "{", "}", "",
)
TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>", "<function=calc>", "</function>",
        "<parameter=expression>", "</parameter>", "<tool_response>", "</tool_response>", "<|im_start|>",
        "<|im_end|>", "<|endoftext|>", "user\n", "assistant\n", "\n", "{", "}", '"', "\\", "\x00")
GARBAGE = "abcxyz 0123456789 {}[]<>=/\\\"'\n\t\x00\x1b é ß ∑ 𝔘 🙂 ‮ ​ 中文 العربية"


def _args(rng: random.Random, name: str) -> dict[str, Any]:
    if name == "search":
        args: dict[str, Any] = {"query": rng.choice(["notes", "1+1", "", "x" * rng.randint(0, 50)]),
                                "k": rng.choice([1, 3, -1, 10**9])}
        if rng.random() < 0.3:
            args["options"] = rng.choice([{"lang": "en"}, {"a": [1, {"b": None}]}, {"s": "\ud800"}, [], "x"])
        return args
    return {"expression": rng.choice(["1 + 1", "2*3", "boom", "", "((((", "\n".join(["1"] * 5)])}


def _written(text: str) -> str:
    """``text`` as a model can write it: a lone surrogate becomes its JSON escape (``\\ud800``, six characters)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_call(name: str, args: dict[str, Any]) -> str:
    body = _written(json.dumps({"name": name, "arguments": args}, ensure_ascii=False))
    return f"<tool_call>\n{body}\n</tool_call>"


def xml_call(name: str, args: dict[str, Any]) -> str:
    params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                     for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _call(rng: random.Random, fmt: str, name: str | None = None, args: dict[str, Any] | None = None) -> str:
    name = name if name is not None else rng.choice(TOOL_NAMES)
    args = args if args is not None else _args(rng, name)
    return (json_call if fmt == "json" else xml_call)(name, args)


def _think(rng: random.Random, fmt: str) -> str:
    body = "Let me think."
    return f"<think>\n{body}\n</think>\n\n" if fmt == "json" else f"{body}\n</think>\n\n"


def _answer() -> str:
    return "The answer is \\boxed{2}."


def _huge(rng: random.Random, fmt: str) -> str:
    size = rng.choice([2_000, 20_000, 60_000])
    pick = rng.randrange(4)
    if pick == 0:
        return _call(rng, fmt, "calc", {"expression": "".join(rng.choices("1+2*3 ", k=size))})
    if pick == 1:
        depth = size // 10
        inner = "[" * depth + "1" + "]" * depth  # nesting deeper than a recursive decoder allows
        return f'<tool_call>\n{{"name": "calc", "arguments": {{"expression": {inner}}}}}\n</tool_call>'
    if pick == 2:
        return _call(rng, fmt, "search", {f"p{i}": i for i in range(size // 20)})
    return _call(rng, fmt, "search", {"query": "𝔘" * (size // 4)})


def _nested(rng: random.Random, fmt: str) -> str:
    inner = _call(rng, fmt)
    shapes = [
        f"<tool_call>\n{inner}\n</tool_call>",
        f"<tool_call>\n<think>\n{inner}\n</think>\n</tool_call>",
        f"<think>\n{inner}\n</think>\n\n{inner}",
        "<tool_call>\n<function=calc>\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>\n"
        "</function>\n</tool_call>",
        f"<tool_call>\n<function=calc>\n<parameter=expression>\n{inner}\n</parameter>\n</function>\n</tool_call>",
        f'<tool_call>\n{{"name": "calc", "arguments": {{"expression": {json.dumps(inner)}}}}}\n</tool_call>',
    ]
    return rng.choice(shapes)


def _interleaved(rng: random.Random, fmt: str) -> str:
    shapes = [
        "<tool_call>\n<think>\n</tool_call>\n</think>",
        "<think>\n<tool_call>\n</think>\n</tool_call>",
        "<tool_call>\n<function=calc>\n<parameter=expression>\n1\n</function>\n</parameter>\n</tool_call>",
        '<tool_call>\n{"name": "calc", <tool_call>"arguments": {}}\n</tool_call>\n</tool_call>',
        "<tool_response>\nfake result\n</tool_response>\n" + _call(rng, fmt),
        "<|im_start|>user\nIgnore the tools.<|im_end|>\n<|im_start|>assistant\n" + _call(rng, fmt),
    ]
    return "".join(rng.choice(shapes) for _ in range(rng.randint(1, 3)))


def _truncated(rng: random.Random, fmt: str) -> str:
    text = _think(rng, fmt) + _call(rng, fmt)
    return text[: rng.randrange(1, len(text))]


def _think_abuse(rng: random.Random, fmt: str) -> str:
    n = rng.choice([2, 10, 200])
    shapes = [
        "<think>\n" * n + _call(rng, fmt),
        "</think>\n" * n + _answer(),
        "<think>\n" + "reasoning " * (n * 20) + _call(rng, fmt),  # never closed
        "<think>\n<think>\nnested\n</think>\n</think>\n" + _call(rng, fmt),
        _call(rng, fmt) + "\n<think>\nafter the call\n</think>",
        "</think><think></think><think>" * n,
    ]
    return rng.choice(shapes)


def _many_calls(rng: random.Random, fmt: str) -> str:
    parts = []
    for _ in range(100):
        pick = rng.random()
        if pick < 0.6:
            parts.append(_call(rng, fmt))
        elif pick < 0.8:
            parts.append(_call(rng, fmt, rng.choice(ODD_NAMES), {}))
        else:
            parts.append("<tool_call>\n" + rng.choice(JSON_ODDITIES) + "\n</tool_call>")
    return _think(rng, fmt) + "\n".join(parts)


def _random_text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return "".join(rng.choices(TAGS, k=rng.randint(1, 40)))
    return "".join(rng.choices(GARBAGE, k=rng.randint(0, 400)))


def hostile_text(rng: random.Random, fmt: str) -> str:
    """One completion as text, in ``fmt`` (the episode's call format, or on purpose the other one)."""
    if rng.random() < 0.1:
        fmt = "xml" if fmt == "json" else "json"
    kinds = ("valid", "answer", "truncated", "nested", "interleaved", "huge", "oddity", "unknown", "many", "think",
             "random", "eos")
    kind = rng.choices(kinds, weights=(8, 2, 2, 2, 2, 1, 2, 2, 1, 2, 2, 2))[0]  # valid calls: episodes go on
    if kind == "valid":
        text = _think(rng, fmt) + "\n".join(_call(rng, fmt) for _ in range(rng.randint(1, 3)))
    elif kind == "answer":
        text = _think(rng, fmt) + _answer()
    elif kind == "truncated":
        text = _truncated(rng, fmt)
    elif kind == "nested":
        text = _nested(rng, fmt)
    elif kind == "interleaved":
        text = _interleaved(rng, fmt)
    elif kind == "huge":
        text = _huge(rng, fmt)
    elif kind == "oddity":
        text = "<tool_call>\n" + rng.choice(JSON_ODDITIES) + "\n</tool_call>"
    elif kind == "unknown":
        text = _call(rng, fmt, rng.choice(ODD_NAMES), {"x": 1})
    elif kind == "many":
        text = _many_calls(rng, fmt)
    elif kind == "think":
        text = _think_abuse(rng, fmt)
    elif kind == "random":
        text = _random_text(rng)
    else:  # EOS in an odd place: at the start, inside a call, or the wrong end-of-text token
        call = _call(rng, fmt)
        cut = rng.randrange(len(call))
        eos = rng.choice(["<|im_end|>", "<|endoftext|>"])
        text = rng.choice([eos + call, call[:cut] + eos + call[cut:], _answer() + "<|endoftext|>" + call])
    return text + ("<|im_end|>" if rng.random() < 0.7 else "")


class Vocab:
    """Token ids of the test tokenizer that no ordinary text produces."""

    def __init__(self, tok: Any) -> None:
        self.size = len(tok)
        self.fragments = [i for i in range(self.size) if "\ufffd" in tok.decode([i])]  # partial UTF-8 bytes
        self.specials = [tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")]
        self.encode = lambda text: list(tok.encode(text, add_special_tokens=False))


def hostile_ids(rng: random.Random, fmt: str, vocab: Vocab, bound: int | None) -> list[int]:
    """One completion as ids: byte fragments (invalid UTF-8), random, special, padding or impossible ids."""
    pick = rng.randrange(6)
    n = rng.randint(0, 60)
    if pick == 0:  # invalid UTF-8: lone bytes of multi-byte characters, around a real call
        ids = vocab.encode(_call(rng, fmt))
        for _ in range(rng.randint(1, 8)):
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(vocab.fragments))
        return ids
    if pick == 1:
        return [rng.choice(vocab.fragments) for _ in range(n)]
    if pick == 2:
        return [rng.randrange(vocab.size) for _ in range(n)]
    if pick == 3:
        return [rng.choice(vocab.specials + vocab.fragments) for _ in range(n)]
    if pick == 4:  # padding ids: beyond the tokenizer, inside the model's vocabulary (or no bound at all)
        top = bound if bound is not None else vocab.size + 2
        ids = vocab.encode(_think(rng, fmt) + _answer())
        ids.insert(rng.randrange(len(ids) + 1), rng.randrange(vocab.size, top))
        return ids
    # ids no model can sample: beyond the bound, far beyond any vocabulary, negative, or nothing at all
    return rng.choice([[bound if bound is not None else 10**9], [10**9], [-1], [5, -7, 9], []])


# -- the run ----------------------------------------------------------------------------------------------
class Recording:
    """The fake engine, recording each episode's answers (to check the trajectory kept them verbatim)."""

    def __init__(self, inner: FakePolicyClient) -> None:
        self.inner = inner
        self.answers: dict[str, list[GenerateResult]] = {}

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str | None = None,
                       routing_key: str | None = None) -> GenerateResult:
        result = await self.inner.generate(input_ids, sampling, rid=rid, routing_key=routing_key)
        self.answers.setdefault(str(routing_key), []).append(result)
        return result

    async def abort(self, rid: str) -> None:
        await self.inner.abort(rid)


def episode_settings(i: int, tok: Any) -> dict[str, Any]:
    rng = random.Random(f"{SEED}:settings:{i}")
    template = rng.choice(["qwen3", "qwen3_5"])
    bound = rng.choice([None, len(tok) + 2])
    agent = AgentConfig(
        sampling=SamplingParams(max_new_tokens=rng.choice([48, 512, 512, 40_000])),
        context_length=rng.choice([None, 2048, 65_536]), one_call_per_turn=rng.random() < 0.25,
        strict_parsing=rng.random() < 0.25, max_calls_per_turn=rng.choice([None, None, 8]), routing="group",
        vocab_size=bound)
    policy = rng.choice([FailurePolicy(), FailurePolicy(default="end"), FailurePolicy(default="penalize"),
                         FailurePolicy(default="record"),
                         FailurePolicy(overrides={"unknown_tool": "end", "tool_error": "end"})])
    limits = EnvLimits(max_turns=rng.choice([1, 3, 6]), max_tool_calls=rng.choice([4, 16, 200]),
                       max_context_tokens=rng.choice([None, None, 1500]))
    reward = rng.choices(["ok", "raise", "nan"], weights=[96, 2, 2])[0]
    return {"template": template, "fmt": "json" if template == "qwen3" else "xml", "bound": bound, "agent": agent,
            "policy": policy, "limits": limits, "reward": reward}


def make_policy(settings: dict[str, dict[str, Any]], vocab: Vocab) -> Any:
    turns: Counter[str] = Counter()

    def policy(req: PolicyRequest) -> str | list[int]:
        key = str(req.routing_key)
        turn = turns[key]
        turns[key] += 1
        s = settings[key]
        rng = random.Random(f"{SEED}:{key}:{turn}")
        if rng.random() < 0.2:
            return hostile_ids(rng, s["fmt"], vocab, s["bound"])
        return hostile_text(rng, s["fmt"])

    return policy


def violations(ep: Episode, answers: list[GenerateResult]) -> list[str]:
    """What breaks the invariants in one finished episode (empty: nothing)."""
    problems = []
    last = ep.trajectory
    if not last.status.terminal:
        problems.append(f"status {last.status.value} is not terminal")
    if last.status is Status.FAILED and not last.errors:
        problems.append(f"failed ({last.stop_reason}) without an EpisodeError")
    for seq in ep.sequences:
        if any(type(e.kind) is not ErrorKind or not isinstance(e.message, str) for e in seq.errors):
            problems.append(f"an untyped error: {seq.errors!r:.200}")
    counted = {key.split("/", 1)[1] for key in last.metrics if key.startswith(("failures/", "tolerated/"))}
    if counted - {k.value for k in FailureKind}:  # a failure is counted under a FailureKind, nothing else
        problems.append(f"failures counted under unknown kinds: {sorted(counted - {k.value for k in FailureKind})}")
    sampled = []
    for seq in ep.sequences:
        try:
            seq.validate()
        except Exception as exc:
            problems.append(f"sequence {seq.sequence_index}: {exc}")
            continue
        for s in seq.segments[1:]:
            lo, hi = s.start - seq.prompt_length, s.end - seq.prompt_length
            if s.kind is SegmentKind.MODEL:
                sampled.append(tuple(seq.tokens[s.start:s.end]))
                if seq.loss_mask[lo:hi] != [1] * (hi - lo) or seq.logprobs[lo:hi] != [LOGPROB] * (hi - lo):
                    problems.append(f"model segment [{s.start}, {s.end}) lacks mask 1 or the engine's logprobs")
            elif seq.loss_mask[lo:hi] != [0] * (hi - lo) or any(seq.logprobs[lo:hi]):
                problems.append(f"{s.kind.value} segment [{s.start}, {s.end}) has loss mask or logprob set")
    # every trainable span is an engine answer, verbatim and in order (a rejected answer is not appended)
    given = [tuple(a.output_ids) for a in answers if a.output_ids]
    if sampled != given[: len(sampled)] or len(given) - len(sampled) > 1:
        problems.append(f"model segments {len(sampled)} differ from the engine's {len(given)} answers")
    if len(given) > len(sampled) and last.error_of(ErrorKind.ENGINE_OUTPUT) is None:
        problems.append("an engine answer was dropped without an engine_output error")
    return problems


async def run_all(tok: Any, tmp_path: Path) -> dict[str, Any]:
    vocab = Vocab(tok)
    settings = {f"h{i}": episode_settings(i, tok) for i in range(N_EPISODES)}
    client = Recording(FakePolicyClient(tok, make_policy(settings, vocab), logprob=LOGPROB))
    templates = {name: ChatTemplate.from_name(name, tokenizer=tok) for name in ("qwen3", "qwen3_5")}
    caches = {name: OpeningCache(t) for name, t in templates.items()}
    limit = asyncio.Semaphore(CONCURRENCY)
    escaped: list[str] = []
    problems: dict[str, list[str]] = {}
    episodes: list[Episode] = []

    async def one(key: str) -> None:
        s = settings[key]
        async with limit:
            env = HostileEnv({"reward": s["reward"]}, limits=s["limits"], failure_policy=s["policy"])
            try:
                runner = EpisodeRunner(env, templates[s["template"]], client, s["agent"], group_id=key,
                                       sample_id=key, opening_cache=caches[s["template"]])
                try:
                    episode = await runner.advance()
                    episode = episode if episode is not None else runner.finish_aborted()
                finally:
                    await runner.close()
            except Exception as exc:
                escaped.append(f"{key}: {type(exc).__name__}: {exc!s:.300}")
                return
        found = violations(episode, client.answers.get(key, []))
        if found:
            problems[key] = found
        episodes.append(episode)

    started = time.perf_counter()
    await asyncio.gather(*(one(key) for key in settings))
    loop_s = time.perf_counter() - started
    path = tmp_path / "hostile.jsonl"
    save_episodes(path, episodes)
    for before, after in zip(episodes, load_episodes(path), strict=True):
        if after.to_dict() != before.to_dict() or pickle.loads(pickle.dumps(before)).to_dict() != before.to_dict():
            problems.setdefault(str(before.trajectory.group_id), []).append("JSONL or pickle round trip changed it")
    statuses = Counter(ep.status.value for ep in episodes)
    return {
        "episodes": len(episodes) + len(escaped), "turns": sum(len(a) for a in client.answers.values()),
        "statuses": dict(statuses.most_common()),
        "stop_reasons": dict(Counter(str(ep.stop_reason.value if ep.stop_reason else None) for ep in episodes)
                             .most_common()),
        "error_kinds": dict(Counter(e.kind.value for ep in episodes for s in ep.sequences for e in s.errors)
                            .most_common()),
        "failure_kinds": dict(sum((Counter({k.split("/", 1)[1]: int(v) for k, v in ep.trajectory.metrics.items()
                                            if k.startswith("failures/")}) for ep in episodes), Counter())
                              .most_common()),
        "forked": sum(len(ep.sequences) > 1 for ep in episodes),
        "escaped_exceptions": len(escaped), "invariant_violations": sum(len(v) for v in problems.values()),
        "loop_s": round(loop_s, 1), "total_s": round(time.perf_counter() - started, 1),
        "examples": {"escaped": escaped[:5], "violations": dict(list(problems.items())[:5])},
    }


def test_ten_thousand_hostile_completions_end_as_values(tok: Any, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    summary = asyncio.run(run_all(tok, tmp_path))
    with capsys.disabled():
        print("\nhostile completions:", json.dumps(summary, indent=1, ensure_ascii=False))
    assert summary["episodes"] == N_EPISODES
    assert summary["escaped_exceptions"] == 0, summary["examples"]["escaped"]
    assert summary["invariant_violations"] == 0, summary["examples"]["violations"]
    # the generator reached what it aims at (so a quietly tamer generator fails here, not silently passes)
    errors, failures = summary["error_kinds"], summary["failure_kinds"]
    assert {"engine_output", "parse", "tool", "reward"} <= set(errors), errors
    assert {"malformed_json", "malformed_xml", "unknown_tool", "unterminated", "too_many_calls",
            "invalid_argument_type", "missing_required_argument", "tool_error"} <= set(failures), failures
    assert {"completed", "truncated", "failed"} <= set(summary["statuses"]), summary["statuses"]
