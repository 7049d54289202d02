"""What a test of a killed process tree asks: which of these processes are still running.

A SIGKILLed process is not gone the moment ``kill`` returns: the kernel tears it down (threads,
memory, sockets) first, which takes a while for a large one, and an orphan that init has not reaped
yet stays a zombie. So the test waits, within a bound, for each to end or become a zombie.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import psutil


def running(pids: Iterable[int], *, within_s: float = 10.0) -> list[int]:
    """The processes of ``pids`` still running (not gone, not a zombie) after up to ``within_s``."""
    left = list(pids)
    deadline = time.monotonic() + within_s
    while True:
        left = [pid for pid in left if _running(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
