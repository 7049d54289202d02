"""Rank processes for CPU (gloo) tests, started from a forkserver that imported the heavy modules once.

``torch.multiprocessing`` with ``spawn`` starts every rank as a fresh interpreter that imports torch,
transformers and megatron-core again: 6-13 CPU-s a rank on a 2-core machine, most of a small test's
cost. :func:`start_ranks` uses the ``forkserver`` start method instead, with :data:`PRELOAD` (those of
its modules that are installed) imported by the server when it starts: each rank is forked from that
server, which has run no test code, holds no process group and has used no OpenMP thread (so a forked
rank is as clean as a spawned one), and starts with the imports done. The rank function and its
arguments are pickled as for ``spawn`` (a module-level function; the parent's ``sys.path`` is passed).

The forkserver is one per process and starts on first use, with the preload list set at that moment:
one that another caller (e.g. :class:`agentrl.rewards.RewardPool`) started first is used as it is
(slower, equally correct). A test session calls :func:`preload_forkserver` at start-up, so whichever
starts it preloads.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["PRELOAD", "preload_forkserver", "start_ranks"]

PRELOAD = ("torch", "torch.distributed", "transformers", "megatron.core", "megatron.core.parallel_state",
           "agentrl.train")


def _installed(modules: Sequence[str]) -> list[str]:
    return [name for name in modules if importlib.util.find_spec(name.split(".")[0]) is not None]


def preload_forkserver(modules: Sequence[str] = PRELOAD) -> None:
    """Have this process's forkserver import ``modules`` (those installed) when it starts."""
    multiprocessing.set_forkserver_preload(_installed(modules))


def start_ranks(fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int, *,
                preload: Sequence[str] = PRELOAD) -> Any:
    """Start ``fn(rank, *args)`` in ``nprocs`` processes (not joined) and return torch's process context
    (``join(timeout)``, ``processes``), as ``torch.multiprocessing.start_processes(..., join=False)``."""
    from torch.multiprocessing.spawn import start_processes

    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"start_ranks(nprocs={nprocs!r}): expected an int >= 1")
    preload_forkserver(preload)
    return start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="forkserver")
