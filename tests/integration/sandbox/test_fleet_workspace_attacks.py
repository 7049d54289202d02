"""The workspace attack suite, part 2 (test_workspace_attacks.py: the trainer's secrets, the grader, the
kernel's result channel) with the ``ray`` executor: the same tests, on bubblewrap workspaces that a
sandbox fleet's executor holds on a node of the session's Ray cluster. The secret is in the
executor's process (where a fleet's holders, kernels and workers start from) as well as in this one.
At the end nothing the executor started is left."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psutil
import pytest
import pytest_asyncio
from _ray_support import RayTwoHosts
from fleet_support import close_fleet, processes, start_fleet
from test_workspace_attacks import (  # noqa: F401  the suite's tests, collected again here with this module's fixtures
    SECRET_ENV,
    pytestmark,
    spec,
    test_a_cell_cannot_forge_the_kernels_results,
    test_a_named_variable_does_reach_the_workspace,
    test_cell_processes_do_not_survive_a_kernel_restart,
    test_grade_runs_where_nothing_the_model_started_exists,
    test_leftover_watchers_cannot_change_the_fix_test_reward,
    test_no_trainer_secret_reaches_any_process_or_file,
    trainer_secret,
)


@pytest.fixture(scope="module")
def backend() -> tuple[str, dict[str, Any]]:
    return "bwrap", {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def wss(ray_two_hosts: RayTwoHosts, trainer_secret: str) -> AsyncIterator[Any]:  # noqa: F811  (the fixture)
    fleet = await start_fleet(env={SECRET_ENV: trainer_secret})
    [executor] = fleet.executors()
    executor_pid = (await processes(fleet, executor))[0][0]
    assert psutil.Process(executor_pid).environ().get(SECRET_ENV) == trainer_secret  # the secret is there to leak
    yield fleet.workspaces
    await fleet.workspaces.close()
    assert fleet.workspaces.leftovers() == {"workspaces": 0}
    stats = await fleet.executor_stats()
    assert [s["live_workspaces"] for s in stats] == [0] and stats[0]["leftovers"]["workspaces"] == 0
    await close_fleet(fleet)
