"""The bwrap backend's contract on a real bubblewrap pool: results, limits, concurrency, lifecycle."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from agentrl.tools.sandbox import SandboxClosedError, SandboxLimits, SandboxUnavailableError, create_sandbox
from agentrl.tools.sandbox.bwrap import BwrapSandbox
from agentrl.tools.sandbox.cgroups import detect_cgroups
from agentrl.tools.sandbox.pool import process_tree_memory

pytestmark = pytest.mark.integration


async def test_notebook_semantics_and_both_streams() -> None:
    async with create_sandbox("bwrap", pool_size=1) as sb:
        r = await sb.run("x = 6 * 7\nx")
        assert (r.stdout, r.exit_code, r.ok) == ("42\n", 0, True)
        assert (await sb.run("None")).stdout == ""
        r = await sb.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise KeyError('k')")
        assert r.stdout == "out\n" and r.stderr.startswith("err\nTraceback")
        assert r.claimed_exception == "KeyError" and r.exit_code == 1 and not r.ok
        assert 'File "<cell>", line 4' in r.stderr and "worker.py" not in r.stderr
        r = await sb.run("s = '''a\nb'''\nprint(repr(s))")  # the code runs unmodified (no re-indentation)
        assert r.stdout == "'a\\nb'\n"
        r = await sb.run("def f(:\n  pass")
        assert r.claimed_exception == "SyntaxError" and "line 1" in r.stderr
        r = await sb.run("raise SystemExit(3)")
        assert r.exit_code == 3 and r.claimed_exception is None
        r = await sb.run("echo $((6*7)); echo oops >&2; exit 4", language="bash")
        assert (r.stdout, r.stderr, r.exit_code) == ("42\n", "oops\n", 4)


async def test_output_cap_marks_truncation() -> None:
    async with create_sandbox("bwrap", pool_size=1, max_output_bytes=1000) as sb:
        r = await sb.run("print('a' * 5000)")
        assert r.truncated and r.ok and r.stdout_bytes == 5001
        assert r.stdout.startswith("a" * 1000) and "4001 more bytes not shown" in r.stdout
        r = await sb.run("print('é' * 10)")
        assert not r.truncated and r.stdout == "é" * 10 + "\n"


async def test_timeout_override_and_limits() -> None:
    async with create_sandbox("bwrap", pool_size=1, timeout_s=5, cpu_s=1, memory_mb=128) as sb:
        t = time.monotonic()
        r = await sb.run("import time\nprint('before', flush=True)\ntime.sleep(30)", timeout_s=0.5)
        assert r.timed_out and r.killed_reason == "timeout" and r.stdout == "before\n"
        assert time.monotonic() - t < 3
        # A wall deadline far beyond the CPU limit: on a loaded host the loop may get well under one
        # core, and the CPU limit must still be what ends it.
        r = await sb.run("while True: pass", timeout_s=30)
        assert r.killed_reason == "cpu_time" and 0.85 <= r.cpu_s < 2.0, r
        r = await sb.run("x = bytearray(512 << 20)")
        assert r.killed_reason == "memory" or r.claimed_exception == "MemoryError", r
        r = await sb.run("x = bytearray(32 << 20)\nprint(len(x))")  # below the limit: fine
        assert r.stdout == str(32 << 20) + "\n"


async def test_concurrent_executions_do_not_block_the_loop() -> None:
    """8 sleeps of 1 s on a pool of 8 finish together while a ticker keeps running."""
    async with create_sandbox("bwrap", pool_size=8) as sb:
        gaps: list[float] = []
        done = asyncio.Event()

        async def tick() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = asyncio.ensure_future(tick())
        t = time.perf_counter()
        results = await asyncio.gather(*(sb.run(f"import time\ntime.sleep(1.0)\nprint({i})") for i in range(8)))
        wall = time.perf_counter() - t
        done.set()
        await ticker
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
        assert wall < 6.0, wall  # serialized would be 8 s
        assert max(gaps) < 0.9, max(gaps)  # a run that blocked the loop would stop it for its whole second


async def test_max_concurrency_bounds_parallel_runs() -> None:
    async with create_sandbox("bwrap", pool_size=4, max_concurrency=2) as sb:
        t = time.perf_counter()
        await asyncio.gather(*(sb.run("import time\ntime.sleep(0.3)") for _ in range(4)))
        assert time.perf_counter() - t >= 0.55  # two waves of two


async def test_state_does_not_leak_between_executions() -> None:
    async with create_sandbox("bwrap", pool_size=1) as sb:
        await sb.run("open('/tmp/f', 'w').write('x')\nimport builtins\nbuiltins.leak = 1")
        r = await sb.run("import os, builtins\nprint(os.listdir('/tmp'), hasattr(builtins, 'leak'))")
        assert r.stdout == "[] False\n"
        draws = {(await sb.run("import random\nrandom.random()")).stdout for _ in range(3)}
        assert len(draws) == 3  # forked executions do not share a random state


async def _until_a_worker_runs(sb: BwrapSandbox, idle_processes: int) -> None:
    """Returns once the pool's process count rises above ``idle_processes``: a worker forked an execution."""
    deadline = time.monotonic() + 30
    while process_tree_memory(sb.worker_pids())["processes"] <= idle_processes:
        assert time.monotonic() < deadline, "no worker started the execution in 30 s"
        await asyncio.sleep(0.02)


