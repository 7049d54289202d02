"""Per-node figures of a sandbox fleet, for the step report.

For each node: how long calls waited for admission (p50, p99), how long they ran inside the executor
(p50), how many calls ran, how many failed typed (unavailable or lost), how many executors started,
failed to start, or were lost. :meth:`FleetMetrics.take` returns them as flat ``sandbox/...`` keys
(``sandbox/<node>/queue_wait_p99_s``; ``<node>`` is the first 8 characters of the Ray node id) and
starts the next period. Fleet-wide: ``sandbox/executors`` (live now), ``sandbox/queue_wait_p99_s`` and
``sandbox/failures`` (every call that failed typed, those no node can be named for included: a
stateless call refused because every executor was busy).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

__all__ = ["COUNTS", "FleetMetrics", "percentile"]

COUNTS: tuple[str, ...] = ("calls", "failures", "starts", "start_failures", "lost")


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class _Node:
    queue_wait_s: list[float] = field(default_factory=list)
    exec_s: list[float] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)


class FleetMetrics:
    """See the module doc."""

    def __init__(self) -> None:
        self._nodes: defaultdict[str, _Node] = defaultdict(_Node)
        self._period: Counter[str] = Counter()
        self.totals: Counter[str] = Counter()  # since the fleet started (never reset)

    def waited(self, node: str, seconds: float) -> None:
        self._nodes[node[:8]].queue_wait_s.append(seconds)

    def ran(self, node: str, seconds: float) -> None:
        self._nodes[node[:8]].exec_s.append(seconds)
        self.count(node, "calls")

    def count(self, node: str | None, what: str, n: int = 1) -> None:
        if node is not None:
            self._nodes[node[:8]].counts[what] += n
        self._period[what] += n
        self.totals[what] += n

    def take(self, executors: int) -> dict[str, float]:
        """The figures since the last ``take`` (module doc)."""
        out: dict[str, float] = {"sandbox/executors": float(executors)}
        waits: list[float] = []
        for node, data in sorted(self._nodes.items()):
            prefix = f"sandbox/{node}"
            waits += data.queue_wait_s
            out[f"{prefix}/queue_wait_p50_s"] = percentile(data.queue_wait_s, 0.5)
            out[f"{prefix}/queue_wait_p99_s"] = percentile(data.queue_wait_s, 0.99)
            out[f"{prefix}/exec_p50_s"] = percentile(data.exec_s, 0.5)
            for what in COUNTS:
                out[f"{prefix}/{what}"] = float(data.counts[what])
        out["sandbox/queue_wait_p99_s"] = percentile(waits, 0.99)
        out["sandbox/failures"] = float(self._period["failures"])
        self._nodes.clear()
        self._period.clear()
        return out
