"""Rollout scheduler throughput and driver cost, against a fake SGLang worker in its own process.

One run starts the fake worker (``python -m agentrl.testing.fake_worker``, its own process, so its
CPU is not the driver's) and a real sglang-router in front of it, then collects steps of
``--prompts`` × ``--group-size`` single-turn episodes of ``ToyArithmeticEnv`` (``--tokens``-token
answers), direct and through the router, with:

- ``baseline``: the landed pieces without a scheduler: that many concurrent ``run_episode`` calls, on the
  aiohttp transport (``ClientConfig(lean_transport=False)``);
- ``scheduler``: :class:`agentrl.rollout.Scheduler` collecting the same batch.

For each it reports samples/s and the driver's CPU per sample (``time.process_time`` of this
process) over ``--rollouts`` steps after a warm-up, and the first rollout's wall time (cold: a new
scheduler, empty caches). For the scheduler it also reports the event-loop lag p99 with 1,024
episodes in flight and the memory per in-flight episode beyond its tokens (tracemalloc, while
1,024 episodes wait on a slow worker). With ``--tool`` (default on) a second part runs
``RetoolMathEnv`` episodes that make one real bubblewrap ``print(1)`` call and then answer: turns/s,
next to the sandbox's own rate without any episode (``print(1)`` 64 at a time: executions/s and the
machine's CPU per execution), which bounds turns/s at twice that rate.

Targets (2-core machine): ≥ 2,500 samples/s, ≤ 0.4 ms driver CPU per sample, first rollout ≤ 1 s,
loop lag p99 ≤ 50 ms, ≤ 64 KB per in-flight episode beyond its tokens, ≥ 310 turns/s with the tool.

    .venv/bin/python bench/bench_scheduler.py [--prompts 64] [--group-size 8] [--rollouts 5] [--no-tool]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from agentrl.chat import ChatTemplate
from agentrl.data import DataSource
from agentrl.environments import RetoolMathEnv, ToyArithmeticEnv, make_arithmetic_rows
from agentrl.rollout import (
    AgentConfig,
    ClientConfig,
    InferenceClient,
    Router,
    RouterConfig,
    RouterPolicy,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    run_episode,
    tune_gc,
)
from agentrl.rollout.process import free_port
from agentrl.testing import build_tokenizer

TARGETS = {"samples_per_s": 2500.0, "driver_cpu_ms_per_sample": 0.4, "first_rollout_s": 1.0, "loop_lag_p99_ms": 50.0,
           "kb_per_inflight_episode": 64.0, "tool_turns_per_s": 310.0}


class Worker:
    """A fake worker process (``--token-delay`` slows it down for the in-flight measurements)."""

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrl.testing.fake_worker", "--port", str(self.port),
                                      "--no-record", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def wait(self) -> None:
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                try:
                    async with s.get(self.url + "/health") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError("fake worker did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class LagMonitor:
    """Measures how late a 10 ms timer fires while the loop is busy."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            self.lags.append(time.perf_counter() - t0 - 0.01)

    def __enter__(self) -> LagMonitor:
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def p99_ms(self) -> float:
        return 1000 * statistics.quantiles(self.lags, n=100)[98] if len(self.lags) >= 2 else 0.0


def agent(tokens: int) -> AgentConfig:
    return AgentConfig(sampling=SamplingParams(max_new_tokens=tokens))


async def timed(fn: Callable[[], Awaitable[int]], rollouts: int) -> tuple[float, float]:
    """Runs ``fn`` (returns samples) ``rollouts`` times; returns (samples/s, driver CPU ms per sample)."""
    samples = 0
    gc.collect()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(rollouts):
        samples += await fn()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return samples / wall, 1000 * cpu / samples


async def bench_path(name: str, url: str, control: list[str], template: ChatTemplate, args: argparse.Namespace,
                     rows: list[dict[str, Any]]) -> dict[str, float]:
    n = args.prompts * args.group_size
    cfg = agent(args.tokens)
    async with InferenceClient(ClientConfig(base_url=url, max_concurrency=1024, lean_transport=False)) as landed:
        async def baseline() -> int:
            eps = await asyncio.gather(*(run_episode(ToyArithmeticEnv(rows[i % len(rows)]), template, landed, cfg)
                                         for i in range(n)))
            return len(eps)

        await baseline()
        base_sps, base_cpu = await timed(baseline, args.rollouts)
    async with InferenceClient(ClientConfig(base_url=url, max_concurrency=1024), control_urls=lambda: control) as client:
        t0 = time.perf_counter()
        sched = Scheduler(ToyArithmeticEnv, template, client, DataSource.from_rows(rows, epochs=None),
                          SchedulerConfig(groups_per_step=args.prompts, group_size=args.group_size), agent=cfg)
        first = await sched.collect()
        first_s = time.perf_counter() - t0
        assert len(first.groups) == args.prompts

        async def step() -> int:
            batch = await sched.collect()
            return sum(len(g) for g in batch.groups)

        sps, cpu = await timed(step, args.rollouts)
    out = {"baseline_samples_per_s": base_sps, "baseline_cpu_ms_per_sample": base_cpu, "samples_per_s": sps,
           "driver_cpu_ms_per_sample": cpu, "first_rollout_s": first_s}
    print(f"{name:>7}: baseline {base_sps:7.0f} samples/s {base_cpu:5.2f} ms CPU/sample | scheduler {sps:7.0f} "
          f"samples/s {cpu:5.2f} ms CPU/sample (x{sps / base_sps:.2f}) | first rollout {first_s:.2f} s", flush=True)
    return out


