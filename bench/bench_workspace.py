"""Workspace benchmark: create, fork for a group, kernel cells, teardown, leftovers; baselines measured in the same run.

    python bench/bench_workspace.py [--episodes 1000] [--base-mb 50] [--docker/--no-docker]

(a) create: a fork of a prepared state (the file-system work: one tmpfs + one overlay mount), p50;
    the workspace's sandbox start-up (bubblewrap worker) and its first command reported apart.
(b) prepare once + fork x8 of a ``--base-mb`` base folder (500 files of random bytes) against
    copying the folder 8 times (``shutil.copytree``). Target: the 8 forks' file-system work <= 100 ms
    in all (sandbox start-up reported apart).
(c) kernel cell ``x + 1`` p50 against a stateless ``print(1)`` on the warm bwrap pool (the stateless
    ``python`` tool). Target: <= 5 ms.
(d) teardown p50: removing a workspace whose sandbox and kernel run.
(e) ``--episodes`` episodes as GRPO groups of 8 (prepare, 8 forks, a command in each, a kernel cell in
    one, remove): afterwards, what is left of them — processes under this one (the reaper aside),
    cgroups, holders, workspaces. Target: 0.
Docker (when a daemon answers or a private one can start): create p50 and fork x8 of the same base
(a copy into each container's tmpfs), kernel cell p50, teardown, leftover containers.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil

from agentrl.tools.sandbox import SandboxLimits
from agentrl.tools.sandbox.bwrap import NOBODY, BwrapSandbox
from agentrl.tools.sandbox.docker import DEFAULT_IMAGE
from agentrl.tools.sandbox.dockerd import PrivateDockerDaemon, daemon_unavailable_reason, ensure_image, ping
from agentrl.tools.workspace import Workspaces, WorkspaceSpec
from agentrl.tools.workspace.bwrap import BwrapWorkspace

LIMITS = SandboxLimits(timeout_s=20.0, memory_mb=256, tmp_mb=16)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(samples_s: list[float]) -> dict[str, float]:
    v = [s * 1000 for s in samples_s]
    return {"p50_ms": round(pct(v, 0.5), 3), "p95_ms": round(pct(v, 0.95), 3), "mean_ms": round(statistics.mean(v), 3)}


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t = time.perf_counter()
    await fn()
    return time.perf_counter() - t


def make_base(root: str, mb: int) -> str:
    base = os.path.join(root, "base")
    per_file = 100 * 1024
    for i in range(max(1, mb * 1024 * 1024 // per_file)):
        folder = os.path.join(base, f"d{i // 50:02d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"f{i:04d}.bin"), "wb") as f:
            f.write(os.urandom(per_file))
    if os.geteuid() == 0:  # owned by the sandbox user, as a prepared base is (nothing to stage)
        for r, dirs, files in os.walk(base):
            for name in [r, *(os.path.join(r, n) for n in dirs + files)]:
                os.lchown(name, NOBODY, NOBODY)
    return base


def copy_baseline(base: str, root: str, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        shutil.copytree(base, os.path.join(root, f"copy{i}"))
    elapsed = time.perf_counter() - t
    for i in range(n):
        shutil.rmtree(os.path.join(root, f"copy{i}"))
    return elapsed


async def fork_group(wss: Workspaces, spec: WorkspaceSpec, n: int) -> dict[str, Any]:
    """Prepare once, fork ``n`` times (file-system work), then start each fork's sandbox (apart)."""
    backend = wss.backend(spec.backend)
    t = time.perf_counter()
    prepared = await backend.prepare(spec, {"task.txt": b"task"}, f"bench-{time.time_ns()}")
    prepare_s = time.perf_counter() - t
    forks = []
    t = time.perf_counter()
    for _ in range(n):
        forks.append(await backend.fork(prepared))
    forks_s = time.perf_counter() - t
    starts = []
    for ws in forks:
        t = time.perf_counter()
        result = await ws.run("ls d00 | wc -l")
        starts.append(time.perf_counter() - t)
        assert result.ok, result
    teardown = [await timed(ws.remove) for ws in forks]
    await backend.release(prepared)
    return {"prepare_s": round(prepare_s, 4), "forks_total_ms": round(forks_s * 1000, 3),
            "first_command": ms(starts), "teardown": ms(teardown)}


