"""The workspace attack suite, part 3 (test_workspace_resources.py: memory the model chooses, a full
workspace, real repositories' files) with the ``ray`` executor, on bubblewrap workspaces that a
sandbox fleet's executor holds on a node of the session's Ray cluster: the tests that go through the
workspace API alone. Left to the local suite: what the trainer's own process tree gains (a fleet's
workspaces are another process's) and what a test does to a holder's process by its id (a fleet's
holder's loss is test_sandbox_fleet.py's node-loss test). At the end nothing the executor started is
left."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from _ray_support import RayTwoHosts
from fleet_support import close_fleet, start_fleet
from test_workspace_resources import (  # noqa: F401  the suite's tests, collected again here with this module's fixtures
    pytestmark,
    spec,
    test_a_full_workspace_recovers,
    test_empty_files_stop_at_the_inode_cap,
    test_file_tools_handle_what_repositories_hold,
    test_memory_a_killed_kernel_left_stays_with_its_member,
)


@pytest.fixture(scope="module")
def backend() -> tuple[str, dict[str, Any]]:
    return "bwrap", {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def wss(ray_two_hosts: RayTwoHosts) -> AsyncIterator[Any]:
    fleet = await start_fleet()
    yield fleet.workspaces
    await fleet.workspaces.close()
    assert fleet.workspaces.leftovers() == {"workspaces": 0}
    stats = await fleet.executor_stats()
    assert [s["live_workspaces"] for s in stats] == [0] and stats[0]["leftovers"]["workspaces"] == 0
    await close_fleet(fleet)
