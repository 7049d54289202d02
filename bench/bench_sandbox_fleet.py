"""Sandbox fleet benchmark: workspace episodes through executors on two simulated Ray nodes against the
local workspaces on the same cores; the baseline measured in the same run.

    python bench/bench_sandbox_fleet.py [--episodes 256] [--group 8] [--concurrency 8] [--rounds 2]

Each episode is a workspace forked for its group (``--group`` members share a row, hence a prepared
state), five tool calls on it (``write_file``, a ``bash`` command running Python, ``read_file``, a
kernel cell, ``bash ls``) and its removal; all ``--episodes`` run at once.

- **local** (the baseline): :class:`~agentrl.tools.workspace.Workspaces` in this process, at most
  ``2 × concurrency`` calls at once (a semaphore: the same admission the fleet has, so the ratio is
  the fleet's own overhead, not a different amount of parallel work on two cores);
- **fleet**: a ``ray.cluster_utils.Cluster`` on this machine (a head without the ``sandbox``
  resource, two nodes with it), one executor per node, ``--concurrency`` calls at once each.

Rounds alternate (local, fleet, local, fleet...); each side's best round counts. Figures: tool calls
per second (creation and removal inside the wall time), queue wait p50/p99 of the fleet's calls
(per node and overall), episodes that failed; leftovers after each side: processes (for the fleet,
every process its executors had started), ``agentrl-sandbox`` cgroups, live workspaces. Targets:
throughput ≥ 0.8× local (the fleet's overhead bound on one machine), 0 leftovers, 0 failed episodes.

The bench takes the machine's heavy-job lock (``--lock``, default ``/tmp/agentrl-heavy.lock``) for
its whole run, unless a process it was started by already holds it (``flock LOCK python ...``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psutil

from agentrl.tools.fleet import Fleet, FleetConfig
from agentrl.tools.sandbox import SandboxLimits
from agentrl.tools.workspace import Workspace, Workspaces, WorkspaceSpec

SPEC = WorkspaceSpec(limits=SandboxLimits(timeout_s=30.0, memory_mb=256, tmp_mb=16), size_mb=16,
                     kernel_memory_mb=192, cell_timeout_s=30.0)
TARGET_RATIO = 0.8


@contextlib.contextmanager
def heavy_lock(path: str) -> Iterator[str]:
    """Holds ``path`` (flock) for the block; nothing when empty or an ancestor process holds it already."""
    if not path:
        yield "none"
        return
    with open(path, "a") as handle:
        inode = os.fstat(handle.fileno()).st_ino
        ancestors = {p.pid for p in psutil.Process().parents()}
        with open("/proc/locks") as locks:
            holders = [int(f[4]) for f in (line.split() for line in locks)
                       if len(f) > 5 and f[1] == "FLOCK" and f[5].endswith(f":{inode}")]
        if ancestors & set(holders):
            yield "held by the parent"
            return
        print(f"waiting for the heavy-job lock {path}", flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield "taken"
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


Create = Callable[[WorkspaceSpec, dict[str, str]], Awaitable[Workspace]]
Remove = Callable[[Workspace], Awaitable[None]]


async def episodes(create: Create, remove: Remove, n: int, group: int, limit: asyncio.Semaphore | None,
                   ) -> dict[str, Any]:
    """``n`` episodes at once (module doc); returns the wall time, calls, failures."""
    failures: list[str] = []

    async def call(fn: Callable[[], Awaitable[Any]]) -> Any:
        if limit is None:
            return await fn()
        async with limit:
            return await fn()

    async def episode(i: int) -> None:
        row = i // group
        try:
            ws = await call(lambda: create(SPEC, {"task.txt": f"row {row}\n"}))
        except Exception as exc:
            failures.append(f"create: {type(exc).__name__}: {exc}"[:300])
            return
        try:
            await call(lambda: ws.file_op("write", path="sol.py", content=f"print(sum(range({i} + 10)))\n"))
            ran = await call(lambda: ws.run("cat task.txt && python3 sol.py"))
            read = await call(lambda: ws.file_op("read", path="sol.py", start_line=1, max_lines=0))
            cell = await call(lambda: ws.python("x = 6 * 7\nx"))
            ls = await call(lambda: ws.run("ls"))
            expected = f"row {row}\n{sum(range(i + 10))}\n"
            if ran.stdout != expected or "sum(range" not in str(read.get("content")) or cell.stdout != "42\n" \
                    or "sol.py" not in ls.stdout:
                failures.append(f"episode {i}: unexpected output {ran.stdout!r} {cell.stdout!r} {ls.stdout!r}")
        except Exception as exc:
            failures.append(f"episode {i}: {type(exc).__name__}: {exc}"[:300])
        finally:
            await remove(ws)

    started = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in range(n)))
    wall = time.perf_counter() - started
    return {"wall_s": round(wall, 2), "calls": n * 5, "calls_per_s": round(n * 5 / wall, 1),
            "failed_episodes": len(failures), "failures": failures[:3]}


def own_processes() -> list[psutil.Process]:
    me = psutil.Process()
    out = []
    for p in me.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "agentrl._reaper" not in cmd and "ray" not in p.name() and "/ray/" not in cmd and "raylet" not in cmd:
            out.append(p)
    return out


async def local_round(n: int, group: int, concurrency: int) -> dict[str, Any]:
    wss = Workspaces()
    out = await episodes(wss.create, wss.remove, n, group, asyncio.Semaphore(concurrency))
    await wss.close()
    await asyncio.sleep(0.5)
    out["left_workspaces"] = wss.leftovers()["workspaces"]
    out["left_processes"] = len(own_processes())
    out["left_cgroups"] = len(glob.glob(f"/sys/fs/cgroup/*/agentrl-sandbox-{os.getpid()}-*"))
    return out


def alive(tree: list[tuple[int, float]]) -> list[int]:
    pids = []
    for pid, created in tree:
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                pids.append(pid)
        except psutil.Error:
            continue
    return pids


async def fleet_round(fleet: Fleet, n: int, group: int) -> dict[str, Any]:
    fleet.take_metrics()
    out = await episodes(fleet.workspaces.create, fleet.workspaces.remove, n, group, None)
    metrics = fleet.take_metrics()
    out["queue_wait_p99_ms"] = round(metrics["sandbox/queue_wait_p99_s"] * 1000, 1)
    out["per_node"] = {k.split("/")[1]: {} for k in metrics if k.count("/") == 2}
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3:
            if key.endswith("_s"):
                out["per_node"][parts[1]][parts[2][:-2] + "_ms"] = round(value * 1000, 1)
            else:
                out["per_node"][parts[1]][parts[2]] = value
    stats = await fleet.executor_stats()
    out["left_workspaces"] = fleet.workspaces.leftovers()["workspaces"] + sum(s["live_workspaces"] for s in stats)
    return out


@contextlib.contextmanager
def simulated_cluster() -> Iterator[Any]:
    """A head without the ``sandbox`` resource and two nodes with it (one CPU each declared), this process
    connected; everything stopped afterwards."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="ray-b-", dir="/tmp")
    os.makedirs(os.path.join(temp, "ray"))
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 1, "object_store_memory": 100 << 20, "include_dashboard": False, "temp_dir": temp})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, resources={"sandbox": 1}, object_store_memory=100 << 20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="bench-fleet", logging_level="ERROR", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(temp, ignore_errors=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    config = FleetConfig(executor="ray", resource="sandbox", executors_per_node=1, concurrency=args.concurrency,
                         max_workspaces=args.episodes, queue_limit=args.episodes, admission_timeout_s=600.0)
    fleet = Fleet(config)
    started = time.perf_counter()
    await fleet.start()
    boot_s = time.perf_counter() - started
    trees = {s.name: await fleet.call("processes", pinned=s, admitted=False, limit_s=30.0) for s in fleet.executors()}
    print(f"fleet: {len(fleet.executors())} executors on {len({s.node for s in fleet.executors()})} nodes, started in "
          f"{boot_s:.1f} s", flush=True)
    local_runs, fleet_runs = [], []
    try:
        for r in range(args.rounds):
            local = await local_round(args.episodes, args.group, 2 * args.concurrency)
            print(f"round {r + 1} local: {local['calls_per_s']} calls/s ({local['wall_s']} s), failed "
                  f"{local['failed_episodes']}", flush=True)
            remote = await fleet_round(fleet, args.episodes, args.group)
            print(f"round {r + 1} fleet: {remote['calls_per_s']} calls/s ({remote['wall_s']} s), queue wait p99 "
                  f"{remote['queue_wait_p99_ms']} ms, failed {remote['failed_episodes']}", flush=True)
            local_runs.append(local)
            fleet_runs.append(remote)
        for slot in fleet.executors():
            trees[slot.name] = await fleet.call("processes", pinned=slot, admitted=False, limit_s=30.0)
        executor_pids = [tree[0][0] for tree in trees.values()]
    finally:
        await fleet.close()
    left = []
    for _ in range(100):
        left = [pid for tree in trees.values() for pid in alive(tree)]
        if not left:
            break
        await asyncio.sleep(0.2)
    cgroups = [g for pid in executor_pids for g in glob.glob(f"/sys/fs/cgroup/*/agentrl-sandbox-{pid}-*")]
    best_local = max(local_runs, key=lambda x: x["calls_per_s"])
    best_fleet = max(fleet_runs, key=lambda x: x["calls_per_s"])
    local_left = sum(r["left_workspaces"] + r["left_processes"] + r["left_cgroups"] for r in local_runs)
    fleet_left = len(left) + len(cgroups) + sum(r["left_workspaces"] for r in fleet_runs)
    ratio = best_fleet["calls_per_s"] / best_local["calls_per_s"]
    figures = {"fleet_calls_per_s": best_fleet["calls_per_s"], "fleet_queue_wait_p99_ms": best_fleet["queue_wait_p99_ms"],
               "fleet_per_node": best_fleet["per_node"], "fleet_start_s": round(boot_s, 1),
               "fleet_leftovers": fleet_left, "local_leftovers": local_left,
               "failed_episodes": sum(r["failed_episodes"] for r in local_runs + fleet_runs),
               "episodes": args.episodes, "calls_per_episode": 5, "rounds": args.rounds,
               "fleet_rounds_calls_per_s": [r["calls_per_s"] for r in fleet_runs],
               "local_rounds_calls_per_s": [r["calls_per_s"] for r in local_runs],
               "failure_examples": [f for r in local_runs + fleet_runs for f in r["failures"]][:3]}
    targets = {"throughput_ratio": TARGET_RATIO, "fleet_leftovers": 0, "failed_episodes": 0}
    met = {"throughput_ratio": ratio >= TARGET_RATIO, "fleet_leftovers": fleet_left == 0,
           "failed_episodes": figures["failed_episodes"] == 0}
    return {"figures": figures, "baseline": {"local_calls_per_s": best_local["calls_per_s"],
                                             "local_concurrency": 2 * args.concurrency},
            "ratios": {"throughput_ratio": round(ratio, 3)}, "targets": targets, "met": met}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lock", default="/tmp/agentrl-heavy.lock")
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        sys.exit("bench_sandbox_fleet: needs bwrap (bubblewrap) on PATH")
    with heavy_lock(args.lock) as lock:
        print(f"heavy-job lock: {lock}", flush=True)
        with simulated_cluster():
            result = asyncio.run(run(args))
    ok = all(result["met"].values())
    print(f"throughput {result['figures']['fleet_calls_per_s']} calls/s through the fleet vs "
          f"{result['baseline']['local_calls_per_s']} local: {result['ratios']['throughput_ratio']}x (target >= "
          f"{TARGET_RATIO}); queue wait p99 {result['figures']['fleet_queue_wait_p99_ms']} ms; leftovers "
          f"{result['figures']['fleet_leftovers']}; {'all targets met' if ok else 'targets missed'}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
