"""The sandbox fleet's router without Ray: in-process executors (a fake with the executor's methods)
behind :class:`LocalLink`, a node list the test controls. Admission (capacity, bounded queues,
deadlines, who gets a freed place), routing (stateless spread, a group's workspaces on the executor
holding their prepared state, the workspace cap), node loss and joins, start-up retries, per-node
figures, and the placement hooks of ``create_sandbox`` and ``default_workspaces``."""

from __future__ import annotations

import asyncio
import pickle
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from agentrl.tools.fleet import (
    ExecutorLostError,
    ExecutorSettings,
    ExecutorUnavailableError,
    Fleet,
    FleetConfig,
    FleetSandbox,
    LocalLink,
    RemoteWorkspace,
    select_nodes,
    use_fleet,
)
from agentrl.tools.sandbox import ExecResult, SandboxLimits, create_sandbox
from agentrl.tools.sandbox.local import UnsafeSandboxWarning
from agentrl.tools.workspace import WorkspaceError, WorkspaceSpec, default_workspaces
from agentrl.tools.workspace.manager import Workspaces

pytestmark = pytest.mark.timeout(60)


class FakeExecutor:
    """The executor's methods, recording what ran, running ``delay_s`` per call, at most what it saw at once."""

    def __init__(self, index: int, node: str, delay_s: float = 0.02) -> None:
        self.index, self.node, self.delay_s = index, node, delay_s
        self.running = 0
        self.peak = 0
        self.calls: Counter[str] = Counter()
        self.workspaces: dict[str, tuple[str, Any]] = {}
        self.closed = False
        self.hang = False
        self.ready_error: Exception | None = None

    async def _work(self) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(3600 if self.hang else self.delay_s)
        finally:
            self.running -= 1

    async def ready(self) -> dict[str, Any]:
        if self.ready_error is not None:
            raise self.ready_error
        return {"node": self.node, "index": self.index}

    async def run(self, backend: str, limits: SandboxLimits, options: Any, code: str, language: str,
                  timeout_s: float | None) -> ExecResult:
        self.calls["run"] += 1
        await self._work()
        return ExecResult(stdout=f"{self.node}/{self.index}: {code}", stderr="", exit_code=0)

    async def ws_create(self, spec: WorkspaceSpec, files: Mapping[str, Any] | None, snapshot: bytes | None) -> tuple[str, str]:
        self.calls["ws_create"] += 1
        ws_id = f"{self.index}-{len(self.workspaces)}"
        self.workspaces[ws_id] = (str(dict(files or {})), snapshot)
        return ws_id, f"ws-{ws_id}"

    async def ws_call(self, ws_id: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if ws_id not in self.workspaces:
            raise WorkspaceError(f"workspace {ws_id}: not here")
        self.calls[f"ws_{method}"] += 1
        await self._work()
        return ExecResult(stdout=f"{self.node}:{ws_id}:{args[0] if args else ''}", stderr="", exit_code=0)

    async def ws_remove(self, ws_id: str) -> None:
        self.calls["ws_remove"] += 1
        self.workspaces.pop(ws_id, None)

    async def stats(self) -> dict[str, Any]:
        return {"live_workspaces": len(self.workspaces)}

    async def close(self) -> None:
        self.closed = True


class Cluster:
    """Nodes the test adds and removes; executors started on them as :class:`FakeExecutor`."""

    def __init__(self, nodes: dict[str, dict[str, float]], delay_s: float = 0.02) -> None:
        self.nodes = {name: {"NodeID": name, "Alive": True, "Resources": res} for name, res in nodes.items()}
        self.delay_s = delay_s
        self.executors: list[FakeExecutor] = []
        self.links: list[LocalLink] = []
        self.fail_ready: dict[str, int] = {}  # node -> how many starts fail there

    def list(self) -> list[dict[str, Any]]:
        return list(self.nodes.values())

    def start(self, index: int, node: str, settings: ExecutorSettings, max_concurrency: int) -> LocalLink:
        executor = FakeExecutor(index, node, self.delay_s)
        if self.fail_ready.get(node, 0) > 0:
            self.fail_ready[node] -= 1
            executor.ready_error = RuntimeError(f"no bubblewrap on {node}")
        self.executors.append(executor)
        link = LocalLink(executor, node)
        self.links.append(link)
        return link

    def on(self, node: str) -> list[FakeExecutor]:
        return [e for e in self.executors if e.node == node and e.ready_error is None]


def fleet_on(cluster: Cluster, **config: Any) -> Fleet:
    settings = {"executor": "ray", "resource": "sandbox", "refresh_s": 3600.0, "admission_timeout_s": 5.0, **config}
    return Fleet(FleetConfig(**settings), nodes=cluster.list, starter=cluster.start, probe_backend=None)


SPEC = WorkspaceSpec(limits=SandboxLimits(timeout_s=5.0))


def test_nodes_are_chosen_by_resource_cpu_only_first() -> None:
    nodes = [{"NodeID": "gpu", "Alive": True, "Resources": {"CPU": 8, "GPU": 4, "sandbox": 1}},
             {"NodeID": "cpu", "Alive": True, "Resources": {"CPU": 8, "sandbox": 1}},
             {"NodeID": "plain", "Alive": True, "Resources": {"CPU": 8}},
             {"NodeID": "dead", "Alive": False, "Resources": {"CPU": 8, "sandbox": 1}}]
    assert select_nodes(nodes, "sandbox", cpu_nodes_first=True) == ["cpu"]
    assert select_nodes(nodes, "sandbox", cpu_nodes_first=False) == ["gpu", "cpu"]
    assert select_nodes(nodes[:1], "sandbox", cpu_nodes_first=True) == ["gpu"]  # only accelerator nodes: those
    assert select_nodes(nodes, None, cpu_nodes_first=True) == ["cpu", "plain"]


def test_config_errors_name_the_field_the_value_and_what_was_expected() -> None:
    with pytest.raises(ValueError, match=r"FleetConfig.executors_per_node=0: expected an int >= 1"):
        FleetConfig(executors_per_node=0)
    with pytest.raises(ValueError, match=r"FleetConfig.executor='k8s': expected one of \('local', 'ray'\)"):
        FleetConfig(executor="k8s")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"FleetConfig.resource=' ': expected the name of a Ray resource"):
        FleetConfig(resource=" ")
    with pytest.raises(ValueError, match="executor='ray'"):
        Fleet(FleetConfig())
    assert "2 executor(s) per node" in FleetConfig(executor="ray", executors_per_node=2).describe()