async def bench_inflight(url: str, template: ChatTemplate, args: argparse.Namespace,
                         rows: list[dict[str, Any]]) -> dict[str, float]:
    """Loop lag with 1,024 episodes in flight, and memory per in-flight episode."""
    cfg = agent(args.tokens)
    async with InferenceClient(ClientConfig(base_url=url, max_concurrency=1024)) as client:
        sched = Scheduler(ToyArithmeticEnv, template, client, DataSource.from_rows(rows, epochs=None),
                          SchedulerConfig(groups_per_step=128, group_size=8, max_requests_per_engine=1024), agent=cfg)
        await sched.collect()
        with LagMonitor() as lag:
            await sched.collect()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        task = asyncio.ensure_future(sched.collect())
        peak_inflight = 0
        in_flight_bytes = 0
        while not task.done():
            await asyncio.sleep(0.05)
            live = sched.inflight_requests
            if live > peak_inflight:
                peak_inflight = live
                in_flight_bytes = tracemalloc.get_traced_memory()[0] - before
        batch = await task
        tracemalloc.stop()
    prompt_tokens = batch.groups[0].trajectories()[0].prompt_length
    token_bytes = prompt_tokens * 8  # one list slot per token; small ints are shared objects
    per_episode = in_flight_bytes / max(peak_inflight, 1) - token_bytes
    print(f"inflight: loop lag p99 {lag.p99_ms():.1f} ms with 1,024 episodes; {per_episode / 1024:.1f} KB per "
          f"in-flight episode beyond its tokens (peak {peak_inflight} in flight)", flush=True)
    return {"loop_lag_p99_ms": lag.p99_ms(), "kb_per_inflight_episode": per_episode / 1024,
            "peak_inflight": float(peak_inflight)}


def tool_script(template: ChatTemplate) -> str:
    tok = template.tokenizer
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call><|im_end|>'
    spec = {"marker": tok.convert_tokens_to_ids("<tool_response>"),
            "turns": [tok.encode(call, add_special_tokens=False),
                      tok.encode("The answer is \\boxed{1}.<|im_end|>", add_special_tokens=False)]}
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
    return path


