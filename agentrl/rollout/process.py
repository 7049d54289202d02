"""Subprocess helpers shared by the engine and router launchers.

A launcher starts its server in a new session (its own process group), remembers the process, and
stops exactly the tree it started: the process and every descendant it has at stop time, SIGTERM
first, SIGKILL after a grace period. Nothing is ever looked up or killed by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

__all__ = ["ManagedProcess", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ManagedProcess:
    """One started server process, its log file, and how to stop its whole tree."""

    def __init__(self, cmd: Sequence[str], *, env: Mapping[str, str], log_path: Path, name: str) -> None:
        self.cmd = list(cmd)
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.cmd, env=dict(env), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-n_chars:].decode(errors="replace")

    def tree(self) -> list[psutil.Process]:
        """The process and its live descendants (empty once it has exited and been reaped)."""
        try:
            root = psutil.Process(self.popen.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill_now(self) -> None:
        """SIGKILL the whole tree at once (what a crash looks like; used by failure tests)."""
        for proc in self.tree():
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.popen.wait(timeout=30)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the tree, wait up to ``grace_s``, SIGKILL what is left, reap the root."""
        procs = self.tree()
        # Children that left the tree (re-parented) but kept our process group go too.
        try:
            pgid = os.getpgid(self.popen.pid)
        except ProcessLookupError:
            pgid = None
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, survivors = psutil.wait_procs(procs, timeout=grace_s)
        for proc in survivors:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(survivors, timeout=5)
        if pgid is not None and pgid == self.popen.pid:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
