"""Mixture-of-experts routing on the rollout side: asking the engine for it, storing it in the trajectory.

A mixture-of-experts engine started with ``--enable-return-routed-experts`` returns, for a request
that sets ``return_routed_experts``, the experts every layer routed each position to, from position
``routed_experts_start_len`` to the one before the last sampled token (that token was never run
through the model). Positions served from the prefix cache come back too (SGLang keeps the routing
beside each cached key/value slot), so the prompt, tool outputs and earlier turns all have theirs.

The agent loop and the agent proxy's sessions call :func:`routing_request` before each request and
:func:`store_routing` after appending the sampled tokens:

- a request asks only for the positions the trajectory does not hold yet (the first absent row of
  its ``routed_experts`` channel), so an episode's routing travels once: linear in its length, not
  quadratic in its turns;
- a forked sequence (template, harness, compaction) starts without routing and its first request
  asks from position 0: the engine's prefix cache answers for the shared part;
- a suspended turn resumed later (partial rollouts, a run resumed from a checkpoint) asks from the
  first position still missing, whatever the engine answered before the abort;
- an answer without routing (an engine started without the flag) is counted
  (``routing/missing_answers``), and at the episode's end every position that feeds a training
  forward but has no routing is counted (``routing/missing_tokens``): the trainer routes those
  itself and counts them again (``moe/unrouted_tokens``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from agentrl.rollout.types import GenerateResult, RoutingShape
from agentrl.token_data import ROUTED_EXPERTS
from agentrl.trajectory import Trajectory

__all__ = ["held_routing", "missing_routing", "routing_request", "store_routing"]


def held_routing(traj: Trajectory) -> int:
    """How many leading positions of ``traj`` have routing (where the next request should start)."""
    channel = traj.channels.get(ROUTED_EXPERTS)
    if channel is None:
        return 0
    present = channel.present
    if present.all():
        return len(present)
    return int(np.argmin(present))


def routing_request(traj: Trajectory, shape: RoutingShape | None) -> dict[str, Any]:
    """The keyword arguments of the next ``generate`` call for ``traj`` (none when routing is off)."""
    if shape is None:
        return {}
    return {"routed_experts": shape, "routed_experts_start": min(held_routing(traj), len(traj.tokens))}


def store_routing(traj: Trajectory, result: GenerateResult, metrics: Counter[str]) -> None:
    """Write the routing of ``result`` into ``traj``'s channel (after its tokens were appended)."""
    rows = result.routed_experts
    if rows is None:
        metrics["routing/missing_answers"] += 1
        return
    if len(rows):
        changed = traj.write_channel(ROUTED_EXPERTS, result.routed_experts_start, rows)
        metrics["routing/rows"] += len(rows)
        if changed:  # positions already held came back different (not asked for: an engine anomaly)
            metrics["routing/changed_rows"] += changed


def missing_routing(traj: Trajectory) -> int:
    """Positions of ``traj`` that feed a training forward (all but the last token) without routing."""
    needed = max(len(traj.tokens) - 1, 0)
    channel = traj.channels.get(ROUTED_EXPERTS)
    if channel is None:
        return needed
    return needed - int(channel.present[:needed].sum())
