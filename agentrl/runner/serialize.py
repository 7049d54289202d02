"""Plain-JSON state of a collected batch (:class:`~agentrl.rollout.scheduler.StepBatch`), for the
checkpoint of a run whose next batch was collected but not yet trained (the async modes)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from agentrl.episode import Episode
from agentrl.rollout.groups import RolloutGroup
from agentrl.rollout.report import StepReport
from agentrl.rollout.scheduler import StepBatch

__all__ = ["batch_from_state", "batch_to_state"]


def batch_to_state(batch: StepBatch) -> dict[str, Any]:
    groups = [{"group_id": g.group_id, "prompt_id": g.prompt_id, "row": g.row, "epoch": g.epoch, "lost": g.lost,
               "regenerated": g.regenerated, "info": g.info, "episodes": [ep.to_dict() for ep in g.episodes]}
              for g in batch.groups]
    return {"groups": groups, "report": batch.report.to_dict()}


def batch_from_state(state: dict[str, Any]) -> StepBatch:
    groups = [RolloutGroup(group_id=g["group_id"], prompt_id=g["prompt_id"], row=dict(g["row"]), epoch=int(g["epoch"]),
                           lost=int(g["lost"]), regenerated=int(g["regenerated"]), info=dict(g["info"]),
                           episodes=[Episode.from_dict(e) for e in g["episodes"]])
              for g in state["groups"]]
    raw = dict(state["report"])
    known = {f.name for f in fields(StepReport)}
    report = StepReport(**{k: v for k, v in raw.items() if k in known})
    report.staleness = {int(k): int(v) for k, v in report.staleness.items()}
    return StepBatch(groups=groups, report=report)
