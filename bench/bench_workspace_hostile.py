"""What one hostile episode makes the trainer spend: memory of its process tree, and its siblings' time.

    python bench/bench_workspace_hostile.py [--size-mb 64] [--sparse-gib 10] [--docker/--no-docker]

One workspace episode (``size_mb`` of writable layer, 16 MiB ``/tmp``, a 256 MiB kernel) does, through
the public workspace API and the model's tools, what a model could to make the trainer spend memory:
empty files until the inode cap (``/work``, a call's ``/tmp``, the kernel's ``/tmp``), a sparse file of
``--sparse-gib`` GiB with data at its ends, output floods (bash and the kernel), forged kernel result
frames (12 MiB and malformed), a 400 KiB ``read_file`` and ``write_file``, then the per-step hash
five times, a snapshot (kept, as a caller would) and a restore of it.

Figures: the peak resident memory the trainer's process tree gains (this process and every process
under it: holders, sandbox workers, kernels; sampled every 10 ms) over its level before the episode;
the same for a benign episode of the same steps on small files (the baseline, same run); the machine's
``MemAvailable`` drop at the peak (tmpfs pages and kernel memory live there, charged to the sandboxes'
cgroups, not to any process); the snapshot's size. Target: the hostile episode's tree gain
<= 2 x ``size_mb`` + 160 MiB. The fixed part is the workspace's own processes (the holder, the
sandbox worker with its waiter and prepared child, the kernel's supervisor and interpreter: about
110 MiB of resident memory counted per process, which the benign episode shows) and their transient
work; what the sandboxed processes hold under their own caps (``memory_mb`` per call,
``kernel_memory_mb``) comes on top, and the hostile episode here holds little of it (its forged
12 MiB frame, for a moment).

Group stall: a sibling's ``run("true")`` p50 while another member of its group hashes ``--holes-gib``
GiB of holes again and again, against the same call with that member idle; target <= 2x.

Docker (``--docker``, when a daemon answers or a private one can start): the trainer process's own
gain for the same hostile episode (container processes are the daemon's, not the trainer's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

import psutil

from agentrl.tools.sandbox import SandboxLimits
from agentrl.tools.sandbox.docker import DEFAULT_IMAGE
from agentrl.tools.sandbox.dockerd import PrivateDockerDaemon, daemon_unavailable_reason, ensure_image, ping
from agentrl.tools.workspace import Workspace, Workspaces, WorkspaceSession, WorkspaceSpec, workspace_tools

MB = 1 << 20
FIXED_MB = 160


class Peak:
    """Peak RSS of this process's tree (and the lowest MemAvailable) while the block runs."""

    def __init__(self, tree: bool = True) -> None:
        self.tree = tree
        self.base = self.peak = self.rss()
        self.avail_base = self.avail_low = self.available()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        me = psutil.Process()
        total = 0
        for p in [me, *(me.children(recursive=True) if self.tree else [])]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    @staticmethod
    def available() -> int:
        return int(psutil.virtual_memory().available)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.rss())
            self.avail_low = min(self.avail_low, self.available())

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def figures(self) -> dict[str, float]:
        return {"tree_gain_mb": round((self.peak - self.base) / MB, 1),
                "available_drop_mb": round((self.avail_base - self.avail_low) / MB, 1)}


def fill(where: str) -> str:
    return (f"import os\nos.makedirs({where!r}, exist_ok=True)\nn = 0\ntry:\n    while n < 3_000_000:\n"
            f"        open(os.path.join({where!r}, str(n)), 'w').close()\n        n += 1\nexcept OSError:\n    pass\nn")


def forged(size: int, close: bool = True) -> str:
    """A cell that writes a result frame of ``size`` bytes (a JSON object, or not JSON) to every pipe or
    socket it holds."""
    tail = '"}' if close else ""
    return ("import os, stat, struct\n"
            f"body = b'{{\"stdout\": \"' + b'A' * {size} + b'{tail}'\n"
            "frame = struct.pack('>I', len(body)) + body\nfor fd in range(3, 256):\n    try:\n"
            "        if stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
            "            os.write(fd, frame)\n    except OSError:\n        pass\n")


async def episode(wss: Workspaces, spec: WorkspaceSpec, hostile: bool, sparse_gib: int) -> dict[str, Any]:
    """The steps of one episode (see the module doc); small and harmless unless ``hostile``."""
    session = WorkspaceSession(spec, workspaces=wss)
    bash, python, read, write, *_ = workspace_tools(session)
    out: dict[str, Any] = {}
    try:
        size = (sparse_gib << 30) if hostile else MB
        await python(code=f"with open('sparse', 'wb') as f:\n    f.write(b'head')\n    f.seek({size} - 4)\n"
                          "    f.write(b'tail')")
        text = "z" * (400 << 10 if hostile else 1000)
        await write(path="big.txt", content=text)
        await read(path="big.txt")
        flood = 200 * MB if hostile else 1000
        await bash(command=f"head -c {flood} /dev/zero | tr '\\0' x")
        await python(code=f"import sys\nfor _ in range({flood} >> 16):\n    sys.stdout.write('y' * 65536)")
        if hostile:
            await python(code=forged(12 * MB))
            await python(code=forged(10, close=False))
        files = 3_000_000 if hostile else 100  # last: the hash and the snapshot walk them
        await python(code=fill("/work/many").replace("3_000_000", str(files)))
        await bash(command=f"python3 - <<'EOF'\n{fill('/tmp/many').replace('3_000_000', str(files))}\nEOF\n")
        await python(code=fill("/tmp/kernel-many").replace("3_000_000", str(files)))
        assert session.workspace is not None
        ws: Workspace = session.workspace
        for _ in range(5):
            await ws.digest()
        snapshot = await ws.snapshot()
        out["snapshot_mb"] = round(len(snapshot) / MB, 2)
        restored = await wss.restore(spec, None, snapshot)
        await wss.remove(restored)
        del snapshot
    finally:
        await session.remove()
    return out


