"""The figures of a step and of a run's failures, as the runner logs them (re-exported by
:mod:`agentrl.runner.loop`)."""

from __future__ import annotations

from typing import Any

from agentrl.rollout.groups import RolloutGroup
from agentrl.rollout.report import StepReport
from agentrl.rollout.scheduler import StepBatch

__all__ = ["failures_text", "step_metrics"]


def failures_text(failed: dict[str, int], examples: dict[str, str]) -> str:
    """``env_error x3 (first: prompt 7: RuntimeError: ...); reward_timeout x1``: failed groups by reason."""
    parts = []
    for reason, count in sorted(failed.items(), key=lambda kv: -kv[1]):
        example = examples.get(reason)
        parts.append(f"{reason} x{count}" + (f" (first: {example[:300]})" if example else ""))
    return "; ".join(parts)


def step_metrics(batch: StepBatch) -> dict[str, Any]:
    """The step's rollout figures: rewards, accuracy, tool calls, truncation, staleness, the report."""
    out: dict[str, Any] = {}
    groups: list[RolloutGroup] = batch.groups
    rewards = [r for g in groups for r in g.rewards]
    if rewards:
        out["rollout/reward_mean"] = sum(rewards) / len(rewards)
        out["rollout/accuracy"] = sum(1 for r in rewards if r >= 1.0) / len(rewards)
    episodes = batch.episodes()
    if episodes:
        calls = [float(ep.trajectory.metrics.get("tool_calls", 0.0)) for ep in episodes]
        out["rollout/tool_calls_per_episode"] = sum(calls) / len(calls)
        out["rollout/tool_call_rate"] = sum(1 for c in calls if c > 0) / len(calls)
        out["rollout/truncation_rate"] = sum(1 for ep in episodes if ep.status.value == "truncated") / len(episodes)
        out["rollout/response_tokens_mean"] = sum(ep.trajectory.response_length for ep in episodes) / len(episodes)
    report: StepReport = batch.report
    staleness = [int(k) for k, v in report.staleness.items() for _ in range(int(v))]
    out["rollout/staleness_max"] = max(staleness, default=0)
    for key, value in report.to_dict().items():
        if isinstance(value, bool):
            out[f"report/{key}"] = int(value)
        elif isinstance(value, int | float):
            out[f"report/{key}"] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, int | float) or (key == "failure_examples" and isinstance(v, str)):
                    out[f"report/{key}/{k}"] = v
    out["prompt_ids"] = [g.prompt_id for g in groups]
    return out
