"""The hostile-program suite (test_sandbox_hostile.py) with the ``ray`` executor: the same programs and
checks, on a bubblewrap pool of one worker that a sandbox fleet's executor holds on a node of the
session's Ray cluster, handed out by ``create_sandbox`` while the fleet is installed. The executor's
process carries the canary variable (the trainer's secret of the local suite). At the end nothing the
executor started is left."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psutil
import pytest_asyncio
from _ray_support import RayTwoHosts
from fleet_support import close_fleet, processes, start_fleet
from sandbox_canaries import CANARY_ENV, HostCanaries
from test_sandbox_hostile import (  # noqa: F401  the suite's tests, collected again here with this module's fixture
    CASES,
    CPU_S,
    OUTPUT_CAP,
    TIMEOUT_S,
    pytestmark,
    test_hostile_program_is_contained,
    test_pool_serves_after_the_suite,
)

from agentrl.tools.fleet import FleetSandbox, use_fleet
from agentrl.tools.sandbox import Sandbox, create_sandbox


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hostile_sandbox(ray_two_hosts: RayTwoHosts, canaries: HostCanaries) -> AsyncIterator[Sandbox]:
    fleet = await start_fleet(env={CANARY_ENV: canaries.token}, concurrency=1)
    [executor] = fleet.executors()
    executor_pid = (await processes(fleet, executor))[0][0]
    assert psutil.Process(executor_pid).environ().get(CANARY_ENV) == canaries.token  # the secret is there to leak
    with use_fleet(fleet):
        sandbox = create_sandbox("bwrap", pool_size=1, timeout_s=TIMEOUT_S, cpu_s=CPU_S, memory_mb=256,
                                 max_processes=32, max_output_bytes=OUTPUT_CAP, tmp_mb=16)
    assert isinstance(sandbox, FleetSandbox)
    await sandbox.start()
    assert sandbox.capabilities().details["executor"] == "ray"
    yield sandbox
    await sandbox.close()
    await close_fleet(fleet)
