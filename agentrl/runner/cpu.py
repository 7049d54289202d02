"""CPU thread placement for a machine without accelerators: who gets which cores.

On a CPU-only machine the trainer and the SGLang engines share a few cores, and oversubscription
is the biggest cost there is. Measured on a 2-core machine (``docs``: reference ``cpu-training.md``):

- torch's default of one intra-op thread per core made an SFT step cost 3.5 CPU-s, against 0.5
  CPU-s with ``torch.set_num_threads(1)`` (**7x**), because trainer and engine fought for the cores;
- the SGLang CPU engine pinned to one core did a batch of 8 x 32 tokens in 4.75 s against 11.45 s
  unpinned (**2.4x**);
- ``bench/bench_cpu_placement.py`` (one run, machine shared with other work): with this module's
  plan an engine batch of 8 x 32 tokens took 0.82 s against 6.10 s with default threads while a
  trainer stand-in ran, and the trainer did 328 against 23 matmul iterations/s.

:func:`plan_cpu` splits the cores: each engine gets its own block (``engine_fraction`` of the
cores, at least one core per engine) and the trainer the rest (at least one thread). The engine
environment carries three knobs, because SGLang 0.5.23 honours them in different places:

- ``OMP_NUM_THREADS`` sets the engine's torch intra-op threads (read at start-up, any CPU);
- ``SGLANG_CPU_OMP_THREADS_BIND`` binds the OpenMP threads to the cores, but only where SGLang's
  CPU kernels run (``init_cpu_threads_env`` is called only on Intel AMX or arm64 with the real
  ``sgl_kernel``); elsewhere it only switches off SGLang's memory sizing, so **the engine must be
  given ``max_total_tokens``** (SGLang warns: per-rank memory cannot be determined);
- :meth:`CpuPlan.pin` sets the CPU affinity of every thread of a started engine's process tree,
  which binds on any Linux machine.

Example::

    plan = plan_cpu(engines=1)                      # 2 cores: engine on core 0, trainer 1 thread
    config = EngineConfig(model_path=..., device="cpu", max_total_tokens=8192, env=plan.engine_env(0))
    engine = await SGLangEngine.launch(config)
    plan.pin(0, engine.process.pid)
    plan.apply_trainer()                            # torch.set_num_threads(plan.trainer_threads)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

__all__ = ["CpuPlan", "plan_cpu"]


def _core_list(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out: list[str] = []
    start = prev = cores[0]
    for c in [*cores[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(out)


@dataclass(frozen=True)
class CpuPlan:
    """Cores per engine and for the trainer. ``shared`` is True when there were fewer cores than
    engines plus a trainer and some cores are shared (a plan, not an error: it still pins)."""

    cores: tuple[int, ...]
    engine_cores: tuple[tuple[int, ...], ...]
    trainer_cores: tuple[int, ...]
    shared: bool = False

    @property
    def trainer_threads(self) -> int:
        return len(self.trainer_cores)

    def engine_env(self, index: int) -> dict[str, str]:
        """Environment for engine ``index`` (``EngineConfig.env``)."""
        cores = self._engine(index)
        n = str(len(cores))
        return {"SGLANG_CPU_OMP_THREADS_BIND": _core_list(cores), "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}

    @property
    def engine_envs(self) -> tuple[dict[str, str], ...]:
        return tuple(self.engine_env(i) for i in range(len(self.engine_cores)))

    def _engine(self, index: int) -> tuple[int, ...]:
        if not 0 <= index < len(self.engine_cores):
            raise IndexError(f"CpuPlan: engine index {index} out of range; the plan has "
                             f"{len(self.engine_cores)} engines")
        return self.engine_cores[index]

    def pin(self, index: int, pid: int) -> int:
        """Sets the affinity of every thread of ``pid`` and its descendants to engine ``index``'s
        cores; returns how many threads were pinned. Threads started later inherit it."""
        cores = set(self._engine(index))
        root = psutil.Process(pid)
        pinned = 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                threads = proc.threads()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            for thread in threads:
                try:
                    os.sched_setaffinity(thread.id, cores)
                    pinned += 1
                except (ProcessLookupError, PermissionError):
                    pass
        return pinned

    def apply_trainer(self) -> None:
        """``torch.set_num_threads(trainer_threads)`` in this process (the trainer's)."""
        import torch

        torch.set_num_threads(self.trainer_threads)


def available_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity), sorted."""
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_cpu(cores: int | Sequence[int] | None = None, engines: int = 1, *,
             engine_fraction: float = 0.5) -> CpuPlan:
    """Splits ``cores`` (a count: the first of this process's cores; a list of core ids; ``None``:
    all of this process's cores) between ``engines`` engines and the trainer.

    The engines together get ``round(engine_fraction * cores)`` cores (at least one each), split
    evenly in consecutive blocks; the trainer gets the rest. With fewer cores than ``engines + 1``
    every engine gets one core (round robin) and the trainer one thread on the last core."""
    if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
        raise ValueError(f"plan_cpu(engines={engines!r}): expected an int >= 1")
    if not 0 < engine_fraction < 1:
        raise ValueError(f"plan_cpu(engine_fraction={engine_fraction!r}): expected a value in (0, 1)")
    ids = _resolve_cores(cores)
    n = len(ids)
    if n < engines + 1:
        return CpuPlan(cores=ids, engine_cores=tuple((ids[i % n],) for i in range(engines)),
                       trainer_cores=(ids[-1],), shared=True)
    per_engine = max(1, round(engine_fraction * n) // engines)
    per_engine = min(per_engine, (n - 1) // engines)  # leave the trainer at least one core
    blocks = tuple(ids[i * per_engine:(i + 1) * per_engine] for i in range(engines))
    return CpuPlan(cores=ids, engine_cores=blocks, trainer_cores=ids[engines * per_engine:])


def _resolve_cores(cores: int | Sequence[int] | None) -> tuple[int, ...]:
    own = available_cores()
    if cores is None:
        return own
    if isinstance(cores, bool):
        raise ValueError(f"plan_cpu(cores={cores!r}): expected a core count, a list of core ids or None")
    if isinstance(cores, int):
        if cores < 1:
            raise ValueError(f"plan_cpu(cores={cores!r}): expected a core count >= 1")
        # more than this process may use: a plan for another machine, numbered from 0
        return own[:cores] if cores <= len(own) else tuple(range(cores))
    ids = tuple(sorted(set(cores)))
    if not ids or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in ids):
        raise ValueError(f"plan_cpu(cores={list(cores)!r}): expected a non-empty list of core ids >= 0")
    return ids
