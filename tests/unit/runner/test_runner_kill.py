"""``kill -9`` a training run (fake engine, real trainer and checkpoints) at many points and resume it:
the prompts trained and the final weights equal an uninterrupted run's, and every prompt of the
epoch is trained exactly once — whether the kill landed mid-rollout, mid-train, mid-sync or in the
middle of writing a checkpoint."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.runner.rundir import RunDirectory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, ROWS = 6, 12
PHASES = ("collect_rollouts", "train_step", "sync_weights", "checkpoint")


def _args(root: Path) -> list[str]:
    return [str(root), "--steps", str(STEPS), "--rows", str(ROWS), "--token-delay", "0.001", "--resume"]


class ForkServer:
    """``python -m agentrl.testing.runner --serve``: runs are forked from a process that imported
    torch and agentrl once, so each (re)start costs milliseconds, not seconds."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrl.testing.runner", "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def start(self, out: Path, args: list[str]) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(" ".join([str(out), *args]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["pid"], line
        return int(line[1])

    def wait(self) -> int:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["exit"], line
        return int(line[2])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Run:
    """A forked run, held by a pidfd: signals reach that process or fail, never a later one that
    was given the same pid after the server reaped it."""

    def __init__(self, pid: int) -> None:
        try:
            self.fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # it already ended
            self.fd = None

    def signal(self, sig: int) -> bool:
        """Sends ``sig``; False when the run has already ended."""
        if self.fd is None:
            return False
        try:
            signal.pidfd_send_signal(self.fd, sig)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def follow(path: Path, run: Run) -> Iterator[str]:
    """The lines ``run`` writes to ``path``, as they come, until it exits."""
    while not path.exists():
        time.sleep(0.005)
    with path.open() as fh:
        buffer = ""
        while True:
            chunk = fh.readline()
            if chunk:
                buffer += chunk
                if buffer.endswith("\n"):
                    yield buffer.strip()
                    buffer = ""
                continue
            if not run.signal(0):  # gone: what it wrote last is all there
                rest = buffer + fh.read()
                yield from (line.strip() for line in rest.splitlines() if line.strip())
                return
            time.sleep(0.005)


def run_with_kills(server: ForkServer, root: Path, targets: list[tuple[int, str]],
                   rng: random.Random) -> tuple[str, list[str]]:
    """Runs until done, killing (SIGKILL) the run when it starts each target ``(step, phase)`` in
    turn (after a random 0-40 ms). Returns the final weight digest and the phases killed in."""
    pending = list(targets)
    killed: list[str] = []
    for attempt in range(len(targets) + 3):
        out = root.parent / f"{root.name}-attempt{attempt}.log"
        run = Run(server.start(out, _args(root)))
        digest = None
        was_killed = False
        for line in follow(out, run):
            if line.startswith("phase "):
                _, name, step = line.split()
                # a target the resumed run will not reach again (its step was checkpointed) is dropped
                while pending and (pending[0][0], PHASES.index(pending[0][1])) < (int(step), _order(name)):
                    pending.pop(0)
            if pending and line == f"phase {pending[0][1]} {pending[0][0]}":
                time.sleep(rng.uniform(0.0, 0.04))
                pending.pop(0)
                if run.signal(signal.SIGKILL):
                    killed.append(line)
                    was_killed = True
                    break
                # the run ended on its own within the delay (its last phase): read what it wrote
            if line.startswith("done "):
                digest = line.split("digest=", 1)[1]
        run.close()
        status = server.wait()
        if digest is not None:
            return digest, killed
        if not was_killed:
            raise AssertionError(f"the run ended without finishing (status {status}): {out.read_text()[-3000:]}")
    raise AssertionError("too many restarts")


def _order(phase: str) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def trained(root: Path) -> list[list[str]]:
    run = RunDirectory(root / "run", config_hash="read-only")
    return [m["prompt_ids"] for m in run.read_metrics() if "prompt_ids" in m]


def test_kill_9_at_twenty_points_loses_and_repeats_no_prompt(tmp_path: Path) -> None:
    server = ForkServer()
    try:
        _check(server, tmp_path)
    finally:
        server.close()


def _check(server: ForkServer, tmp_path: Path) -> None:
    straight = Run(server.start(tmp_path / "straight.log", _args(tmp_path / "straight")))
    lines = list(follow(tmp_path / "straight.log", straight))
    straight.close()
    assert server.wait() == 0, "\n".join(lines[-30:])
    digest = next(line for line in lines if line.startswith("done ")).split("digest=", 1)[1]

    rng = random.Random(7)
    targets = sorted({(rng.randint(1, STEPS), rng.choice(PHASES)) for _ in range(60)},
                     key=lambda t: (t[0], PHASES.index(t[1])))
    targets = targets[:22]
    # each target once more: a kill before a step's checkpoint makes the resumed run redo that step
    targets = sorted(targets + targets[::3], key=lambda t: (t[0], PHASES.index(t[1])))
    assert len(targets) >= 20
    resumed_digest, killed = run_with_kills(server, tmp_path / "killed", targets, rng)

    assert len(killed) >= 20
    assert {k.split()[1] for k in killed} == set(PHASES)
    assert trained(tmp_path / "killed") == trained(tmp_path / "straight")
    flat = [p for step in trained(tmp_path / "killed") for p in step]
    assert sorted(flat) == sorted(set(flat)) and len(flat) == ROWS  # 0 lost, 0 trained twice
    assert resumed_digest == digest                                  # bitwise the same weights