async def measured(wss: Workspaces, spec: WorkspaceSpec, hostile: bool, sparse_gib: int, tree: bool) -> dict[str, Any]:
    with Peak(tree) as peak:
        out = await episode(wss, spec, hostile, sparse_gib)
    return {**out, **peak.figures()}


async def stall(wss: Workspaces, spec: WorkspaceSpec, holes_gib: int, n: int) -> dict[str, float]:
    """A sibling's call p50 with the other member idle, then while it hashes its holes again and again."""
    a, b = await wss.create(spec), await wss.create(spec)
    try:
        await a.python(f"with open('holes', 'wb') as f:\n    f.truncate({holes_gib << 30})")
        await b.run("true")

        async def sibling() -> list[float]:
            times = []
            for _ in range(n):
                t = time.perf_counter()
                await b.run("true")
                times.append(time.perf_counter() - t)
            return times

        idle = await sibling()
        stop = asyncio.Event()

        async def hashing() -> int:
            count = 0
            while not stop.is_set():
                await a.digest()
                count += 1
            return count

        task = asyncio.ensure_future(hashing())
        busy = await sibling()
        stop.set()
        hashes = await task
    finally:
        await wss.remove(a)
        await wss.remove(b)
    return {"idle_p50_ms": round(statistics.median(idle) * 1000, 2), "busy_p50_ms": round(statistics.median(busy) * 1000, 2),
            "member_hashes": hashes}


async def docker_part(spec: WorkspaceSpec, sparse_gib: int) -> dict[str, Any]:
    daemon = None
    host = next((h for h in (os.environ.get("DOCKER_HOST"), "unix:///var/run/docker.sock") if h and ping(h)), None)
    if host is None:
        reason = daemon_unavailable_reason()
        if reason is not None:
            return {"skipped": reason}
        daemon = PrivateDockerDaemon()
        host = await asyncio.to_thread(daemon.start)
    try:
        await asyncio.to_thread(ensure_image, host, DEFAULT_IMAGE)
        wss = Workspaces(backend_options={"docker": {"docker_host": host}})
        dspec = spec.replace(backend="docker")
        try:
            await measured(wss, dspec, False, sparse_gib, tree=False)  # warm up (the client, the image)
            benign = await measured(wss, dspec, False, sparse_gib, tree=False)
            hostile = await measured(wss, dspec, True, sparse_gib, tree=False)
        finally:
            await wss.close()
        return {"benign": benign, "hostile": hostile}
    except (RuntimeError, OSError) as exc:
        return {"skipped": f"Docker not usable here: {exc}"}
    finally:
        if daemon is not None:
            await asyncio.to_thread(daemon.stop)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--sparse-gib", type=int, default=10)
    parser.add_argument("--holes-gib", type=int, default=4)
    parser.add_argument("--n", type=int, default=40, help="sibling calls per stall figure")
    parser.add_argument("--docker", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    spec = WorkspaceSpec(size_mb=args.size_mb, kernel_memory_mb=256, cell_timeout_s=60.0,
                         limits=SandboxLimits(timeout_s=60.0, cpu_s=60, memory_mb=512, tmp_mb=16))
    wss = Workspaces()
    try:
        await measured(wss, spec, False, args.sparse_gib, tree=True)  # warm up
        benign = await measured(wss, spec, False, args.sparse_gib, tree=True)
        hostile = await measured(wss, spec, True, args.sparse_gib, tree=True)
        stalled = await stall(wss, spec.replace(size_mb=16), args.holes_gib, args.n)
    finally:
        await wss.close()
    docker = await docker_part(spec, args.sparse_gib) if args.docker else {"skipped": "--no-docker"}
    bound = 2 * args.size_mb + FIXED_MB
    print(json.dumps({"bwrap": {"benign": benign, "hostile": hostile, "stall": stalled}, "docker": docker}, indent=1))
    figures = {"hostile_tree_gain_mb": hostile["tree_gain_mb"], "hostile_available_drop_mb": hostile["available_drop_mb"],
               "hostile_snapshot_mb": hostile["snapshot_mb"], "sibling_busy_p50_ms": stalled["busy_p50_ms"],
               "docker_hostile_trainer_gain_mb": docker.get("hostile", {}).get("tree_gain_mb"),
               "docker": docker.get("skipped", "ran"), "size_mb": args.size_mb, "sparse_gib": args.sparse_gib}
    baseline = {"benign_tree_gain_mb": benign["tree_gain_mb"], "benign_available_drop_mb": benign["available_drop_mb"],
                "sibling_idle_p50_ms": stalled["idle_p50_ms"],
                "docker_benign_trainer_gain_mb": docker.get("benign", {}).get("tree_gain_mb")}
    ratios = {"hostile_vs_benign_tree_gain": round(hostile["tree_gain_mb"] / max(benign["tree_gain_mb"], 1.0), 2),
              "sibling_busy_vs_idle": round(stalled["busy_p50_ms"] / max(stalled["idle_p50_ms"], 1e-3), 2)}
    targets = {"hostile_tree_gain_mb": bound, "sibling_busy_vs_idle": 2.0}
    met = {"hostile_tree_gain_mb": hostile["tree_gain_mb"] <= bound,
           "sibling_busy_vs_idle": ratios["sibling_busy_vs_idle"] <= 2.0}
    if "hostile" in docker:
        targets["docker_hostile_trainer_gain_mb"] = bound
        met["docker_hostile_trainer_gain_mb"] = docker["hostile"]["tree_gain_mb"] <= bound
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met, "load_average": load}))


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