def test_errors_survive_pickling_with_their_reason_and_node() -> None:
    lost = pickle.loads(pickle.dumps(ExecutorLostError("gone", node="n1")))
    assert isinstance(lost, ExecutorLostError) and lost.reason == "executor_lost" and lost.node == "n1"
    busy = pickle.loads(pickle.dumps(ExecutorUnavailableError("full", reason="queue_full")))
    assert type(busy) is ExecutorUnavailableError and busy.reason == "queue_full" and str(busy) == "full"


async def test_executors_go_only_to_labelled_nodes_and_calls_spread() -> None:
    cluster = Cluster({"a": {"CPU": 1}, "b": {"CPU": 1, "sandbox": 1}, "c": {"CPU": 1, "sandbox": 1}})
    fleet = fleet_on(cluster, executors_per_node=2, concurrency=2)
    await fleet.start()
    assert sorted(s.node for s in fleet.executors()) == ["b", "b", "c", "c"]
    sandbox = fleet.sandbox("bwrap", SandboxLimits(timeout_s=5))
    results = await asyncio.gather(*(sandbox.run(f"print({i})") for i in range(40)))
    assert all(r.ok for r in results)
    served = Counter(r.stdout.split(":")[0] for r in results)
    assert set(served) == {"b/0", "b/1", "c/2", "c/3"} or len(served) == 4, served
    assert all(e.peak <= 2 for e in cluster.executors)  # never more than `concurrency` at once
    assert max(e.peak for e in cluster.executors) == 2
    await fleet.close()
    assert all(e.closed for e in cluster.executors)


async def test_a_full_queue_refuses_and_a_long_wait_fails_typed_instead_of_hanging() -> None:
    cluster = Cluster({"b": {"sandbox": 1}}, delay_s=0.5)
    fleet = fleet_on(cluster, concurrency=1, queue_limit=2, admission_timeout_s=0.3)
    await fleet.start()
    sandbox = fleet.sandbox()
    outcomes = await asyncio.gather(*(sandbox.run("x") for _ in range(5)), return_exceptions=True)
    reasons = sorted(o.reason if isinstance(o, ExecutorUnavailableError) else "ok" for o in outcomes)
    # 1 runs; 2 wait (past their 0.3 s deadline, the running call takes 0.5 s); 2 find the queue full
    assert reasons == ["admission_timeout", "admission_timeout", "ok", "queue_full", "queue_full"], outcomes
    metrics = fleet.take_metrics()
    assert metrics["sandbox/failures"] == 4 and metrics["sandbox/b/calls"] == 1  # stateless: no node to name
    await fleet.close()


async def test_a_freed_place_goes_to_the_longest_waiting_call() -> None:
    cluster = Cluster({"b": {"sandbox": 1}}, delay_s=0.05)
    fleet = fleet_on(cluster, concurrency=1, queue_limit=8)
    await fleet.start()
    sandbox = fleet.sandbox()
    order: list[int] = []

    async def call(i: int) -> None:
        await sandbox.run(str(i))
        order.append(i)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.ensure_future(call(i)))
        await asyncio.sleep(0.005)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    await fleet.close()


