"""The workspace attack suite, part 3 (test_workspace_resources.py: memory the model chooses, a full
workspace, real repositories' files) with the ``ray`` executor, on bubblewrap workspaces that a
sandbox fleet's executor holds on a node of the session's Ray cluster: the whole suite, with the
executor's process tree where the local suite measures its own (a sparse file's snapshot) and the
holder found in that tree where the local suite reads it off the workspace (a member's check, a
killed holder). At the end nothing the executor started is left."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psutil
import pytest
import pytest_asyncio
from _ray_support import RayTwoHosts
from fleet_support import close_fleet, processes, start_fleet
from test_workspace_resources import (  # noqa: F401  the suite's tests, collected again here with this module's fixtures
    HolderOf,
    pytestmark,
    spec,
    test_a_dead_workspace_answers_with_typed_failures,
    test_a_full_workspace_recovers,
    test_a_members_check_is_not_the_groups,
    test_a_sparse_file_costs_what_it_holds,
    test_empty_files_stop_at_the_inode_cap,
    test_file_tools_handle_what_repositories_hold,
    test_memory_a_killed_kernel_left_stays_with_its_member,
)

from agentrl.tools.fleet import Fleet


@pytest.fixture(scope="module")
def backend() -> tuple[str, dict[str, Any]]:
    return "bwrap", {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(ray_two_hosts: RayTwoHosts) -> AsyncIterator[Fleet]:
    started = await start_fleet()
    yield started
    await started.workspaces.close()
    assert started.workspaces.leftovers() == {"workspaces": 0}
    stats = await started.executor_stats()
    assert [s["live_workspaces"] for s in stats] == [0] and stats[0]["leftovers"]["workspaces"] == 0
    await close_fleet(started)


@pytest.fixture(scope="module")
def wss(fleet: Fleet) -> Any:
    return fleet.workspaces


async def _tree(fleet: Fleet) -> list[int]:
    [slot] = fleet.executors()
    return [pid for pid, _ in await processes(fleet, slot)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workspace_processes(fleet: Fleet) -> int:
    """The executor's process: it runs the workspace API (digests, snapshots) and holds the holders."""
    return (await _tree(fleet))[0]


def _runs_holder(pid: int) -> bool:
    try:
        return any(arg.endswith("_holder.py") for arg in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


@pytest.fixture(scope="module")
def holder_of(fleet: Fleet) -> HolderOf:
    """The holder in the executor's tree (the tests hold one workspace group at a time): the topmost
    process running ``_holder.py``, as the local suite's ``group.holder.pid`` is."""
    async def pid(ws: Any) -> int:
        holders = [p for p in await _tree(fleet) if _runs_holder(p)]
        top = [p for p in holders if psutil.Process(p).ppid() not in holders]
        assert len(top) == 1, f"expected one workspace holder under the executor, found {top} (of {holders})"
        return top[0]
    return pid
