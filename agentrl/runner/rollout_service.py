"""The rollout side of a run: :class:`RolloutService`, the scheduler and its engines as one object.

A plain asyncio object (the runner calls it in-process, or through a Ray actor that wraps it, with
the same methods):

- :meth:`collect`: one step's batch from the scheduler (scored by a distillation teacher that runs on
  this side: teacher engines, an endpoint, or the run's own engines for self-distillation);
- :meth:`weights_folder` / :meth:`sync_weights`: where the trainer exports version *v*, then every
  engine loads it and reports it (the engines' weight loader, :class:`WeightLoader`), and the
  scheduler's policy version moves to *v*;
- :meth:`score`: the engine's logprobs of fixed sequences (the post-sync probe); :meth:`score_adapter`
  the same through a LoRA adapter folder on every engine (a LoRA run's start-up check);
- :meth:`evaluate`: the run's eval sets;
- :meth:`state_dict` / :meth:`load_state_dict`: the scheduler's cursor and buffer (checkpoints);
- :meth:`shutdown`: ends buffered episodes, stops the engines and the router it started (and the
  sandbox fleet, with ``sandbox.executor = "ray"``).

:meth:`RolloutService.launch` builds it from a :class:`~agentrl.runner.RunConfig` (router +
engines with their logs in the run folder, the client, the data source, the scheduler); tests build
it from parts (a fake client and a :class:`WeightLoader` stand-in).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentrl.rollout.scheduler import RolloutProgress, Scheduler, StepBatch
from agentrl.rollout.types import SamplingParams
from agentrl.runner.probe import ScoringClient

if TYPE_CHECKING:
    from agentrl.rollout.engine import EngineStarter, SGLangEngine
    from agentrl.rollout.eval import EvalConfig
    from agentrl.rollout.groups import GroupFilter
    from agentrl.rollout.health import EngineGroup
    from agentrl.rollout.teacher import RolloutTeacher
    from agentrl.runner.config import RunConfig
    from agentrl.runner.cpu import CpuPlan
    from agentrl.runner.envs import RowFactory
    from agentrl.runner.weight_transports import Pusher
    from agentrl.tools.fleet import Fleet

__all__ = ["MEMORY_TAGS", "RolloutService", "WeightLoader"]

MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
"""What a colocated engine releases around the train step (SGLang's ``release_memory_occupation`` tags)."""


class WeightLoader(Protocol):
    """Loads a Hugging Face folder into every engine under a version; returns ``sync/*`` metrics."""

    def folder(self, version: int) -> Path: ...

    async def load(self, version: int, folder: Path) -> dict[str, float]: ...


class RolloutService:
    """See the module doc. ``eval_sets``: ``name -> (rows, EvalConfig, every_steps, at_start)``."""

    def __init__(self, scheduler: Scheduler, weights: WeightLoader, *, scoring: ScoringClient | None = None,
                 eval_sets: dict[str, tuple[list[dict[str, Any]], EvalConfig, int, bool]] | None = None,
                 on_shutdown: Callable[[], Awaitable[None] | None] | None = None) -> None:
        self.scheduler = scheduler
        self.weights = weights
        self.scoring: ScoringClient | None = scoring
        self.eval_sets = eval_sets or {}
        self._on_shutdown = on_shutdown
        self._also_stop: list[Callable[[], Awaitable[None]]] = []
        self.group: EngineGroup | None = None
        self.teacher: RolloutTeacher | None = None  # a distillation teacher scored on this side (engines, endpoint, self)
        self.fleet: Fleet | None = None  # the sandbox fleet the tools run on (sandbox.executor = "ray")
        self.collecting = False
        self._released: set[str] = set()
        self._events_seen = 0

    # -- building from a config ------------------------------------------------------------------
    @classmethod
    async def launch(cls, config: RunConfig, env_factory: RowFactory, *,
                     group_filter: GroupFilter | None = None, cpu: CpuPlan | None = None,
                     starters: Sequence[EngineStarter] | None = None,
                     engine_fraction: float | None = None,
                     teacher_starters: Sequence[EngineStarter] | None = None) -> RolloutService:
        """Starts the router and the engines (logs under the run folder's ``logs/``), then builds
        the client, the data source (rows checked against the environment), the scheduler and the
        disk weight loader. ``cpu``: a :class:`~agentrl.runner.cpu.CpuPlan` (threads and pinning of each
        engine on a CPU machine). ``starters``: one :class:`~agentrl.rollout.engine.EngineStarter` per
        engine (``None``: subprocesses here); ``engine_fraction``: the engines' ``mem_fraction_static``
        from the device map; ``teacher_starters``: a distillation teacher's own engines' starters (``None``:
        subprocesses here). Everything started is stopped again if a later part fails."""
        from agentrl.runner._launch import launch_rollout

        return await launch_rollout(cls, config, env_factory, group_filter=group_filter, cpu=cpu, starters=starters,
                                    engine_fraction=engine_fraction, teacher_starters=teacher_starters)

    # -- the step ------------------------------------------------------------------------------
    async def collect(self) -> StepBatch:
        """One step's batch; its report counts the engines' health events since the last step. With a
        rollout-side teacher (:attr:`teacher`), every sampled token is scored before the batch is handed
        over (the ``teacher/*`` figures go to the report's metrics). With a sandbox fleet (:attr:`fleet`), its
        figures per node (``sandbox/<node>/queue_wait_p99_s``...) since the last step go there too."""
        self.collecting = True
        try:
            batch = await self.scheduler.collect()
        finally:
            self.collecting = False
        if self.teacher is not None and batch.groups:
            batch.report.metrics.update(await self.teacher.score_groups(batch.groups))
        if self.group is not None:
            events, self._events_seen = self.group.events[self._events_seen:], len(self.group.events)
            batch.report.add_counts("engine_events", Counter(e.kind for e in events))
        if self.fleet is not None:
            batch.report.metrics.update(self.fleet.take_metrics())
        return batch

    async def progress(self) -> RolloutProgress | None:
        """Where the step being collected stands (``None`` between steps)."""
        return self.scheduler.progress()

    async def weights_folder(self, version: int) -> str:
        """Where the trainer writes version ``version`` for the engines to load."""
        return str(self.weights.folder(version))

    async def sync_weights(self, version: int) -> dict[str, float]:
        """Every engine loads ``weights_folder(version)``; then the scheduler stamps ``version``."""
        started = time.perf_counter()
        metrics = await self.weights.load(version, Path(await self.weights_folder(version)))
        self.scheduler.set_policy_version(version)
        metrics.setdefault("sync/total_s", time.perf_counter() - started)
        return metrics

    def set_pusher(self, pusher: Pusher) -> None:
        """The trainer's weight sender, for ``sync.method`` tensor or distributed."""
        set_pusher = getattr(self.weights, "set_pusher", None)
        if set_pusher is None:
            raise RuntimeError("set_pusher: this rollout service's weight loader takes no pusher")
        set_pusher(pusher)

    async def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """The engine's logprob of every token of each sequence given the ones before (entry 0: 0.0)."""
        if self.scoring is None:
            raise RuntimeError("score: this rollout service has no engine client to score with")
        return await _score_with(self.scoring, sequences)

    async def score_adapter(self, folder: str, sequences: list[list[int]]) -> dict[str, list[list[float]]]:
        """LoRA's start-up check: every engine in rotation loads the adapter folder ``folder`` under a
        name of its own, scores ``sequences`` through it, and unloads it. Per engine URL, the logprobs."""
        from agentrl.rollout.client import ClientConfig, InferenceClient
        from agentrl.runner.weight_transports import load_adapter_folder

        engines = self.group.in_rotation() if self.group is not None else []
        if not engines:
            raise RuntimeError("score_adapter: no engine is in rotation to check")
        name = f"agentrl-probe-{os.urandom(4).hex()}"

        async def one(engine: SGLangEngine) -> list[list[float]]:
            await load_adapter_folder(engine, name, Path(folder))
            try:
                async with InferenceClient(ClientConfig(base_url=engine.url)) as client:
                    client.set_adapter(name)
                    return await _score_with(client, sequences)
            finally:
                await engine.unload_lora_adapter(name)

        rows = await asyncio.gather(*(one(e) for e in engines))
        return {e.url: r for e, r in zip(engines, rows, strict=True)}

    async def evaluate(self, name: str) -> dict[str, Any]:
        rows, eval_config, _, _ = self.eval_sets[name]
        report = await self.scheduler.evaluate(rows, eval_config)
        return report.to_dict()

    async def evals_due(self, step: int, *, final: bool = False) -> list[str]:
        """Names of the eval sets to run after training step ``step`` (1-based; 0: before the first
        step, the sets marked ``at_start``)."""
        if step == 0 and not final:
            return [n for n, (_, _, _, at_start) in self.eval_sets.items() if at_start]
        return [n for n, (_, _, every, _) in self.eval_sets.items() if final or step % every == 0]

    async def data_problems(self) -> list[str]:
        """The training data's bad rows, skipped (``file:line: field ...`` each)."""
        source = getattr(self.scheduler, "data", None)
        return [str(b) for b in getattr(source, "bad_rows", [])]

    async def release_memory(self) -> None:
        """Colocated on an accelerator: every engine in rotation frees its weights, KV cache and CUDA
        graphs for the trainer (idle by then: the step's requests were collected or aborted). The
        weights are lost (no CPU backup): the next weight sync restores them after :meth:`resume_memory`."""
        if self.group is None or self._released:
            return
        await asyncio.gather(*(e.release_memory_occupation() for e in self.group.in_rotation()))
        self._released = set(MEMORY_TAGS)

    async def resume_memory(self, tags: list[str] | None = None) -> None:
        """The engines in rotation take back the released memory of ``tags`` (``None``: all), in the order
        SGLang needs: ``weights`` first, then the weight sync, then ``kv_cache`` and ``cuda_graph``."""
        wanted = [t for t in (tags or MEMORY_TAGS) if t in self._released]
        if self.group is None or not wanted:
            return
        await asyncio.gather(*(e.resume_memory_occupation(wanted) for e in self.group.in_rotation()))
        self._released -= set(wanted)

    # -- state -----------------------------------------------------------------------------------
    async def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        restore = getattr(self.scheduler, "load_state_dict", None)
        if restore is None:
            raise RuntimeError("load_state_dict: this scheduler cannot restore its state")
        result = restore(state)
        if asyncio.iscoroutine(result):
            await result

    @property
    def policy_version(self) -> int:
        return self.scheduler.policy_version

    async def active_requests(self) -> int:
        if self.group is None:
            return self.scheduler.inflight_requests
        return await self.group.active_requests()

    async def shutdown(self) -> None:
        drain = getattr(getattr(getattr(self.weights, "sync", None), "transport", None), "drain", None)
        if callable(drain):  # the adapters being unloaded
            await drain()
        try:
            await self.scheduler.shutdown()
        finally:
            try:
                for stop in reversed(self._also_stop):  # what was started after the engines, first
                    await stop()
            finally:
                if self._on_shutdown is not None:
                    result = self._on_shutdown()
                    if asyncio.iscoroutine(result):
                        await result

    def also_stop(self, stop: Callable[[], Awaitable[None]]) -> None:
        """``stop`` runs at :meth:`shutdown`, before the engines and the router stop (e.g. a teacher's own
        engines and their clients)."""
        self._also_stop.append(stop)


async def _score_with(client: ScoringClient, sequences: list[list[int]]) -> list[list[float]]:
    """Each sequence's token logprobs from ``client`` (entry 0: 0.0)."""
    async def one(ids: list[int]) -> list[float]:
        res = await client.generate(ids, SamplingParams(max_new_tokens=0), logprob_start_len=0)
        lps = [0.0 if x is None else float(x) for x in res.input_logprobs]
        return [0.0, *lps[1:len(ids)]] if len(lps) >= len(ids) else [0.0, *lps][:len(ids)]

    return list(await asyncio.gather(*(one(s) for s in sequences)))
