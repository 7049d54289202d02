"""Runs a command and counts the SGLang servers and sglang-routers started on this machine while it ran.

    .venv/bin/python scripts/count_engine_boots.py [--out FILE] -- .venv/bin/pytest tests -m "not demo"

Every process whose command line runs ``sglang.launch_server`` is one engine start (a restart counts
again); a start whose ``PYTHONPATH`` holds a recording stand-in of SGLang (the placement tests' fake
``sglang`` package, a folder named ``*standin*``) is counted apart, as is every router start
(``agentrl.rollout._router_entry``). The process table is read every ``--poll-s`` seconds: an engine
lives for seconds at least, so none is missed. Prints one line ``BOOTS {json}`` to stderr; ``--out``
also writes each start's time (seconds from the command's start) and command line. Exits with the
command's exit status. Counts every such process on the machine, not only the command's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

ENGINE, ROUTER = "sglang.launch_server", "agentrl.rollout._router_entry"


def _kind(proc: psutil.Process, cmdline: str) -> str | None:
    if ROUTER in cmdline:
        return "router"
    if ENGINE not in cmdline:
        return None
    try:
        path = proc.environ().get("PYTHONPATH", "")
    except psutil.Error:
        path = ""
    return "standin" if "standin" in path else "engine"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="a JSON file for the counts and each start")
    parser.add_argument("--poll-s", type=float, default=0.25, help="seconds between reads of the process table")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("expected a command after --")
    seen: dict[tuple[int, float], dict[str, Any]] = {}
    stop = threading.Event()
    t0 = time.time()

    def poll() -> None:
        while not stop.is_set():
            for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
                cmdline = " ".join(proc.info["cmdline"] or [])
                key = (proc.info["pid"], proc.info["create_time"])
                if key in seen or "count_engine_boots" in cmdline:
                    continue
                kind = _kind(proc, cmdline)
                if kind is not None:
                    seen[key] = {"kind": kind, "t": round(proc.info["create_time"] - t0, 1), "cmd": cmdline[:240]}
            stop.wait(args.poll_s)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    rc = subprocess.call(cmd)
    stop.set()
    thread.join()
    starts = sorted(seen.values(), key=lambda s: s["t"])
    counts = {kind: sum(1 for s in starts if s["kind"] == kind) for kind in ("engine", "standin", "router")}
    summary = {"command": cmd, "rc": rc, "wall_s": round(time.time() - t0, 1), "starts": counts}
    print("BOOTS " + json.dumps(summary), file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**summary, "each": starts}, f, indent=1)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