async def bwrap_section(root: str, base: str, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    spec = WorkspaceSpec(base=base, limits=LIMITS, size_mb=64, verify_replay=False)
    async with Workspaces() as wss:
        print("(b) prepare once + fork x8")
        out["group"] = await fork_group(wss, spec, 8)
        out["copy8_ms"] = round(copy_baseline(base, root, 8) * 1000, 1)
        g = out["group"]
        print(f"  prepare {g['prepare_s'] * 1000:.1f} ms; 8 forks {g['forks_total_ms']:.2f} ms in all; copying the base "
              f"8 times {out['copy8_ms']:.0f} ms; first command per fork (sandbox start) p50 "
              f"{g['first_command']['p50_ms']:.1f} ms")
        print("(a) create, (c) kernel cell, (d) teardown")
        backend = wss.backend("bwrap")
        prepared = await backend.prepare(spec, {}, "bench-create")
        creates, starts, cells, teardowns = [], [], [], []
        for _ in range(n):
            t = time.perf_counter()
            ws = await backend.fork(prepared)
            creates.append(time.perf_counter() - t)
            assert isinstance(ws, BwrapWorkspace)
            starts.append(await timed(ws.sandbox))
            await ws.python("x = 41")
            for _ in range(10):
                cells.append(await timed(lambda ws=ws: ws.python("x + 1")))  # type: ignore[misc]
            assert (await ws.python("x + 1")).stdout == "42\n"
            teardowns.append(await timed(ws.remove))
        await backend.release(prepared)
        out.update(create=ms(creates), sandbox_start=ms(starts), cell=ms(cells), teardown=ms(teardowns))
        print(f"  create p50 {out['create']['p50_ms']:.2f} ms (fork); sandbox start p50 "
              f"{out['sandbox_start']['p50_ms']:.1f} ms; cell x + 1 p50 {out['cell']['p50_ms']:.2f} ms; teardown p50 "
              f"{out['teardown']['p50_ms']:.1f} ms")
    async with BwrapSandbox(LIMITS, pool_size=2) as stateless:
        for _ in range(20):
            await stateless.run("print(1)")
        out["stateless_print1"] = ms([await timed(lambda: stateless.run("print(1)")) for _ in range(200)])
    print(f"  stateless print(1) on the warm pool p50 {out['stateless_print1']['p50_ms']:.2f} ms")
    return out


async def episodes_section(episodes: int, base: str) -> dict[str, Any]:
    print(f"(e) {episodes} episodes in groups of 8")
    spec = WorkspaceSpec(base=base, limits=LIMITS, size_mb=16)
    started = time.perf_counter()
    wss = Workspaces()
    groups = (episodes + 7) // 8

    async def member(i: int, g: int) -> None:
        ws = await wss.create(spec, {"group.txt": f"group {g}"})
        try:
            result = await ws.run(f"echo {i} > mine.txt && sleep 30 & cat group.txt")
            assert result.ok and result.stdout == f"group {g}", result
            if i == 0:
                assert (await ws.python("import os\nos.fork() or __import__('time').sleep(60)\n1")).stdout in ("1\n", "")
        finally:
            await wss.remove(ws)

    for g in range(groups):
        await asyncio.gather(*(member(i, g) for i in range(min(8, episodes - 8 * g))))
        if g and g % 25 == 0:
            print(f"  {8 * g} episodes, {time.perf_counter() - started:.0f} s")
    during = wss.leftovers()
    await wss.close()
    await asyncio.sleep(0.5)
    me = psutil.Process()
    left = [p for p in me.children(recursive=True) if "agentrl._reaper" not in " ".join(_cmdline(p))]
    cgroups = glob.glob(f"/sys/fs/cgroup/*/agentrl-sandbox-{os.getpid()}-*")
    out = {"episodes": episodes, "wall_s": round(time.perf_counter() - started, 1),
           "left_processes": len(left), "left_cgroups": len(cgroups),
           "left_holders": during.get("bwrap/holders", 0), "left_workspaces": during.get("workspaces", 0),
           "prepared": wss.stats["prepared"], "created": wss.stats["created"]}
    out["leftovers"] = out["left_processes"] + out["left_cgroups"] + out["left_holders"] + out["left_workspaces"]
    print(f"  {out['created']} workspaces from {out['prepared']} preparations in {out['wall_s']} s; left: "
          f"{out['left_processes']} processes, {out['left_cgroups']} cgroups, {out['left_holders']} holders, "
          f"{out['left_workspaces']} workspaces")
    return out


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


async def docker_section(base: str, n: int) -> dict[str, Any]:
    print("Docker: create, fork x8 (a copy), kernel cell, teardown")
    daemon: PrivateDockerDaemon | None = None
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not ping(host):
        reason = daemon_unavailable_reason()
        if reason:
            print(f"  skipped: {reason}")
            return {"skipped": reason}
        daemon = PrivateDockerDaemon()
        host = await asyncio.to_thread(daemon.start)
    try:
        await asyncio.to_thread(ensure_image, host, DEFAULT_IMAGE)
        spec = WorkspaceSpec(base=base, backend="docker", limits=LIMITS, size_mb=128, verify_replay=False)
        async with Workspaces(backend_options={"docker": {"docker_host": host}}) as wss:
            out: dict[str, Any] = {"group": await fork_group(wss, spec, 8)}
            backend = wss.backend("docker")
            small = spec.replace(base=None, size_mb=16)
            prepared = await backend.prepare(small, {}, "bench-docker")
            creates, cells, teardowns = [], [], []
            for _ in range(n):
                t = time.perf_counter()
                ws = await backend.fork(prepared)
                creates.append(time.perf_counter() - t)
                await ws.python("x = 41")
                cells += [await timed(lambda ws=ws: ws.python("x + 1")) for _ in range(10)]  # type: ignore[misc]
                teardowns.append(await timed(ws.remove))
            out.update(create=ms(creates), cell=ms(cells), teardown=ms(teardowns))
            out["left_containers"] = backend.leftovers()["containers"]
        g = out["group"]
        print(f"  create p50 {out['create']['p50_ms']:.0f} ms; prepare {g['prepare_s']:.2f} s, 8 forks (copies) "
              f"{g['forks_total_ms']:.0f} ms; cell p50 {out['cell']['p50_ms']:.2f} ms; teardown p50 "
              f"{out['teardown']['p50_ms']:.0f} ms; containers left {out['left_containers']}")
        return out
    finally:
        if daemon is not None:
            await asyncio.to_thread(daemon.stop)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--n", type=int, default=20, help="workspaces for the create/cell/teardown figures")
    parser.add_argument("--base-mb", type=int, default=50)
    parser.add_argument("--docker", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    root = tempfile.mkdtemp(prefix="agentrl-bench-ws-")
    os.chmod(root, 0o755)
    try:
        base = make_base(root, args.base_mb)
        bw = await bwrap_section(root, base, args.n)
        ep = await episodes_section(args.episodes, base)
        dk = await docker_section(base, max(5, args.n // 2)) if args.docker else {"skipped": "--no-docker"}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    g = bw["group"]
    figures = {"create_p50_ms": bw["create"]["p50_ms"], "sandbox_start_p50_ms": bw["sandbox_start"]["p50_ms"],
               "prepare_ms": round(g["prepare_s"] * 1000, 2), "forks8_fs_ms": g["forks_total_ms"],
               "fork_first_command_p50_ms": g["first_command"]["p50_ms"], "cell_p50_ms": bw["cell"]["p50_ms"],
               "teardown_p50_ms": bw["teardown"]["p50_ms"], "leftovers_after_episodes": ep["leftovers"],
               "episodes": ep["episodes"], "episodes_wall_s": ep["wall_s"],
               "docker_create_p50_ms": dk.get("create", {}).get("p50_ms"),
               "docker_forks8_ms": dk.get("group", {}).get("forks_total_ms"),
               "docker_cell_p50_ms": dk.get("cell", {}).get("p50_ms"),
               "docker_teardown_p50_ms": dk.get("teardown", {}).get("p50_ms"),
               "docker_left_containers": dk.get("left_containers"), "docker": dk.get("skipped", "ran")}
    baseline = {"copy_base_8x_ms": bw["copy8_ms"], "stateless_print1_p50_ms": bw["stateless_print1"]["p50_ms"]}
    ratios = {"copy8_vs_forks8": round(bw["copy8_ms"] / max(g["forks_total_ms"], 1e-6), 1),
              "cell_vs_stateless_print1": round(bw["cell"]["p50_ms"] / bw["stateless_print1"]["p50_ms"], 3)}
    targets = {"forks8_fs_ms": 100, "cell_p50_ms": 5, "leftovers_after_episodes": 0}
    met = {"forks8_fs_ms": g["forks_total_ms"] <= 100, "cell_p50_ms": bw["cell"]["p50_ms"] <= 5,
           "leftovers_after_episodes": ep["leftovers"] == 0}
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met, "load_average": load}))


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