async def bench_tool(template: ChatTemplate, args: argparse.Namespace) -> dict[str, float]:
    from agentrl.tools.sandbox import create_sandbox

    script = tool_script(template)
    worker = Worker("--script", script)
    await worker.wait()
    rows = [{"prompt": f"What is {i} - {i} + 1?", "label": "1"} for i in range(256)]
    n = args.prompts * args.group_size
    cfg = agent(args.tokens)
    sandbox = create_sandbox("bwrap", pool_size=2)
    try:
        ceiling = await sandbox_ceiling(sandbox, n)

        def factory(row: dict[str, Any]) -> RetoolMathEnv:
            return RetoolMathEnv(row, sandbox=sandbox)

        landed_cfg = ClientConfig(base_url=worker.url, max_concurrency=1024, lean_transport=False)
        async with InferenceClient(landed_cfg) as landed:
            async def baseline() -> int:
                eps = await asyncio.gather(*(run_episode(factory(rows[i % len(rows)]), template, landed, cfg)
                                             for i in range(n)))
                assert all(ep.reward == 1.0 for ep in eps), [ep.trajectory.info for ep in eps[:2]]
                return sum(int(ep.trajectory.metrics["turns"]) for ep in eps)

            await baseline()
            base_tps, _ = await timed(baseline, 1)
        async with InferenceClient(ClientConfig(base_url=worker.url, max_concurrency=1024)) as client:
            sched = Scheduler(factory, template, client, DataSource.from_rows(rows, epochs=None),
                              SchedulerConfig(groups_per_step=args.prompts, group_size=args.group_size), agent=cfg)

            async def step() -> int:
                batch = await sched.collect()
                assert all(r == 1.0 for g in batch.groups for r in g.rewards)
                return sum(int(ep.trajectory.metrics["turns"]) for ep in batch.episodes())

            await step()
            tps, cpu = await timed(step, max(1, args.rollouts // 2))
    finally:
        await sandbox.close()
        worker.stop()
        os.unlink(script)
    print(f"   tool: baseline {base_tps:6.0f} turns/s | scheduler {tps:6.0f} turns/s (x{tps / base_tps:.2f}), "
          f"{cpu:.2f} ms CPU per turn; one bwrap print(1) per episode | the sandbox alone: "
          f"{ceiling['sandbox_execs_per_s']:.0f} execs/s ({2 * ceiling['sandbox_execs_per_s']:.0f} turns/s at most), "
          f"{ceiling['sandbox_machine_cpu_ms_per_exec']:.1f} ms machine CPU per exec", flush=True)
    return {"tool_baseline_turns_per_s": base_tps, "tool_turns_per_s": tps, "tool_cpu_ms_per_turn": cpu,
            **ceiling, "tool_turns_ceiling_per_s": 2 * ceiling["sandbox_execs_per_s"]}


def _machine_cpu_s() -> float:
    """CPU seconds the whole machine spent busy so far (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


async def sandbox_ceiling(sandbox: Any, n: int) -> dict[str, float]:
    """The sandbox alone, no episodes: ``n`` ``print(1)`` executions, 64 at a time. An episode of the tool
    part is two turns around one execution, so twice this rate bounds its turns/s on this machine."""
    await sandbox.run("print(1)")
    limit = asyncio.Semaphore(64)

    async def one() -> None:
        async with limit:
            result = await sandbox.run("print(1)")
            assert result.exit_code == 0, result

    wall0, cpu0 = time.perf_counter(), _machine_cpu_s()
    await asyncio.gather(*(one() for _ in range(n)))
    wall, cpu = time.perf_counter() - wall0, _machine_cpu_s() - cpu0
    return {"sandbox_execs_per_s": n / wall, "sandbox_machine_cpu_ms_per_exec": 1000 * cpu / n}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rollouts", type=int, default=5)
    parser.add_argument("--no-tool", action="store_true")
    parser.add_argument("--no-router", action="store_true")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--default-gc", action="store_true", help="leave the garbage collector as Python sets it")
    args = parser.parse_args()
    template = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
    rows = make_arithmetic_rows(1024, seed=0)
    if not args.default_gc:
        tune_gc()  # what the runner does in the driver process
    worker, slow = Worker(), Worker("--token-delay", "0.02")
    await worker.wait()
    await slow.wait()
    figures: dict[str, Any] = {}
    router = None
    try:
        figures["direct"] = await bench_path("direct", worker.url, [worker.url], template, args, rows)
        if not args.no_router:
            router = await Router.launch(RouterConfig(policy=RouterPolicy.CONSISTENT_HASHING))
            await router.add_worker(worker.url)
            figures["router"] = await bench_path("router", router.url, [worker.url], template, args, rows)
        figures["inflight"] = await bench_inflight(slow.url, template, args, rows)
        if not args.no_tool:
            figures["tool"] = await bench_tool(template, args)
    finally:
        if router is not None:
            router.stop()
        worker.stop()
        slow.stop()
    d = figures["direct"]
    flat = {"samples_per_s": d["samples_per_s"], "driver_cpu_ms_per_sample": d["driver_cpu_ms_per_sample"],
            "first_rollout_s": d["first_rollout_s"], **figures["inflight"], **figures.get("tool", {})}
    ratios = {"samples_per_s_vs_baseline": d["samples_per_s"] / d["baseline_samples_per_s"],
              "cpu_per_sample_vs_baseline": d["driver_cpu_ms_per_sample"] / d["baseline_cpu_ms_per_sample"]}
    if "tool" in figures:
        ratios["tool_turns_vs_baseline"] = figures["tool"]["tool_turns_per_s"] / figures["tool"]["tool_baseline_turns_per_s"]
    lower_is_better = {"driver_cpu_ms_per_sample", "first_rollout_s", "loop_lag_p99_ms", "kb_per_inflight_episode"}
    met = {k: (flat[k] <= t if k in lower_is_better else flat[k] >= t) for k, t in TARGETS.items() if k in flat}
    print("RESULT " + json.dumps({"figures": figures, "baseline": {k: v for k, v in d.items() if "baseline" in k},
                                  "ratios": ratios, "targets": TARGETS, "met": met}))


if __name__ == "__main__":
    if "--loop=asyncio" in sys.argv or ("--loop" in sys.argv and sys.argv[sys.argv.index("--loop") + 1] == "asyncio"):
        asyncio.run(main())
    else:
        import uvloop

        uvloop.run(main())
