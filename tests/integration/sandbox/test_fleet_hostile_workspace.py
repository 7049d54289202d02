"""The workspace attack suite (test_workspace_hostile.py) with the ``ray`` executor: the same tests, on
bubblewrap workspaces that a sandbox fleet's executor holds on a node of the session's Ray cluster.
A killed owner is the local suite's test; on a fleet the owner is the executor, whose loss is
test_sandbox_fleet.py's node-loss test. At the end nothing the executor started is left."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from _ray_support import RayTwoHosts
from fleet_support import close_fleet, start_fleet
from test_workspace_hostile import (  # noqa: F401  the suite's tests, collected again here with this module's fixtures
    base,
    base_untouched,
    pytestmark,
    spec,
    test_a_kernel_that_forks_leaves_nothing_behind,
    test_episodes_cannot_reach_each_other_or_the_base,
    test_file_tools_cannot_leave_the_workspace,
    test_filling_the_size_cap_stops_at_the_cap,
    test_kernel_limits_and_restarts,
    test_snapshot_and_restore_rebuild_the_files,
    test_state_persists_within_an_episode,
    test_the_next_episode_from_the_same_state_starts_clean,
    tree_hash,
)


@pytest.fixture(scope="module")
def backend() -> tuple[str, dict[str, Any]]:
    return "bwrap", {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def wss(ray_two_hosts: RayTwoHosts, base: Path) -> AsyncIterator[Any]:  # noqa: F811  (base: the fixture)
    before = tree_hash(base)
    fleet = await start_fleet()
    yield fleet.workspaces
    await fleet.workspaces.close()
    assert fleet.workspaces.leftovers() == {"workspaces": 0}
    stats = await fleet.executor_stats()
    assert [s["live_workspaces"] for s in stats] == [0] and stats[0]["leftovers"]["workspaces"] == 0
    await close_fleet(fleet)
    assert tree_hash(base) == before
