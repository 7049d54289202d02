"""A sandbox fleet on the test session's Ray cluster, for the suites that run with the ``ray`` executor:
:func:`start_fleet` (executors on the session's ``sandbox`` node), the executors' processes, and the
check that none of them is left after the fleet closed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import psutil
from _ray_support import RAY_SANDBOX

from agentrl.tools.fleet import Fleet, FleetConfig, Slot
from agentrl.tools.fleet.executor import ExecutorSettings
from agentrl.tools.fleet.links import ExecutorLink, start_ray_executor

ProcessTree = list[tuple[int, float]]


async def start_fleet(env: Mapping[str, str] | None = None, **changes: Any) -> Fleet:
    """A started fleet with one executor per ``sandbox`` node (the session's ``host_b``); ``env``: set in
    the executors' processes (as a trainer's secrets are in the local suite's process)."""
    settings: dict[str, Any] = {"executor": "ray", "resource": RAY_SANDBOX, "executors_per_node": 1,
                                "concurrency": 4, "refresh_s": 1.0, "admission_timeout_s": 120.0, **changes}

    def starter(index: int, node: str, executor: ExecutorSettings, max_concurrency: int) -> ExecutorLink:
        return start_ray_executor(index, node, executor, max_concurrency=max_concurrency, env=env)

    fleet = Fleet(FleetConfig(**settings), starter=starter)
    await fleet.start()
    return fleet


async def processes(fleet: Fleet, slot: Slot) -> ProcessTree:
    """``(pid, start time)`` of an executor's process and everything under it."""
    return list(await fleet.call("processes", pinned=slot, admitted=False, limit_s=10.0))


async def executor_trees(fleet: Fleet) -> list[ProcessTree]:
    return [await processes(fleet, s) for s in fleet.executors()]


def alive(tree: ProcessTree) -> list[int]:
    out = []
    for pid, created in tree:
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


async def no_process_left(trees: list[ProcessTree], when: str, wait_s: float = 30.0) -> None:
    """Every process of ``trees`` ends within ``wait_s`` (the reaper's grace included)."""
    tree = [p for t in trees for p in t]
    deadline = time.monotonic() + wait_s
    while alive(tree) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    left = alive(tree)
    assert not left, f"{when}: processes {left} still run"


async def close_fleet(fleet: Fleet) -> None:
    """Closes ``fleet`` and checks that nothing its executors started is left."""
    trees = await executor_trees(fleet)
    await fleet.close()
    await no_process_left(trees, "after the fleet closed")
