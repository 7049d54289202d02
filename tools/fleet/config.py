"""Where a run's sandboxes and workspaces execute: :class:`FleetConfig` (the run config's ``[sandbox]``).

``executor = "local"`` (the default): in the process that runs the episodes, on its machine, as
without a fleet. ``executor = "ray"``: on *executors*, Ray actors placed on the nodes that carry the
Ray resource ``resource`` (``ray start --resources '{"sandbox": 1}'``), ``executors_per_node`` on
each, each running at most ``concurrency`` calls at once with at most ``queue_limit`` more waiting.
See :mod:`agentrl.tools.fleet` for what each setting does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge, Gt

from agentrl._limits import check_limits

__all__ = ["EXECUTORS", "FleetConfig"]

EXECUTORS: tuple[str, ...] = ("local", "ray")


@dataclass(frozen=True)
class FleetConfig:
    """Settings of a sandbox fleet (module doc).

    - ``executor``: ``local`` (this machine, no fleet) or ``ray`` (executors on the cluster's nodes);
    - ``resource``: the Ray resource that marks a node for executors (``None``: every node); among
      the marked nodes, those without accelerators are used when there are any (``cpu_nodes_first``);
    - ``executors_per_node``, ``concurrency`` (calls one executor runs at once; the size of its warm
      pools), ``queue_limit`` (calls that may wait for one executor), ``max_workspaces`` (live
      workspaces one executor holds);
    - ``admission_timeout_s``: how long a call may wait for room before it fails
      ``sandbox_unavailable``; ``call_grace_s``: how long past its own time limit a call may take
      before the executor counts as not answering;
    - ``start_timeout_s``, ``start_retries``: an executor's start-up (its actor and the first warm
      pool) has its own time-out, retried this many times;
    - ``refresh_s``: how often the cluster's nodes are looked at (a node that joins gets executors,
      one that left loses them).
    """

    executor: Literal["local", "ray"] = "local"
    resource: str | None = "sandbox"
    executors_per_node: Annotated[int, Ge(1)] = 1
    concurrency: Annotated[int, Ge(1)] = 8
    queue_limit: Annotated[int, Ge(0)] = 64
    max_workspaces: Annotated[int, Ge(1)] = 64
    admission_timeout_s: Annotated[float, Gt(0.0)] = 60.0
    call_grace_s: Annotated[float, Gt(0.0)] = 30.0
    start_timeout_s: Annotated[float, Gt(0.0)] = 120.0
    start_retries: Annotated[int, Ge(0)] = 2
    refresh_s: Annotated[float, Gt(0.0)] = 5.0
    cpu_nodes_first: bool = True

    def __post_init__(self) -> None:
        check_limits(self)
        if self.executor not in EXECUTORS:
            raise ValueError(f"FleetConfig.executor={self.executor!r}: expected one of {EXECUTORS}")
        if self.resource is not None and (not isinstance(self.resource, str) or not self.resource.strip()):
            raise ValueError(f"FleetConfig.resource={self.resource!r}: expected the name of a Ray resource "
                             "(e.g. 'sandbox') or None for every node")

    def describe(self) -> str:
        """One line for the dry run: where calls run and how they are admitted."""
        if self.executor == "local":
            return "local: in the rollout process, on its machine (sandbox.executor='ray' runs them on a Ray cluster)"
        where = f"nodes carrying Ray resource {self.resource!r}" if self.resource else "every node"
        first = " (CPU-only ones first)" if self.cpu_nodes_first else ""
        return (f"ray: {self.executors_per_node} executor(s) per node on {where}{first}; {self.concurrency} calls "
                f"at once each, {self.queue_limit} waiting, {self.max_workspaces} workspaces; admission deadline "
                f"{self.admission_timeout_s:g} s; start-up {self.start_timeout_s:g} s x {self.start_retries + 1} tries")
