"""Sandbox benchmark: warm-pool latency, async concurrency and Docker exec, against baselines
measured in the same run.

    python bench/bench_sandbox.py [--n 200] [--concurrency 32] [--docker/--no-docker]

(a) ``print(1)`` on the warm bwrap pool, p50/p95, vs a fresh ``python3 -c`` subprocess per call
    (no isolation at all) and vs a fresh ``bwrap ... python3 -c`` per call. Target: p50 <= 5 ms.
    Also a pool of one worker called back to back, where the next execution's sandbox cannot be
    prepared while the worker is idle (no target; it shows the set-up cost).
(b) ``--concurrency`` executions of ``time.sleep(0.5)`` gathered on one event loop through the SDK
    vs the blocking pattern of typical research sandboxes (``subprocess.Popen(...).communicate()``
    called inside ``async def``). Target: >= 10x faster wall time. The largest event-loop stall
    seen by a 10 ms ticker is reported for both.
(c) Docker: ``docker exec`` into a warm container, p50/p95 (a private dockerd is started when no
    daemon answers; skipped with the reason when that is impossible).
Also: RSS/PSS of the warm pools and the backend's capability report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.tools.sandbox import create_sandbox
from agentrl.tools.sandbox.bwrap import BwrapSandbox
from agentrl.tools.sandbox.docker import DEFAULT_IMAGE, DockerSandbox
from agentrl.tools.sandbox.dockerd import PrivateDockerDaemon, daemon_unavailable_reason, ensure_image, ping

PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
SLEEP_CODE = "import time\ntime.sleep(0.5)\nprint('done')"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(name: str, samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    out = {"p50_ms": round(pct(ms, 0.5), 3), "p95_ms": round(pct(ms, 0.95), 3), "mean_ms": round(statistics.mean(ms), 3)}
    print(f"  {name:<34} p50 {out['p50_ms']:8.2f} ms   p95 {out['p95_ms']:8.2f} ms   (n={len(ms)})")
    return out


async def timed(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t)
    return samples


def blocking_subprocess(argv: list[str]) -> None:
    subprocess.run(argv, capture_output=True, check=True)


async def latency(n: int) -> dict[str, Any]:
    print("(a) print(1) latency")
    async with BwrapSandbox(pool_size=2) as sandbox:
        await timed(lambda: sandbox.run("print(1)"), 20)  # warm-up
        warm = summary("warm bwrap pool (SDK)", await timed(lambda: sandbox.run("print(1)"), n))
        bwrap_cmd = sandbox.bwrap_argv()
    async with BwrapSandbox(pool_size=1) as single:
        await timed(lambda: single.run("print(1)"), 10)
        back_to_back = summary("pool of 1, back to back", await timed(lambda: single.run("print(1)"), max(20, n // 2)))
    fresh = [time_sync(lambda: blocking_subprocess([PY, "-c", "print(1)"])) for _ in range(n)]
    fresh_s = summary("fresh python3 -c subprocess", fresh)
    argv = [*bwrap_cmd[:bwrap_cmd.index(PY)], PY, "-I", "-S", "-c", "print(1)"]
    cold = summary("fresh bwrap + python3 -c", [time_sync(lambda: blocking_subprocess(argv)) for _ in range(max(20, n // 4))])
    ratio = fresh_s["p50_ms"] / warm["p50_ms"]
    print(f"  -> warm pool p50 is {ratio:.1f}x faster than a fresh subprocess; target p50 <= 5 ms: "
          f"{'MET' if warm['p50_ms'] <= 5 else 'NOT MET'}")
    return {"warm_pool": warm, "pool_of_one_back_to_back": back_to_back, "fresh_python_subprocess": fresh_s,
            "fresh_bwrap_exec": cold, "speedup_vs_fresh_subprocess": round(ratio, 2), "target_met": warm["p50_ms"] <= 5}


def time_sync(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


async def ticker(stop: asyncio.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        gaps.append(now - last - 0.01)
        last = now


async def with_ticker(work: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(wall seconds of ``work()``, largest event-loop stall in seconds)."""
    stop, gaps = asyncio.Event(), []
    tick = asyncio.ensure_future(ticker(stop, gaps))
    await asyncio.sleep(0.02)
    t = time.perf_counter()
    await work()
    wall = time.perf_counter() - t
    stop.set()
    await tick
    return wall, max(gaps, default=0.0)


async def research_style_tool(code: str) -> str:
    """The baseline: a blocking subprocess inside ``async def`` (freezes the event loop)."""
    proc = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
    out, _ = proc.communicate(timeout=120)
    return out.decode()


