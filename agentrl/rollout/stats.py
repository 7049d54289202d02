"""Per-step rollout metrics, gathered while a step runs and written into its :class:`StepReport`.

Rates and times are over the episodes that *ended* during the step (accepted, filtered, surplus or
regenerated alike): what the engines and tools actually did. Length statistics compare the groups
handed to the trainer with everything generated, which shows a completion-order bias at a glance
(short episodes finishing first crowd out long ones).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentrl.trajectory import SegmentKind, Status

if TYPE_CHECKING:
    from agentrl.rollout.agent import Episode
    from agentrl.rollout.groups import RolloutGroup
    from agentrl.rollout.report import StepReport

__all__ = ["StepStats"]


@dataclass
class StepStats:
    """Counters of one step (not thread-safe; one event loop)."""

    wall_start: float = 0.0
    cpu_start: float = 0.0
    episodes: int = 0
    suspended: int = 0
    lost: int = 0
    generated_tokens: float = 0.0
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    turns: float = 0.0
    tool_calls: float = 0.0
    truncated: int = 0
    failed: int = 0
    time_generate_s: float = 0.0
    time_env_s: float = 0.0
    time_reward_s: float = 0.0
    lengths: list[int] = field(default_factory=list)
    failure_kinds: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    error_examples: dict[str, str] = field(default_factory=dict)  # kind -> its first message, with its origin
    stop_reasons: Counter[str] = field(default_factory=Counter)
    abort_rounds: int = 0
    abort_cancelled: int = 0
    abort_settle_s: float = 0.0
    abort_idle_s: float = 0.0
    engine_requests_after_abort: int = 0
    restored: int = 0
    restore_problems: list[str] = field(default_factory=list)
    sequences: float = 0.0
    compactions: float = 0.0
    summary_turns: float = 0.0
    routing: Counter[str] = field(default_factory=Counter)  # MoE routing rows received and missing (routing/*)

    def start(self) -> None:
        self.wall_start, self.cpu_start = time.perf_counter(), time.process_time()

    def add_episode(self, episode: Episode, lost: str | None) -> None:
        """Counts one episode that ended (``lost``: it will be regenerated or dropped)."""
        self.episodes += 1
        self.lost += lost is not None
        last = episode.trajectory
        m = last.metrics
        self.generated_tokens += m.get("generated_tokens", 0.0)
        self.prompt_tokens += m.get("prompt_tokens", 0.0)
        self.cached_tokens += m.get("cached_tokens", 0.0)
        self.turns += m.get("turns", 0.0)
        self.tool_calls += m.get("tool_calls", 0.0)
        self.sequences += len(episode.sequences)
        self.compactions += m.get("context/compactions", 0.0)
        self.summary_turns += m.get("context/summary_turns", 0.0)
        self.time_generate_s += m.get("time/generate_s", 0.0)
        self.time_env_s += m.get("time/env_s", 0.0)
        self.time_reward_s += m.get("time/reward_s", 0.0)
        for key, value in m.items():
            if key.startswith("failures/"):
                self.failure_kinds[key.removeprefix("failures/")] += int(value)
            elif key.startswith("routing/"):
                self.routing[key] += int(value)
        for seq in episode.sequences:
            for error in seq.errors:
                self.errors[error.kind.value] += 1
                if error.kind.value not in self.error_examples:
                    origin = f" (at {error.origin})" if error.origin else ""
                    self.error_examples[error.kind.value] = f"{error.component or 'episode'}: {error.message}{origin}"
        self.truncated += last.status is Status.TRUNCATED
        self.failed += last.status is Status.FAILED
        if last.stop_reason is not None:
            self.stop_reasons[last.stop_reason.value] += 1
        self.lengths.append(sum(t.response_length for t in episode.sequences))

    def finish(self, report: StepReport, groups: Sequence[RolloutGroup]) -> None:
        """Writes the step's metrics into ``report``."""
        wall = max(time.perf_counter() - self.wall_start, 1e-9)
        cpu = time.process_time() - self.cpu_start
        n = max(self.episodes, 1)
        trained = [sum(t.response_length for t in ep.sequences) for g in groups for ep in g.episodes]
        versions: Counter[str] = Counter()
        for g in groups:
            for traj in g.trajectories():
                for seg in traj.segments:
                    if seg.kind is SegmentKind.MODEL:
                        versions[str(seg.weight_version)] += 1
        report.weight_versions = dict(versions)
        report.failure_kinds = dict(self.failure_kinds)
        report.errors = dict(self.errors)
        report.error_examples = dict(self.error_examples)
        report.stop_reasons = dict(self.stop_reasons)
        report.episodes_finished = self.episodes
        report.episodes_suspended = self.suspended
        report.members_restored = self.restored
        report.restored_mismatch = len(self.restore_problems)
        report.restore_problems = self.restore_problems[:8]
        report.metrics.update({
            "wall_s": wall,
            "samples_per_s": self.episodes / wall,
            "tokens_per_s": self.generated_tokens / wall,
            "driver_cpu_s": cpu,
            "driver_cpu_ms_per_sample": 1000.0 * cpu / n,
            "time/generate_s": self.time_generate_s,
            "time/env_s": self.time_env_s,
            "time/reward_s": self.time_reward_s,
            "turns_per_episode": self.turns / n,
            "tool_calls_per_episode": self.tool_calls / n,
            "sequences_per_episode": self.sequences / n,
            "context/compactions_per_episode": self.compactions / n,
            "context/summaries_per_episode": self.summary_turns / n,
            "truncation_rate": self.truncated / n,
            "failure_rate": self.failed / n,
            "abort_rate": self.suspended / max(self.episodes + self.suspended, 1),
            "prefix_cache_hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "length/generated_mean": statistics.fmean(self.lengths) if self.lengths else 0.0,
            "length/trained_mean": statistics.fmean(trained) if trained else 0.0,
            "abort/rounds": float(self.abort_rounds),
            "abort/cancelled_tasks": float(self.abort_cancelled),
            "abort/settle_s": self.abort_settle_s,
            "abort/idle_s": self.abort_idle_s,
            "abort/engine_requests_left": float(self.engine_requests_after_abort),
            **{key: float(value) for key, value in self.routing.items()},
        })