async def test_a_group_shares_the_executor_holding_its_prepared_state() -> None:
    cluster = Cluster({"b": {"sandbox": 1}, "c": {"sandbox": 1}})
    fleet = fleet_on(cluster, executors_per_node=2)
    await fleet.start()
    group_a = await asyncio.gather(*(fleet.workspaces.create(SPEC, {"row": "a"}) for _ in range(4)))
    group_b = await asyncio.gather(*(fleet.workspaces.create(SPEC, {"row": "b"}) for _ in range(4)))
    assert all(isinstance(ws, RemoteWorkspace) for ws in group_a + group_b)
    assert len({ws.executor for ws in group_a}) == 1 and len({ws.executor for ws in group_b}) == 1
    assert group_a[0].executor != group_b[0].executor  # a new prepared state goes where there is most room
    out = await group_a[1].run("echo hi")
    assert out.stdout.startswith(group_a[1].node) and out.stdout.endswith(":echo hi")
    for ws in group_a + group_b:
        await fleet.workspaces.remove(ws)
    assert fleet.workspaces.leftovers() == {"workspaces": 0}
    assert sum(len(e.workspaces) for e in cluster.executors) == 0
    assert all(s.workspaces == 0 and not s.prepared for s in fleet.executors())
    await fleet.close()


async def test_the_workspace_cap_waits_for_room_then_fails_typed() -> None:
    cluster = Cluster({"b": {"sandbox": 1}})
    fleet = fleet_on(cluster, max_workspaces=2, admission_timeout_s=0.3)
    await fleet.start()
    first, second = await fleet.workspaces.create(SPEC), await fleet.workspaces.create(SPEC)
    with pytest.raises(ExecutorUnavailableError) as refused:
        await fleet.workspaces.create(SPEC)
    assert refused.value.reason == "admission_timeout"
    later = asyncio.ensure_future(fleet.workspaces.create(SPEC))
    await asyncio.sleep(0.05)
    await fleet.workspaces.remove(first)
    third = await asyncio.wait_for(later, 1.0)  # served as soon as a workspace was removed
    await fleet.workspaces.remove(second)
    await fleet.workspaces.remove(third)
    await fleet.close()


async def test_a_lost_executor_fails_its_calls_and_workspaces_typed_and_is_replaced() -> None:
    cluster = Cluster({"b": {"sandbox": 1}, "c": {"sandbox": 1}}, delay_s=0.2)
    fleet = fleet_on(cluster)
    await fleet.start()
    ws = await fleet.workspaces.create(SPEC, {"row": "x"})
    victim = next(link for link in cluster.links if link.node == ws.node)
    running = asyncio.ensure_future(ws.run("sleep"))
    await asyncio.sleep(0.05)
    victim.lose()
    with pytest.raises(ExecutorLostError):
        await running
    with pytest.raises(ExecutorLostError):
        await ws.python("1")  # the workspace went with its executor
    await fleet.workspaces.remove(ws)  # forgets it: nothing to remove there
    assert fleet.workspaces.leftovers() == {"workspaces": 0}
    assert ws.node not in {s.node for s in fleet.executors()}
    metrics = fleet.take_metrics()
    assert metrics[f"sandbox/{ws.node}/lost"] == 1
    other = await fleet.sandbox().run("still served")
    assert other.ok and not other.stdout.startswith(ws.node)
    await fleet.refresh()  # the node is alive: its executor is started again
    await asyncio.sleep(0.05)
    assert sorted(s.node for s in fleet.executors()) == ["b", "c"]
    await fleet.close()


async def test_a_node_that_leaves_loses_its_executors_and_one_that_joins_is_used() -> None:
    cluster = Cluster({"b": {"sandbox": 1}, "c": {"sandbox": 1}})
    fleet = fleet_on(cluster, executors_per_node=2)
    await fleet.start()
    ws = next(w for w in [await fleet.workspaces.create(SPEC, {"r": str(i)}) for i in range(4)] if w.node == "c")
    cluster.nodes["c"]["Alive"] = False
    await fleet.refresh()
    assert {s.node for s in fleet.executors()} == {"b"}
    with pytest.raises(ExecutorLostError, match="gone"):
        await ws.run("x")
    cluster.nodes["d"] = {"NodeID": "d", "Alive": True, "Resources": {"sandbox": 1}}
    await fleet.refresh()
    await asyncio.sleep(0.05)
    assert Counter(s.node for s in fleet.executors()) == {"b": 2, "d": 2}
    results = await asyncio.gather(*(fleet.sandbox().run(str(i)) for i in range(40)))
    assert any(r.stdout.startswith("d/") for r in results)  # the new node serves
    await fleet.close()


