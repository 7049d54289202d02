"""Runs every benchmark in ``bench/`` and writes one markdown table of their targets (``bench/RESULTS.md``).

Each ``bench_*.py`` runs as its own subprocess with this Python, in its own process group, with
its default arguments; its output goes to a log file (``--logs``), and the last line starting with
``RESULT `` is parsed. The page lists, per target: the figure, the baseline measured in the same
run, the ratio, the target and a pass/miss mark; then each bench's outcome and wall time, and the
machine it ran on. A bench whose requirement is absent (``bench_megatron.py`` needs CUDA) is
marked skipped, not run. A bench that runs past ``--timeout-s`` is killed with its whole process
group and marked.

Exit status: 0 when every bench that ran finished (a missed target is a finding, not an error),
1 when a bench crashed, printed an unreadable RESULT or timed out, 2 for a usage error.

    .venv/bin/python bench/run_all.py                    # everything, bench/RESULTS.md
    .venv/bin/python bench/run_all.py --list
    .venv/bin/python bench/run_all.py --only cli packing --out /tmp/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_table import BenchRun, Outcome, progress_summary, render_markdown

BENCH_DIR = Path(__file__).resolve().parent
# What a bench cannot run without, checked before it starts (it is marked skipped, with the reason).
REQUIRES: dict[str, tuple[str, ...]] = {
    "bench_megatron": ("cuda",),
    "bench_inspect": ("chromium",),
    "bench_sandbox": ("bwrap",),
    "bench_workspace": ("bwrap",),
    "bench_workspace_hostile": ("bwrap",),
    "bench_sandbox_fleet": ("bwrap",),
    "bench_scheduler": ("bwrap",),
}
# Benches started through a launcher (after the Python, before the script).
LAUNCH: dict[str, tuple[str, ...]] = {
    "bench_megatron": ("-m", "torch.distributed.run", "--nproc-per-node", "1"),
}
_PROBES = {
    "cuda": ("import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)", "needs CUDA"),
    "chromium": ("import sys; from agentrl.testing.chromium import chromium_path; sys.exit(0 if chromium_path() else 1)",
                 "needs chromium on PATH"),
}
VERSIONS = ("agentrl", "torch", "sglang", "sglang-router", "transformers", "ray", "megatron-core")


def discover(bench_dir: Path) -> list[str]:
    """The bench names (``bench_cli``, ...) in a folder, sorted."""
    return sorted(p.stem for p in bench_dir.glob("bench_*.py"))


def _canonical(name: str) -> str:
    name = Path(name).name.removesuffix(".py")
    return name if name.startswith("bench_") else f"bench_{name}"


def select(names: Sequence[str], only: Sequence[str] | None, skip: Sequence[str] | None) -> list[str]:
    """``names`` narrowed by ``--only`` and ``--skip`` (``cli``, ``bench_cli`` or ``bench_cli.py``)."""
    asked = [_canonical(n) for n in [*(only or []), *(skip or [])]]
    unknown = [n for n in asked if n not in names]
    if unknown:
        raise SystemExit(f"run_all: unknown bench {', '.join(unknown)}; expected one of {', '.join(names)}")
    chosen = [n for n in names if not only or n in {_canonical(o) for o in only}]
    return [n for n in chosen if n not in {_canonical(s) for s in skip or []}]


def missing_requirement(name: str, python: str = sys.executable) -> str | None:
    """Why ``name`` cannot run on this machine (``needs CUDA``), or None."""
    for need in REQUIRES.get(name, ()):
        if need == "bwrap":
            if shutil.which("bwrap") is None:
                return "needs bwrap (bubblewrap) on PATH"
            continue
        code, reason = _PROBES[need]
        try:
            ok = subprocess.run([python, "-c", code], capture_output=True, timeout=300).returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        if not ok:
            return reason
    return None


def _kill_group(proc: subprocess.Popen[str], grace_s: float = 5.0) -> None:
    """SIGTERM to the process group ``proc`` leads, then SIGKILL to whatever is left of it after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie still counts as a member of its group
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def _parse(lines: Sequence[str]) -> tuple[dict[str, object] | None, str]:
    """The last ``RESULT`` line's object, or (None, why)."""
    for line in reversed(lines):
        if line.startswith("RESULT "):
            try:
                value = json.loads(line[len("RESULT "):])
            except json.JSONDecodeError as exc:
                return None, f"unreadable RESULT line: {exc}"
            if not isinstance(value, dict):
                return None, f"RESULT is a {type(value).__name__}, expected a JSON object"
            return value, ""
    return None, "no line starts with 'RESULT '"


def _last_words(lines: Sequence[str]) -> str:
    text = [line.strip() for line in lines if line.strip()]
    return text[-1][:200] if text else "no output"


def run_bench(name: str, bench_dir: Path, *, timeout_s: float, log_path: Path, python: str = sys.executable,
              echo: bool = False) -> BenchRun:
    """Runs one bench to its end (or its timeout) and reads its RESULT."""
    cmd = [python, *LAUNCH.get(name, ()), str(bench_dir / f"{name}.py")]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    lines: list[str] = []
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", start_new_session=True, cwd=bench_dir.parent, env=env)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                lines.append(line.rstrip("\n"))
                if echo:
                    print(f"  {name}| {line}", end="", flush=True)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        wall = time.perf_counter() - started
        _kill_group(proc)  # on a timeout the bench; otherwise what it left behind in its group
        proc.wait()
        reader.join(timeout=10.0)
    if timed_out:
        return BenchRun(name, Outcome.TIMED_OUT, f"killed after {timeout_s:g} s", wall)
    result, why = _parse(lines)
    if proc.returncode != 0:
        return BenchRun(name, Outcome.FAILED, f"exit {proc.returncode}: {_last_words(lines)}", wall, result)
    if result is None:
        outcome = Outcome.FAILED if why.startswith(("unreadable", "RESULT is")) else Outcome.NO_RESULT
        return BenchRun(name, outcome, why, wall)
    return BenchRun(name, Outcome.OK, "", wall, result)


