"""Weight sync: bring every engine to the trainer's new weights, verify, continue.

One :meth:`WeightSync.sync` call is one policy version:

1. **export** (``disk`` only) — the caller's ``export(folder)`` writes a Hugging Face folder (config,
   safetensors, tokenizer) into a fresh ``root/v000003``;
2. **pause** — ``/pause_generation`` on every engine, in :attr:`WeightSyncConfig.pause_mode`;
3. **load** — the transport (:mod:`agentrl.runner.weight_transports`): ``/update_weights_from_disk``
   with the folder and ``str(version)`` on every engine at once (``disk``), or the trainer sends its
   weights inside SGLang's update session (``tensor``, ``distributed``);
4. **verify** — every engine's ``/model_info`` must report ``weight_version == str(version)``;
5. **resume** — ``/continue_generation`` on every engine, always (in a ``finally``: an engine left
   paused hangs every later rollout);
6. older ``v*`` folders beyond :attr:`WeightSyncConfig.keep_folders` are removed.

An engine whose pause, load or verify fails is retried (``retries`` times); after that, if other
engines hold the new version, it is taken out of rotation through ``on_remove(engine)`` and named in
:attr:`SyncReport.engines_removed`, so a mix of versions is never left unreported. If no engine
holds the new version, :class:`WeightSyncError` names the phase, the engine and the cause, and no
engine is removed (they all still serve the previous version). Each phase has a deadline; past it the error names the
phase.

Pause modes on SGLang 0.5.23 (read from its tokenizer manager and scheduler):

- ``"retract"`` (the default) keeps requests alive: running requests go back to the waiting queue
  with their tokens so far, the cache flush that follows the load succeeds (the scheduler ignores
  the waiting queue while paused), and after ``continue`` their KV is recomputed with the new
  weights. Nothing is aborted; a request's later tokens come from the new weights.
- ``"in_place"`` keeps requests in the running batch with their old KV cache. The post-load cache
  flush then fails ("requests are still running"), so this mode loads with ``flush_cache=False``:
  the radix cache keeps prefixes computed by the old weights (a later request may reuse them).
- ``"abort"`` ends every running request (they come back with finish reason ``abort``; the client
  resumes them with the remaining budget). :attr:`SyncReport.aborted_requests` counts the requests
  running or waiting (``/v1/loads``) just before the pause; 0 in the modes that keep them.

``abort_requests=True`` additionally passes ``abort_all_requests`` to the load (counted the same way).

Example::

    sync = DiskWeightSync(group.engines, run_dir / "weights", WeightSyncConfig(), on_remove=remove)
    report = await sync.sync(step, backend.export_hf)
    metrics.update(report.to_metrics())
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from annotated_types import Ge, Gt

from agentrl._limits import check_limits
from agentrl.rollout.engine import EngineError, SGLangEngine
from agentrl.runner.weight_transports import AdapterLoad, DiskLoad, PushLoad, Transport

__all__ = ["DiskWeightSync", "SyncPhase", "SyncReport", "WeightSync", "WeightSyncConfig", "WeightSyncError"]

PAUSE_MODES = ("retract", "in_place", "abort")
SyncPhase = Literal["export", "pause", "load", "verify", "resume"]
_FOLDER = re.compile(r"^v(\d+)$")
_T = TypeVar("_T")


class WeightSyncError(RuntimeError):
    """A weight sync failed: ``phase`` is where, ``url`` the engine (``None`` for export or a whole
    phase), ``cause`` the reason."""

    def __init__(self, phase: SyncPhase, cause: str, url: str | None = None) -> None:
        where = f" on {url}" if url else ""
        super().__init__(f"weight sync failed in phase {phase!r}{where}: {cause}")
        self.phase = phase
        self.url = url
        self.cause = cause


@dataclass(frozen=True)
class WeightSyncConfig:
    """How weights reach the engines after each step, and the post-sync probe that checks they did
    (the run config's ``sync`` section is this object).

    - ``method``: how the weights travel (docs/training.md "Weight sync"): ``disk`` (a safetensors
      folder → ``update_weights_from_disk``; needs a filesystem shared by trainer rank 0 and every
      engine), ``tensor`` (the trainer hands its buffers to engines on its host: shared memory on CPU,
      CUDA IPC on GPU), ``distributed`` (a broadcast from trainer rank 0 in one process group per
      engine: gloo on CPU, NCCL on GPU; every engine must reach rank 0's address), or ``auto``
      (:meth:`resolved_method`). ``bucket_mb``: the size of one transfer (buffers are reused across
      syncs). The runner reads both to build the transport.
    - With a LoRA run only the adapter travels, under a new name per version (``disk``: a peft
      folder → ``/load_lora_adapter``; ``tensor``: ``/load_lora_adapter_from_tensors``; no
      ``distributed``); the engines keep serving meanwhile (docs/training.md "LoRA").
    - ``pause_mode``: ``retract`` (default) re-queues running requests across the update so none is
      aborted; ``in_place`` keeps them running on the old KV cache; ``abort`` ends them (counted).
      ``abort_requests``: also abort every request (SGLang's update flag).
    - ``retries`` per engine, ``retry_delay_s`` apart; an engine that still fails is taken out of the
      rotation. Deadlines (``export_s``...) are seconds per phase, over all engines together.
      ``keep_folders``: the newest ``v*`` folders of a disk sync kept.
    - ``probe_sequences`` fixed random sequences of ``probe_length`` tokens are scored by an engine
      and by the trainer after every sync; a mean ``|Δ|`` above ``probe_bound`` stops the run
      (0 sequences: no probe). The default bound, 0.1, passes bf16 serving of an fp32 trainer
      (~1e-2) and fails a skipped sync (~0.9 on the tiny model); fp32 on both sides agrees to ~1e-6.
    """

    method: Literal["disk", "tensor", "distributed", "auto"] = "disk"
    bucket_mb: Annotated[int, Ge(1)] = 512
    pause_mode: Literal["retract", "in_place", "abort"] = "retract"
    abort_requests: bool = False
    retries: Annotated[int, Ge(0)] = 2
    retry_delay_s: Annotated[float, Ge(0.0)] = 0.2
    export_s: Annotated[float, Gt(0.0)] = 600.0
    pause_s: Annotated[float, Gt(0.0)] = 60.0
    load_s: Annotated[float, Gt(0.0)] = 600.0
    verify_s: Annotated[float, Gt(0.0)] = 30.0
    resume_s: Annotated[float, Gt(0.0)] = 60.0
    keep_folders: Annotated[int, Ge(1)] = 1
    probe_sequences: Annotated[int, Ge(0)] = 4
    probe_length: Annotated[int, Ge(2)] = 32
    probe_bound: Annotated[float, Gt(0.0)] = 0.1
    probe_seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in ("disk", "tensor", "distributed", "auto"):
            raise ValueError(f"WeightSyncConfig.method={self.method!r}: expected 'disk', 'tensor', 'distributed' "
                             "or 'auto'")
        if self.pause_mode not in PAUSE_MODES:
            raise ValueError(f"WeightSyncConfig.pause_mode={self.pause_mode!r}: expected one of "
                             f"{', '.join(map(repr, PAUSE_MODES))}")
        if not isinstance(self.abort_requests, bool):
            raise ValueError(f"WeightSyncConfig.abort_requests={self.abort_requests!r}: expected a bool")
        check_limits(self)

    @property
    def aborts(self) -> bool:
        """Whether a sync in this configuration aborts the requests in flight."""
        return self.pause_mode == "abort" or self.abort_requests

    def resolved_method(self, placement: str, *, attached: bool, lora: bool = False) -> str:
        """``method`` with ``auto`` decided: ``tensor`` colocated, ``distributed`` disaggregated, ``disk``
        for engines the run did not start (``rollout.engines.urls``: their host is unknown). A LoRA
        run's adapter travels from tensors (colocated) or through a folder (SGLang loads adapters by
        no broadcast), so ``auto`` is ``disk`` instead of ``distributed`` for it."""
        if self.method != "auto":
            return self.method
        if attached:
            return "disk"
        if placement == "colocated":
            return "tensor"
        return "disk" if lora else "distributed"


@dataclass(frozen=True)
class SyncReport:
    """What one sync did. Times are seconds; ``engines_updated`` hold the new version;
    ``engines_recovering`` left the rotation during it and get it when they come back."""

    version: int
    folder: Path | None  # None: no folder (the tensor and distributed methods)
    export_s: float
    pause_s: float
    load_s: float
    verify_s: float
    resume_s: float
    total_s: float
    engines_updated: tuple[str, ...]
    engines_removed: tuple[str, ...] = ()
    retries: int = 0
    aborted_requests: int = 0
    failures: tuple[str, ...] = field(default=())
    active_requests: int = 0
    engines_recovering: tuple[str, ...] = ()  # out of rotation during the sync: they load it when back
    method: str = "disk"
    transport: dict[str, Any] = field(default_factory=dict)  # the push report (tensor, distributed)

    def to_metrics(self) -> dict[str, float]:
        """Step metrics under ``sync/``."""
        return {
            "sync/version": float(self.version), "sync/export_s": self.export_s, "sync/pause_s": self.pause_s,
            "sync/load_s": self.load_s, "sync/verify_s": self.verify_s, "sync/resume_s": self.resume_s,
            "sync/total_s": self.total_s, "sync/engines_updated": float(len(self.engines_updated)),
            "sync/engines_removed": float(len(self.engines_removed)), "sync/retries": float(self.retries),
            "sync/aborted_requests": float(self.aborted_requests),
            "sync/active_requests": float(self.active_requests),
            "sync/engines_recovering": float(len(self.engines_recovering)),
            f"sync/method_{self.method}": 1.0,
            **{f"sync/push_{k}": float(v) for k, v in self.transport.get("timings", {}).items()},
            **({"sync/push_buckets": float(self.transport["buckets"])} if "buckets" in self.transport else {}),
            **({"sync/bytes": float(self.transport["bytes"])} if "bytes" in self.transport else {}),
        }


async def _maybe_await(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


async def _deadline(phase: SyncPhase, seconds: float, work: Awaitable[_T]) -> _T:
    try:
        return await asyncio.wait_for(work, timeout=seconds)
    except asyncio.TimeoutError:
        raise WeightSyncError(phase, f"did not finish within its deadline of {seconds:g} s") from None


class WeightSync:
    """Syncs weights to ``engines`` (SGLang engines or fake workers) through ``transport`` (default
    :class:`~agentrl.runner.weight_transports.DiskLoad`: a folder under ``root``).

    ``on_remove(engine)`` (sync or async) is called for an engine that still fails after the
    retries, e.g. the engine group's router removal; that engine is not synced again until
    :meth:`load_current` brings it back. ``eligible(engine)``: whether a sync includes an engine
    (default all; a run passes "in the router's rotation", so a dead engine being restarted is not
    waited on: :meth:`load_current` gives it the current version before it serves again). Calls to
    :meth:`sync` and :meth:`load_current` are serialised. Not thread-safe: use it from one event loop.
    """

    def __init__(self, engines: Sequence[SGLangEngine], root: str | os.PathLike[str], config: WeightSyncConfig | None = None,
                 *, on_remove: Callable[[SGLangEngine], object] | None = None,
                 eligible: Callable[[SGLangEngine], bool | Awaitable[bool]] | None = None,
                 transport: Transport | None = None) -> None:
        if not engines:
            raise ValueError("WeightSync(engines=[]): expected at least one engine")
        self.config = config or WeightSyncConfig()
        self.transport: Transport = transport or DiskLoad(abort_requests=self.config.abort_requests)
        self.engines = list(engines)
        self.root = Path(root)
        self.config = config or WeightSyncConfig()
        self.on_remove = on_remove
        self.eligible = eligible
        self.removed: list[SGLangEngine] = []
        self.current: int | None = None  # the version the last successful sync loaded
        self._lock = asyncio.Lock()

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    @property
    def method(self) -> str:
        return self.transport.method

    async def sync(self, version: int, export: Callable[[Path], object] | None = None) -> SyncReport:
        """Exports ``version`` with ``export(folder)`` (sync, run in a thread, or async; ``disk`` only)
        and loads it on every engine; see the module docstring."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"sync(version={version!r}): expected an int >= 0")
        async with self._lock:
            return await self._sync(version, export)

    async def _sync(self, version: int, export: Callable[[Path], object] | None) -> SyncReport:
        cfg = self.config
        start = time.perf_counter()
        folder: Path | None = None
        if self.transport.needs_folder:
            if export is None:
                raise ValueError("WeightSync.sync: a disk sync needs export=")
            folder = await _deadline("export", cfg.export_s, self._export(version, export))
        export_s = time.perf_counter() - start
        eligible = [await self._eligible(e) for e in self.engines]
        run = _SyncRun(self, folder, str(version), [e for e, ok in zip(self.engines, eligible, strict=True) if ok])
        skipped = [e for e, ok in zip(self.engines, eligible, strict=True) if not ok]
        try:
            await run.execute()
        finally:
            await run.resume()
        # an engine that left the rotation during the sync (it died: the health monitor restarts it) is
        # not a failure of the sync: load_current gives it this version before it serves again
        recovering = skipped + [e for e in run.failed if not await self._eligible(e)]
        run.failed = [e for e in run.failed if e not in recovering]
        if not run.updated and not recovering:  # all still serve the old version alike: nothing is removed
            url, cause = run.last_failure or (None, "no engine accepted the update")
            raise WeightSyncError(run.failed_phase, cause, url)
        removed = run.finish_removals()
        if self.on_remove is not None:
            for engine in removed:
                await _maybe_await(self.on_remove(engine))
        self.current = version
        if folder is not None:
            self._prune(version)
        t = run.timings
        return SyncReport(version=version, folder=folder, export_s=export_s, pause_s=t["pause"], load_s=t["load"],
                          verify_s=t["verify"], resume_s=t["resume"], total_s=time.perf_counter() - start,
                          engines_updated=tuple(e.url for e in run.updated),
                          engines_removed=tuple(e.url for e in removed), retries=run.retries,
                          aborted_requests=run.aborted, failures=tuple(run.failures),
                          active_requests=run.active, engines_recovering=tuple(e.url for e in recovering),
                          method=self.method, transport=dict(getattr(self.transport, "last", {}) or {}))

    async def _eligible(self, engine: SGLangEngine) -> bool:
        return True if self.eligible is None else bool(await _maybe_await(self.eligible(engine)))

    async def load_current(self, engine: SGLangEngine) -> str | None:
        """Brings ``engine`` (e.g. just restarted, serving its boot weights) to the version the last
        sync loaded, verifies it, and includes it in later syncs again; waits for a sync in progress.
        Returns the version loaded (``None`` before the first sync: the engine's own weights are version
        0 then). Raises :class:`WeightSyncError` when the load or the check fails."""
        async with self._lock:
            if self.current is None:
                return None
            version = str(self.current)
            folder = self.folder(self.current) if self.transport.needs_folder else None
            load = (self.transport.load([engine], self.current, folder, flush=True, exact=True)
                    if isinstance(self.transport, (PushLoad, AdapterLoad)) else
                    self.transport.load([engine], self.current, folder, flush=True))
            errors = await _deadline("load", self.config.load_s, load)
            if errors.get(engine.url):
                raise WeightSyncError("load", str(errors[engine.url]), engine.url)
            problem = await _deadline("verify", self.config.verify_s, self.transport.verify(engine, self.current))
            if problem is not None:
                raise WeightSyncError("verify", problem, engine.url)
            if engine in self.removed:
                self.removed.remove(engine)
            if engine not in self.engines:
                self.engines.append(engine)
            return version

    async def _export(self, version: int, export: Callable[[Path], object]) -> Path:
        folder = self.folder(version)
        if folder.exists():  # a retried version: never load a half-written folder of an earlier try
            await asyncio.to_thread(shutil.rmtree, folder)
        folder.mkdir(parents=True)
        try:
            if inspect.iscoroutinefunction(export):
                await export(folder)
            else:
                await _maybe_await(await asyncio.to_thread(export, folder))
            self.transport.check_folder(folder)
        except Exception as err:  # the caller's exporter: whatever it raised, the phase is named
            raise WeightSyncError("export", f"{type(err).__name__}: {err}") from err
        return folder

    def _prune(self, current: int) -> None:
        """Keeps the newest ``keep_folders`` version folders up to ``current``; never newer ones."""
        found = sorted((int(m.group(1)), p) for p in self.root.iterdir()
                       if p.is_dir() and (m := _FOLDER.match(p.name)))
        older = [p for v, p in found if v <= current]
        for path in older[: max(0, len(older) - self.config.keep_folders)]:
            shutil.rmtree(path, ignore_errors=True)


class _SyncRun:
    """The engine-side phases of one sync, with per-engine retries and bookkeeping."""

    def __init__(self, owner: WeightSync, folder: Path | None, version: str, engines: list[SGLangEngine]) -> None:
        self.owner = owner
        self.cfg = owner.config
        self.folder = folder
        self.version = version
        self.engines = engines
        self.paused: list[SGLangEngine] = []
        self.updated: list[SGLangEngine] = []
        self.failed: list[SGLangEngine] = []
        self.failures: list[str] = []
        self.last_failure: tuple[str | None, str] | None = None
        self.failed_phase: SyncPhase = "load"
        self.retries = 0
        self.aborted = 0
        self.active = 0  # requests running or waiting on the engines when the pause began
        self.timings: dict[str, float] = {"pause": 0.0, "load": 0.0, "verify": 0.0, "resume": 0.0}

    def _fail(self, engine: SGLangEngine, phase: SyncPhase, cause: str) -> None:
        self.failures.append(f"{phase} {engine.url}: {cause}")
        self.last_failure = (engine.url, cause)
        self.failed_phase = phase

    async def execute(self) -> None:
        cfg = self.cfg
        self.active = await self._count_active()
        if cfg.aborts and self.owner.transport.pauses:
            self.aborted = self.active
        t0 = time.perf_counter()
        if self.owner.transport.pauses:
            await _deadline("pause", cfg.pause_s, self._pause_all())
        else:  # (a LoRA adapter loads beside the one being served: nothing changes under a request)
            self.paused = list(self.engines)
        self.timings["pause"] = time.perf_counter() - t0
        pending = [e for e in self.engines if e in self.paused]
        for attempt in range(cfg.retries + 1):
            if attempt:
                self.retries += len(pending)
                await asyncio.sleep(cfg.retry_delay_s)
            t0 = time.perf_counter()
            loaded = await _deadline("load", cfg.load_s, self._load(pending))
            t1 = time.perf_counter()
            candidates = [e for e, ok in zip(pending, loaded, strict=True) if ok]
            verified = await _deadline("verify", cfg.verify_s,
                                       asyncio.gather(*(self._verify(e) for e in candidates)))
            self.timings["load"] += t1 - t0
            self.timings["verify"] += time.perf_counter() - t1
            self.updated += [e for e, ok in zip(candidates, verified, strict=True) if ok]
            # a push that reached an engine and broke off left it with part of the weights (or blocked in a
            # dead trainer's broadcast): no retry; it is taken out, restarted and brought up to date
            partial: set[str] = getattr(self.owner.transport, "partial", set())
            self.failed += [e for e in pending if e.url in partial and e not in self.updated]
            pending = [e for e in pending if e not in self.updated and e not in self.failed]
            if not pending:
                break
        self.failed += pending
        if self.updated:
            await self.owner.transport.activate(int(self.version), self.updated)

    async def _count_active(self) -> int:
        counts = await asyncio.gather(*(e.active_requests() for e in self.engines), return_exceptions=True)
        return sum(c for c in counts if isinstance(c, int))

    async def _pause_all(self) -> None:
        async def pause(engine: SGLangEngine) -> None:
            for attempt in range(self.cfg.retries + 1):
                if attempt:
                    self.retries += 1
                    await asyncio.sleep(self.cfg.retry_delay_s)
                try:
                    await engine.pause_generation(self.cfg.pause_mode)
                except EngineError as err:
                    self._fail(engine, "pause", str(err))
                    continue
                self.paused.append(engine)
                return
            self.failed.append(engine)

        await asyncio.gather(*(pause(e) for e in self.engines))

    async def _load(self, engines: list[SGLangEngine]) -> list[bool]:
        # in_place keeps requests in the running batch, where SGLang's post-load flush fails
        errors = await self.owner.transport.load(engines, int(self.version), self.folder,
                                                 flush=self.cfg.pause_mode != "in_place")
        for engine in engines:
            if errors.get(engine.url):
                self._fail(engine, "load", str(errors[engine.url]))
        return [not errors.get(e.url) for e in engines]

    async def _verify(self, engine: SGLangEngine) -> bool:
        problem = await self.owner.transport.verify(engine, int(self.version))
        if problem is None:
            return True
        self._fail(engine, "verify", problem)
        return False

    async def resume(self) -> None:
        """Continues every engine this sync paused (failed ones too: a paused engine hangs its
        requests); errors are recorded, never raised over the sync's own outcome."""
        t0 = time.perf_counter()

        if not self.owner.transport.pauses:
            return

        async def resume_one(engine: SGLangEngine) -> None:
            try:
                await asyncio.wait_for(engine.continue_generation(), timeout=self.cfg.resume_s)
            except (EngineError, asyncio.TimeoutError) as err:
                if engine not in self.paused:  # its pause failed already; that is the error on record
                    return
                self._fail(engine, "resume", f"{type(err).__name__}: {err}")
                if engine in self.updated:
                    self.updated.remove(engine)
                    self.failed.append(engine)

        # every engine asked to pause, also one whose pause failed: it may have paused all the same
        await asyncio.gather(*(resume_one(e) for e in self.engines))
        self.timings["resume"] = time.perf_counter() - t0

    def finish_removals(self) -> list[SGLangEngine]:
        removed = [e for e in self.engines if e in self.failed]
        for engine in removed:
            self.owner.engines.remove(engine)
            self.owner.removed.append(engine)
        return removed


DiskWeightSync = WeightSync
"""The former name of :class:`WeightSync` (disk was its only transport)."""