async def test_cancellation_replaces_the_worker_and_close_kills_everything() -> None:
    sb = BwrapSandbox(pool_size=2)
    await sb.start()
    pids = sb.worker_pids()
    assert process_tree_memory(pids)["processes"] == 4 * len(pids)
    task = asyncio.ensure_future(sb.run("import time\ntime.sleep(30)"))
    await _until_a_worker_runs(sb, 4 * len(pids))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(sb.worker_pids()) == 1 and sb.worker_pids()[0] in pids  # the interrupted worker is gone
    both = await asyncio.gather(sb.run("print(1)"), sb.run("print(2)"))  # a replacement is started on demand
    assert [r.stdout for r in both] == ["1\n", "2\n"]
    assert len(sb.worker_pids()) == 2 and set(sb.worker_pids()) != set(pids)
    all_pids = sb.worker_pids() + pids
    cgroup_dirs = sb.cgroup_dirs()
    assert len(cgroup_dirs) == len(detect_cgroups().controllers)
    await sb.close()
    assert [d for d in cgroup_dirs if os.path.exists(d)] == []
    await sb.close()  # idempotent
    assert sb.worker_pids() == []
    for pid in all_pids:
        assert not os.path.exists(f"/proc/{pid}"), pid
    with pytest.raises(SandboxClosedError):
        await sb.run("print(1)")


async def test_worker_crash_is_a_sandbox_error_then_recovers() -> None:
    async with BwrapSandbox(pool_size=1) as sb:
        victim = sb.worker_pids()[0]
        idle = process_tree_memory([victim])["processes"]
        task = asyncio.ensure_future(sb.run("import time\ntime.sleep(5)"))
        await _until_a_worker_runs(sb, idle)
        os.kill(victim, 9)  # the host-side bwrap process of the pool's only worker
        r = await task
        assert r.killed_reason == "sandbox_error" and not r.ok
        assert (await sb.run("print(2)")).stdout == "2\n"


async def test_capabilities_report_what_is_enforced() -> None:
    sb = BwrapSandbox(pool_size=1)
    caps = sb.capabilities()
    await sb.close()
    assert caps.backend == "bwrap"
    for key in ("network", "filesystem", "environment", "wall_time", "cpu_time", "memory", "processes", "output"):
        assert key in caps.enforced
    cg = detect_cgroups()
    if "memory" in cg.controllers:
        assert "cgroup" in caps.enforced["memory"]
    else:
        assert caps.enforced["memory"] == "RLIMIT_AS"
    assert caps.details["cgroup_version"] == cg.version


async def test_rlimit_only_mode_still_bounds_memory_and_processes() -> None:
    limits = SandboxLimits(timeout_s=3, memory_mb=256, max_processes=16)
    async with BwrapSandbox(limits, pool_size=1, use_cgroups=False) as sb:
        caps = sb.capabilities()
        assert caps.enforced["memory"] == "RLIMIT_AS" and "cpu_share" in caps.not_enforced
        r = await sb.run("x = bytearray(1 << 30)")
        assert r.claimed_exception == "MemoryError", r
        r = await sb.run("import os, time\nn = 0\ntry:\n    for _ in range(64):\n        if os.fork() == 0:\n"
                         "            time.sleep(2)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\n"
                         "print(n)")
        assert r.ok and int(r.stdout) < 20, r


def test_unavailable_backend_names_the_fix() -> None:
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        BwrapSandbox(bwrap="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailableError, match="under /usr"):
        BwrapSandbox(python="/opt/python3")


async def test_local_backend_warns_and_runs() -> None:
    from agentrl.tools.sandbox.local import UnsafeSandboxWarning

    with pytest.warns(UnsafeSandboxWarning, match="WITHOUT ISOLATION"):
        sb = create_sandbox("local", pool_size=1, timeout_s=2)
    async with sb:
        r = await sb.run("import os\nprint(sorted(os.environ))\n1 + 1")
        assert r.stdout.splitlines()[-1] == "2"
        r = await sb.run("import time\ntime.sleep(10)", timeout_s=0.3)
        assert r.timed_out
        assert sb.capabilities().not_enforced["network"].startswith("not isolated")


async def test_workers_are_recycled_after_n_executions() -> None:
    async with BwrapSandbox(pool_size=1, recycle_after=3) as sb:
        seen = set()
        for i in range(7):
            assert (await sb.run(f"print({i})")).stdout == f"{i}\n"
            seen.update(sb.worker_pids())
        assert len(seen) == 3  # a fresh worker after every third execution