def run_all(names: Sequence[str], bench_dir: Path, *, timeout_s: float, log_dir: Path,
            probe: Callable[[str], str | None] = missing_requirement, echo: bool = False,
            say: Callable[[str], None] = print) -> list[BenchRun]:
    """Each bench in turn (skipped when ``probe`` names a missing requirement), with a line of progress."""
    runs = []
    for i, name in enumerate(names, 1):
        say(f"[{i}/{len(names)}] {name} ...")
        reason = probe(name)
        if reason is not None:
            run = BenchRun(name, Outcome.SKIPPED, reason)
        else:
            run = run_bench(name, bench_dir, timeout_s=timeout_s, log_path=log_dir / f"{name}.log", echo=echo)
        say(f"[{i}/{len(names)}] {progress_summary(run)}")
        runs.append(run)
    return runs


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _git(repo: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine_info(repo: Path) -> list[tuple[str, str]]:
    """What the figures depend on: CPU, cores, memory, accelerator, OS, Python, versions, commit, load."""
    cpuinfo = _read("/proc/cpuinfo")
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 platform.processor() or platform.machine())
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    mem = next((line.split()[1] for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal:")), "")
    ram = f"{int(mem) / 2**20:.1f} GiB" if mem.isdigit() else "unknown"
    release = dict(line.split("=", 1) for line in _read("/etc/os-release").splitlines() if "=" in line)
    os_name = release.get("PRETTY_NAME", platform.system()).strip('"')
    gpu = "none"
    if shutil.which("nvidia-smi"):
        try:
            query = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            query = f"nvidia-smi failed: {exc}"
        gpu = "; ".join(query.strip().splitlines()) or "nvidia-smi found, no GPU listed"
    versions = []
    for package in VERSIONS:
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    commit = _git(repo, "rev-parse", "--short=12", "HEAD") or "unknown"
    if _git(repo, "status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    load = os.getloadavg()
    return [("CPU", model), ("cores", f"{os.cpu_count()} ({usable} usable by this process)"), ("RAM", ram),
            ("GPU", gpu), ("OS", f"{os_name}, Linux {platform.release()}" if platform.system() == "Linux"
                           else f"{os_name} {platform.release()}"),
            ("Python", f"{platform.python_version()} ({platform.python_implementation()})"),
            ("packages", ", ".join(versions)), ("git commit", commit),
            ("load average at start", " / ".join(f"{x:.2f}" for x in load))]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run every bench/bench_*.py and write one markdown table of their targets.",
        epilog="Exit status: 0 when every bench that ran finished, even if targets were missed (a missed target "
               "is reported in the table, not an error); 1 when a bench crashed, printed an unreadable RESULT "
               "or was killed at --timeout-s; 2 for a usage error. Benches whose requirement is absent "
               "(CUDA, chromium, bwrap) are skipped and listed with the reason.")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these (cli, bench_cli or bench_cli.py)")
    parser.add_argument("--skip", nargs="+", metavar="NAME", help="do not run these")
    parser.add_argument("--timeout-s", type=float, default=1800.0,
                        help="per bench; one that runs longer is killed with its process group (default 1800)")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "RESULTS.md", help="the page (default bench/RESULTS.md)")
    parser.add_argument("--logs", type=Path, default=None, help="folder for each bench's output (default: a temp folder)")
    parser.add_argument("--list", action="store_true", help="list the benches and their requirements, run nothing")
    parser.add_argument("--verbose", "-v", action="store_true", help="stream each bench's output as it runs")
    parser.add_argument("--bench-dir", type=Path, default=BENCH_DIR, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.timeout_s <= 0:
        raise SystemExit(f"run_all: --timeout-s must be > 0, got {args.timeout_s}")
    bench_dir = args.bench_dir.resolve()
    names = select(discover(bench_dir), args.only, args.skip)
    if args.list:
        for name in names:
            needs = ", ".join(REQUIRES.get(name, ())) or "-"
            launch = " ".join(LAUNCH.get(name, ()))
            print(f"{name:28s} needs: {needs}" + (f"   launched with: python {launch}" if launch else ""))
        return 0
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="bench-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"run_all: {len(names)} bench{'' if len(names) == 1 else 'es'}, logs in {log_dir}", flush=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    machine = machine_info(bench_dir.parent)
    clock = time.perf_counter()
    runs = run_all(names, bench_dir, timeout_s=args.timeout_s, log_dir=log_dir, echo=args.verbose,
                   say=lambda line: print(line, flush=True))
    machine.append(("total wall time", f"{time.perf_counter() - clock:.0f} s"))
    command = "python bench/run_all.py" + ("" if argv is None and len(sys.argv) == 1 else
                                           " " + " ".join(sys.argv[1:] if argv is None else argv))
    page = render_markdown(runs, machine, command=command, started=started.strftime("%Y-%m-%d %H:%M UTC"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page, encoding="utf-8")
    crashed = [r.name for r in runs if r.outcome.crashed]
    print(f"run_all: wrote {args.out}" + (f"; crashed: {', '.join(crashed)}" if crashed else ""), flush=True)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