async def test_start_up_is_retried_and_a_fleet_that_cannot_start_says_why() -> None:
    cluster = Cluster({"b": {"sandbox": 1}})
    cluster.fail_ready["b"] = 2
    fleet = fleet_on(cluster, start_retries=2)
    await fleet.start()  # two failed starts, the third serves
    assert len(fleet.executors()) == 1
    metrics = fleet.take_metrics()
    assert metrics["sandbox/b/starts"] == 3 and metrics["sandbox/b/start_failures"] == 2
    await fleet.close()
    broken = Cluster({"b": {"sandbox": 1}})
    broken.fail_ready["b"] = 10
    fleet = fleet_on(broken, start_retries=1)
    with pytest.raises(ExecutorUnavailableError, match="no bubblewrap on b") as failed:
        await fleet.start()
    assert failed.value.reason == "start_failed"
    await fleet.close()
    unlabelled = fleet_on(Cluster({"a": {"CPU": 2}}))
    with pytest.raises(ExecutorUnavailableError, match=r"--resources '\{\"sandbox\": 1\}'") as none:
        await unlabelled.start()
    assert none.value.reason == "no_executor"


async def test_a_call_past_its_limit_and_grace_fails_typed() -> None:
    cluster = Cluster({"b": {"sandbox": 1}})
    fleet = fleet_on(cluster, call_grace_s=0.2)
    await fleet.start()
    cluster.executors[0].hang = True
    with pytest.raises(ExecutorUnavailableError) as late:
        await fleet.sandbox("bwrap", SandboxLimits(timeout_s=0.1)).run("x")
    assert late.value.reason == "call_deadline"
    cluster.executors[0].hang = False
    assert (await fleet.sandbox().run("y")).ok  # the place was given back
    await fleet.close()


async def test_figures_per_node() -> None:
    cluster = Cluster({"b": {"sandbox": 1}, "c": {"sandbox": 1}}, delay_s=0.01)
    fleet = fleet_on(cluster, concurrency=1)
    await fleet.start()
    await asyncio.gather(*(fleet.sandbox().run(str(i)) for i in range(20)))
    metrics = fleet.take_metrics()
    assert metrics["sandbox/executors"] == 2
    for node in ("b", "c"):
        assert metrics[f"sandbox/{node}/calls"] >= 1
        assert metrics[f"sandbox/{node}/exec_p50_s"] >= 0.01
        assert metrics[f"sandbox/{node}/queue_wait_p99_s"] >= metrics[f"sandbox/{node}/queue_wait_p50_s"]
        assert metrics[f"sandbox/{node}/starts"] == 1
    assert metrics["sandbox/b/calls"] + metrics["sandbox/c/calls"] == 20
    assert metrics["sandbox/queue_wait_p99_s"] > 0.01  # 20 calls on 2 places: most waited
    assert fleet.take_metrics() == {"sandbox/executors": 2.0, "sandbox/queue_wait_p99_s": 0.0,
                                    "sandbox/failures": 0.0}  # a new period
    await fleet.close()


async def test_an_installed_fleet_is_what_create_sandbox_and_default_workspaces_give() -> None:
    cluster = Cluster({"b": {"sandbox": 1}})
    fleet = fleet_on(cluster)
    await fleet.start()
    with use_fleet(fleet):
        sandbox = create_sandbox("bwrap", pool_size=1, timeout_s=3)
        assert isinstance(sandbox, FleetSandbox) and sandbox.limits.timeout_s == 3
        assert (await sandbox.run("print(1)")).stdout == "b/0: print(1)"
        assert default_workspaces() is fleet.workspaces
        with pytest.warns(UnsafeSandboxWarning):
            local = create_sandbox("local", pool_size=1)  # the explicit debugging backend stays here
        assert not isinstance(local, FleetSandbox)
        await local.close()
    assert isinstance(default_workspaces(), Workspaces)
    await fleet.close()


async def test_the_step_report_carries_the_fleets_figures_per_node() -> None:
    from agentrl.rollout import StepReport
    from agentrl.rollout.scheduler import StepBatch
    from agentrl.runner.rollout_service import RolloutService

    class OneStep:
        async def collect(self) -> StepBatch:
            return StepBatch(groups=[], report=StepReport(step=1, policy_version=0))

    cluster = Cluster({"b": {"sandbox": 1}})
    fleet = fleet_on(cluster)
    await fleet.start()
    await fleet.sandbox().run("x")
    service = RolloutService(scheduler=OneStep(), weights=None)  # type: ignore[arg-type]
    service.fleet = fleet
    report = (await service.collect()).report
    assert report.metrics["sandbox/b/calls"] == 1 and report.metrics["sandbox/executors"] == 1
    assert "sandbox/b/queue_wait_p99_s" in report.metrics and "sandbox/b/exec_p50_s" in report.metrics
    assert (await service.collect()).report.metrics.get("sandbox/b/calls") is None  # per step, not cumulative
    await fleet.close()
