"""Evaluation rollouts: a dataset, its own sampling settings and samples per prompt, no training effects.

:func:`evaluate` runs ``samples_per_prompt`` episodes of every row through the same agent loop as
training, with its own :class:`~agentrl.rollout.types.SamplingParams` (greedy by default), and
reports mean reward, pass@k (the unbiased estimator ``1 − C(n−c, k) / C(n, k)`` over the n samples
of a prompt, c of them correct), the tool-call rate (episodes that made at least one call), tool
calls per episode, failure kinds and the truncation rate. It touches no data cursor, buffer or
policy version, and its requests are never aborted by a training step (steps abort their own
requests by id), so it can run while the engines also serve training rollouts.

Example::

    report = await evaluate(ToyArithmeticEnv, template, client, rows, EvalConfig(samples_per_prompt=4, pass_k=(1, 4)))
    report.mean_reward, report.pass_at_k[4]
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from agentrl.chat.template import ChatTemplate
from agentrl.environments.base import Environment
from agentrl.rollout.agent import AgentConfig, Episode, GenerateClient, runner_for
from agentrl.rollout.opening import OpeningCache
from agentrl.rollout.types import SamplingParams
from agentrl.trajectory import Status

__all__ = ["EvalConfig", "EvalReport", "evaluate", "pass_at_k"]


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation: ``sampling`` (``None``: greedy with the agent's per-turn budget), samples per
    prompt, which pass@k to report, and the reward at or above which a sample counts as correct."""

    name: str = "eval"
    samples_per_prompt: int = 1
    sampling: SamplingParams | None = None
    pass_k: tuple[int, ...] = (1,)
    correct_at: float = 1.0
    max_concurrency: int = 256

    def __post_init__(self) -> None:
        if self.samples_per_prompt < 1:
            raise ValueError(f"EvalConfig.samples_per_prompt={self.samples_per_prompt!r}: expected an int >= 1")
        bad = [k for k in self.pass_k if not 1 <= k <= self.samples_per_prompt]
        if bad:
            raise ValueError(f"EvalConfig.pass_k={self.pass_k!r}: each k must be in [1, samples_per_prompt="
                             f"{self.samples_per_prompt}]")
        if self.max_concurrency < 1:
            raise ValueError(f"EvalConfig.max_concurrency={self.max_concurrency!r}: expected an int >= 1")


@dataclass
class EvalReport:
    """The figures of one evaluation (plain data: logged as JSON)."""

    name: str
    prompts: int
    samples: int
    mean_reward: float
    pass_at_k: dict[int, float]
    tool_call_rate: float
    tool_calls_per_episode: float
    truncation_rate: float
    failure_rate: float
    failure_kinds: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # episode errors by kind (agentrl.trajectory.ErrorKind)
    stop_reasons: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    episodes: list[Episode] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("episodes")
        out["pass_at_k"] = {str(k): v for k, v in self.pass_at_k.items()}
        return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with ``c`` correct out of ``n`` samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): expected 0 <= c <= n and 1 <= k <= n")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


async def evaluate(env_factory: Callable[[dict[str, Any]], Environment], template: ChatTemplate,
                   client: GenerateClient, rows: Sequence[Mapping[str, Any]], config: EvalConfig | None = None, *,
                   agent: AgentConfig | None = None, opening_cache: OpeningCache | None = None,
                   tool_slots: asyncio.Semaphore | None = None) -> EvalReport:
    """Runs the evaluation; see the module doc. ``rows`` are environment rows (already checked)."""
    cfg = config or EvalConfig()
    base = agent or AgentConfig()
    sampling = cfg.sampling or base.sampling.replace(temperature=0.0)
    agent_cfg = replace(base, sampling=sampling)
    cache = opening_cache or OpeningCache(template)
    limit = asyncio.Semaphore(cfg.max_concurrency)
    started = time.perf_counter()

    async def one(row: Mapping[str, Any], i: int, j: int) -> Episode:
        async with limit:
            runner = runner_for(env_factory(dict(row)), template, client, agent_cfg, group_id=f"{cfg.name}:{i}",
                                rollout_id=uuid.uuid4().hex, sample_id=f"{cfg.name}:{i}:{j}",
                                tool_slots=tool_slots, opening_cache=cache)
            try:
                episode = await runner.advance()
                return episode if episode is not None else runner.finish_aborted()
            finally:
                await runner.close()

    per_prompt = await asyncio.gather(*(asyncio.gather(*(one(row, i, j) for j in range(cfg.samples_per_prompt)))
                                        for i, row in enumerate(rows)))
    return _report(cfg, per_prompt, time.perf_counter() - started)


def _report(cfg: EvalConfig, per_prompt: Sequence[Sequence[Episode]], wall: float) -> EvalReport:
    episodes = [ep for eps in per_prompt for ep in eps]
    n = max(len(episodes), 1)
    rewards = [float(ep.reward or 0.0) for ep in episodes]
    kinds: Counter[str] = Counter()
    stops: Counter[str] = Counter()
    errors: Counter[str] = Counter(e.kind.value for ep in episodes for seq in ep.sequences for e in seq.errors)
    calls = []
    for ep in episodes:
        m = ep.trajectory.metrics
        calls.append(m.get("tool_calls", 0.0))
        for key, value in m.items():
            if key.startswith("failures/"):
                kinds[key.removeprefix("failures/")] += int(value)
        if ep.stop_reason is not None:
            stops[ep.stop_reason.value] += 1
    passes = {k: statistics.fmean(pass_at_k(len(eps), sum(float(e.reward or 0.0) >= cfg.correct_at for e in eps), k)
                                  for eps in per_prompt) if per_prompt else 0.0 for k in cfg.pass_k}
    return EvalReport(
        name=cfg.name, prompts=len(per_prompt), samples=len(episodes),
        mean_reward=statistics.fmean(rewards) if rewards else 0.0, pass_at_k=passes,
        tool_call_rate=sum(c > 0 for c in calls) / n, tool_calls_per_episode=sum(calls) / n,
        truncation_rate=sum(ep.status is Status.TRUNCATED for ep in episodes) / n,
        failure_rate=sum(ep.status is Status.FAILED for ep in episodes) / n,
        failure_kinds=dict(kinds), errors=dict(errors), stop_reasons=dict(stops), wall_s=wall, episodes=episodes)