async def concurrency(k: int) -> dict[str, Any]:
    print(f"(b) {k} concurrent executions of time.sleep(0.5)")
    t = time.perf_counter()
    sandbox = BwrapSandbox(pool_size=k)
    await sandbox.start()
    start_s = time.perf_counter() - t
    try:
        sdk_wall, sdk_stall = await with_ticker(lambda: asyncio.gather(*(sandbox.run(SLEEP_CODE) for _ in range(k))))
        results = await asyncio.gather(*(sandbox.run("print(1)") for _ in range(k)))
        assert all(r.ok for r in results)
        rss = sandbox.memory_usage()
    finally:
        await sandbox.close()
    base_wall, base_stall = await with_ticker(
        lambda: asyncio.gather(*(research_style_tool(SLEEP_CODE) for _ in range(k))))
    ratio = base_wall / sdk_wall
    print(f"  SDK (warm pool of {k}, started in {start_s:.2f} s): wall {sdk_wall:.2f} s, max loop stall "
          f"{sdk_stall * 1000:.1f} ms")
    print(f"  blocking-subprocess baseline:           wall {base_wall:.2f} s, max loop stall "
          f"{base_stall * 1000:.1f} ms")
    print(f"  -> {ratio:.1f}x faster; target >= 10x: {'MET' if ratio >= 10 else 'NOT MET'}")
    print(f"  warm pool of {k}: RSS {rss['rss_bytes'] / 2**20:.1f} MiB (sum over {rss['processes']} processes), "
          f"PSS {rss['pss_bytes'] / 2**20:.1f} MiB")
    return {"k": k, "sdk_wall_s": round(sdk_wall, 3), "baseline_wall_s": round(base_wall, 3), "speedup": round(ratio, 2),
            "sdk_max_loop_stall_ms": round(sdk_stall * 1000, 2), "baseline_max_loop_stall_ms": round(base_stall * 1000, 2),
            "pool_start_s": round(start_s, 3), "pool_memory": rss}


async def docker_latency(n: int) -> dict[str, Any]:
    print("(c) Docker warm exec")
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
        async with DockerSandbox(pool_size=2, docker_host=host) as sandbox:
            await timed(lambda: sandbox.run("print(1)"), 5)
            warm = summary("docker exec, warm container (SDK)", await timed(lambda: sandbox.run("print(1)"), n))
        return {"warm_exec": warm}
    finally:
        if daemon is not None:
            await asyncio.to_thread(daemon.stop)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--docker", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
          "(latencies scale with load; the baselines below are measured in the same run)")
    report: dict[str, Any] = {"load_average": load, "latency": await latency(args.n),
                              "concurrency": await concurrency(args.concurrency)}
    async with create_sandbox("bwrap") as default_pool:
        await default_pool.run("print(1)")
        assert isinstance(default_pool, BwrapSandbox)
        mem = default_pool.memory_usage()
        caps = default_pool.capabilities()
        print(f"default warm pool ({default_pool.pool_size} workers): RSS {mem['rss_bytes'] / 2**20:.1f} MiB, "
              f"PSS {mem['pss_bytes'] / 2**20:.1f} MiB")
    report["default_pool_memory"] = mem
    report["capabilities"] = caps.to_dict()
    if args.docker:
        report["docker"] = await docker_latency(min(args.n, 50))
    print("capabilities (bwrap):")
    print(json.dumps(caps.to_dict(), indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    lat, conc = report["latency"], report["concurrency"]
    docker = report.get("docker", {})
    figures = {"warm_p50_ms": lat["warm_pool"]["p50_ms"], "warm_p95_ms": lat["warm_pool"]["p95_ms"],
               "pool_of_one_p50_ms": lat["pool_of_one_back_to_back"]["p50_ms"],
               "concurrency_speedup": conc["speedup"],
               "docker_warm_exec_p50_ms": docker.get("warm_exec", {}).get("p50_ms")}
    baseline = {"fresh_subprocess_p50_ms": lat["fresh_python_subprocess"]["p50_ms"],
                "fresh_bwrap_p50_ms": lat["fresh_bwrap_exec"]["p50_ms"]}
    ratios = {"warm_speedup_vs_fresh_subprocess": lat["speedup_vs_fresh_subprocess"]}
    targets = {"warm_p50_ms": 5, "concurrency_speedup": 10}
    met = {"warm_p50_ms": bool(lat["target_met"]), "concurrency_speedup": conc["speedup"] >= 10}
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met, "load_average": report["load_average"]}))


if __name__ == "__main__":
    asyncio.run(main())
