"""Engine group: a router, the engines behind it, and the health monitor that keeps them serving.

:class:`EngineGroup` owns one :class:`~agentrl.rollout.router.Router` and its
:class:`~agentrl.rollout.engine.SGLangEngine` s. It registers an engine only once it is healthy and
deregisters it before stopping it. Its monitor (:meth:`EngineGroup.start_monitor`) checks every
engine each ``check_interval_s``: a launched engine whose process has exited is dead at once; an
engine failing ``failure_threshold`` consecutive HTTP health checks is dead too. A dead engine is
taken out of the router's rotation first, then its process tree is stopped, then (if configured) it
is restarted on the same port and registered again. Requests that were running on it fail at the
router with 5xx; the client retries them on the remaining engines or returns them as aborted, so
nothing hangs and nothing is lost silently. Every transition is recorded in :attr:`EngineGroup.events`.

The monitor does not rely on the router's own health checks, which notice a dead worker slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from agentrl.model_folder import check_model_folder
from agentrl.rollout._health_config import HealthConfig
from agentrl.rollout.client import ClientConfig, InferenceClient
from agentrl.rollout.engine import EngineConfig, EngineStarter, PauseMode, SGLangEngine
from agentrl.rollout.router import Router, RouterConfig, RouterError

__all__ = ["EngineGroup", "HealthConfig", "HealthEvent"]


@dataclass(frozen=True)
class HealthEvent:
    """One state change of an engine: ``dead`` (with the reason), ``removed``, ``restarted`` (back in
    rotation), ``standby`` (restarted, waiting for the next weight sync), ``readmitted`` (after it),
    ``given_up``."""

    time: float
    url: str
    kind: Literal["dead", "removed", "restarted", "standby", "readmitted", "given_up"]
    detail: str = ""


@dataclass
class _Tracked:
    engine: SGLangEngine
    failures: int = 0
    in_rotation: bool = True
    recovering: bool = False
    standby: bool = False  # restarted and healthy, out of rotation until a weight sync brings it up to date
    restart_task: asyncio.Task[None] | None = field(default=None, repr=False)


async def _all_settled(calls: Iterable[Awaitable[object]]) -> None:
    """Awaits every call to the end, then raises the first error (``gather`` would raise while others
    still run, and a ``continue`` could then overtake a ``pause`` still on its way)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


class EngineGroup:
    """Router plus engines. Build with :meth:`launch` (or the constructor for attached engines)."""

    def __init__(self, router: Router, engines: Sequence[SGLangEngine], health: HealthConfig | None = None) -> None:
        self.router = router
        self.health = health or HealthConfig()
        self._tracked = [_Tracked(e) for e in engines]
        self.events: list[HealthEvent] = []
        self._monitor: asyncio.Task[None] | None = None
        # called with a restarted engine before it goes back into rotation (a training run loads the
        # current weight version into it there); raising keeps the engine out, on record; False puts
        # it on standby until the next weight sync (then readmit)
        self.before_readmit: Callable[[SGLangEngine], Awaitable[bool | None]] | None = None

    @classmethod
    async def launch(cls, engine_configs: Sequence[EngineConfig], router_config: RouterConfig | None = None,
                     health: HealthConfig | None = None,
                     starters: Sequence[EngineStarter] | None = None) -> EngineGroup:
        """Starts the router and all engines (concurrently), registers each engine once healthy.
        ``starters``: one per engine, who starts it (``None``: subprocesses of this process)."""
        if starters is not None and len(starters) != len(engine_configs):
            raise ValueError(f"starters: {len(starters)} for {len(engine_configs)} engine configs; expected one each")
        router = await Router.launch(router_config)
        chosen: Sequence[EngineStarter | None] = starters if starters is not None else [None] * len(engine_configs)
        results = await asyncio.gather(*(SGLangEngine.launch(c, s) for c, s in zip(engine_configs, chosen, strict=True)),
                                       return_exceptions=True)
        engines = [r for r in results if isinstance(r, SGLangEngine)]
        errors = [r for r in results if isinstance(r, BaseException)]
        group = cls(router, engines, health)
        if errors:
            await group.shutdown()
            raise errors[0]
        try:
            for engine in engines:
                await router.add_worker(engine.url)
        except BaseException:
            await group.shutdown()
            raise
        return group

    @classmethod
    async def attach(cls, urls: Sequence[str], router_config: RouterConfig | None = None,
                     health: HealthConfig | None = None) -> EngineGroup:
        """Starts a router over engines already running at ``urls`` (checked with ``/server_info``);
        :meth:`shutdown` deregisters them and stops the router, and leaves the engines running."""
        router = await Router.launch(router_config)
        try:
            engines = list(await asyncio.gather(*(SGLangEngine.attach(url) for url in urls)))
            for engine in engines:
                await router.add_worker(engine.url)
        except BaseException:
            await asyncio.to_thread(router.stop)
            raise
        return cls(router, engines, health)

    @property
    def engines(self) -> list[SGLangEngine]:
        return [t.engine for t in self._tracked]

    def is_in_rotation(self, engine: SGLangEngine) -> bool:
        return any(t.engine is engine and t.in_rotation for t in self._tracked)

    async def serving(self, engine: SGLangEngine) -> bool:
        """In rotation and its process alive (the monitor may not have seen a death yet)."""
        return self.is_in_rotation(engine) and await asyncio.to_thread(engine.alive)

    def in_rotation(self) -> list[SGLangEngine]:
        """The engines currently in the router's rotation (not dead, not being restarted)."""
        return [t.engine for t in self._tracked if t.in_rotation]

    def engine_urls(self) -> list[str]:
        """URLs of the engines currently in the router's rotation (the client's abort targets)."""
        return [t.engine.url for t in self._tracked if t.in_rotation]

    async def active_requests(self) -> int:
        """Requests running or waiting on the engines in rotation (``/v1/loads``): the scheduler's
        ``load_probe``, to check that an abort left them idle."""
        engines = [t.engine for t in self._tracked if t.in_rotation]
        return sum(await asyncio.gather(*(e.active_requests() for e in engines)))

    def client(self, **overrides: object) -> InferenceClient:
        """A client for this group: data path through the router, aborts to the engines."""
        config = replace(ClientConfig(base_url=self.router.url, via_router=True), **overrides)  # type: ignore[arg-type]
        return InferenceClient(config, control_urls=self.engine_urls)

    async def add_engine(self, engine: SGLangEngine) -> None:
        """Registers an already healthy engine (launched or attached) and starts tracking it."""
        await self.router.add_worker(engine.url)
        self._tracked.append(_Tracked(engine))

    # ----- monitoring ------------------------------------------------------------------------------

    def start_monitor(self) -> None:
        if self._monitor is None or self._monitor.done():
            self._monitor = asyncio.ensure_future(self._run_monitor())

    async def stop_monitor(self) -> None:
        tasks = [t for t in [self._monitor, *(tr.restart_task for tr in self._tracked)] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._monitor = None

    async def _run_monitor(self) -> None:
        while True:
            await self.check_once()
            await asyncio.sleep(self.health.check_interval_s)

    async def check_once(self) -> None:
        """One round of checks over all engines not already being recovered."""
        await asyncio.gather(*(self._check(t) for t in self._tracked if not t.recovering))

    async def _check(self, tracked: _Tracked) -> None:
        engine = tracked.engine
        reason = ""
        if not await asyncio.to_thread(engine.alive):  # a process on another node answers through its host
            code = engine.process.returncode() if engine.process else None
            reason = f"process exited with code {code}"
        elif self.health.http_checks:
            if await engine.healthy(timeout_s=self.health.http_timeout_s, generate=self.health.http_generate):
                tracked.failures = 0
            else:
                tracked.failures += 1
                if tracked.failures >= self.health.failure_threshold:
                    reason = f"{tracked.failures} consecutive failed health checks"
        if reason and not tracked.recovering:
            tracked.recovering = True
            self.events.append(HealthEvent(time.time(), engine.url, "dead", reason))
            await self._take_out(tracked)
            tracked.restart_task = asyncio.ensure_future(self._recover(tracked))

    async def take_out(self, engine: SGLangEngine) -> None:
        """Removes ``engine`` from the router's rotation and stops it (e.g. after a failed weight sync);
        the health monitor restarts it when restarts are enabled."""
        for tracked in self._tracked:
            if tracked.engine is engine and tracked.in_rotation:
                await self._take_out(tracked)

    async def _take_out(self, tracked: _Tracked) -> None:
        tracked.in_rotation = False
        with contextlib.suppress(RouterError):
            await self.router.remove_worker(tracked.engine.url)
        self.events.append(HealthEvent(time.time(), tracked.engine.url, "removed"))
        await asyncio.to_thread(tracked.engine.stop)

    async def _recover(self, tracked: _Tracked) -> None:
        engine = tracked.engine
        if not self.health.restart or engine.config is None or engine.restarts >= self.health.max_restarts:
            self.events.append(HealthEvent(time.time(), engine.url, "given_up",
                                           f"restart={self.health.restart}, restarts={engine.restarts}"))
            return
        try:
            await engine.restart()
            ready = await self.before_readmit(engine) if self.before_readmit is not None else True
            if ready is not False:
                await self.router.add_worker(engine.url)
        except Exception as err:  # whatever failed, the engine stays out and the failure is on record
            self.events.append(HealthEvent(time.time(), engine.url, "given_up", f"restart failed: {err}"))
            return
        tracked.failures = 0
        tracked.recovering = False
        if ready is False:  # the current weights cannot reach it now: the next weight sync readmits it
            tracked.standby = True
            self.events.append(HealthEvent(time.time(), engine.url, "standby", f"restart #{engine.restarts}"))
            return
        tracked.in_rotation = True
        self.events.append(HealthEvent(time.time(), engine.url, "restarted", f"restart #{engine.restarts}"))

    def on_standby(self, engine: SGLangEngine) -> bool:
        return any(t.engine is engine and t.standby for t in self._tracked)

    async def syncable(self, engine: SGLangEngine) -> bool:
        """In rotation or on standby, and its process alive: what a weight sync includes."""
        ok = any(t.engine is engine and (t.in_rotation or t.standby) for t in self._tracked)
        return ok and await asyncio.to_thread(engine.alive)

    async def readmit(self, engine: SGLangEngine) -> None:
        """Puts an engine on standby back into rotation (it now holds the current weights)."""
        for tracked in self._tracked:
            if tracked.engine is engine and tracked.standby:
                await self.router.add_worker(engine.url)
                tracked.standby, tracked.in_rotation = False, True
                self.events.append(HealthEvent(time.time(), engine.url, "readmitted"))

    async def wait_any_in_rotation(self, timeout_s: float, *, standby: bool = False) -> None:
        """Waits until at least one engine is in rotation (``standby``: or on standby); raises
        ``TimeoutError`` after ``timeout_s``, naming the health events."""
        deadline = time.monotonic() + timeout_s
        while not any(t.in_rotation or (standby and t.standby) for t in self._tracked):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no engine in rotation after {timeout_s} s: {self.events[-6:]}")
            await asyncio.sleep(0.2)

    async def wait_all_in_rotation(self, timeout_s: float) -> None:
        """Waits until no engine is being recovered (raises ``TimeoutError`` after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while any(t.recovering or not t.in_rotation for t in self._tracked):
            if time.monotonic() > deadline:
                raise TimeoutError(f"engines not back in rotation after {timeout_s} s: {self.events}")
            await asyncio.sleep(0.2)

    # ----- group-wide control ----------------------------------------------------------------------

    async def update_weights_from_disk(self, model_path: str | os.PathLike[str], weight_version: str, *,
                                       pause_mode: PauseMode | None = None) -> None:
        """Loads new weights on every engine in rotation (concurrently); each flushes its cache.

        With ``pause_mode``, generation is paused on all engines first and continued on all afterwards
        (also when pausing or the update fails on some engine): ``"abort"`` returns running requests as aborted (resume them with the
        remaining budget), ``"retract"`` requeues them so they finish on the new weights. Without it,
        requests running during the update may span two versions (see
        ``GenerateResult.weight_version_spans``).
        """
        engines = [t.engine for t in self._tracked if t.in_rotation]
        if any(e.local for e in engines):  # checked before anything is paused
            check_model_folder(model_path, needs=("config", "weights"), what="update_weights_from_disk: model_path")
        failed = False
        try:
            if pause_mode is not None:
                await _all_settled(e.pause_generation(pause_mode) for e in engines)
            await _all_settled(e.update_weights_from_disk(model_path, weight_version) for e in engines)
        except BaseException:
            failed = True
            raise
        finally:
            if pause_mode is not None:
                try:
                    await _all_settled(e.continue_generation() for e in engines)
                except Exception:
                    if not failed:  # otherwise the pause's or update's own error is the one to report
                        raise

    async def drain(self, timeout_s: float = 60.0) -> None:
        """Aborts every request on every engine in rotation, then waits until all are idle.

        Aborted requests come back to their callers with finish reason ``ABORT`` and the tokens
        produced so far. Callers should stop submitting new requests first (cancel the episode tasks).
        """
        engines = [t.engine for t in self._tracked if t.in_rotation]
        await asyncio.gather(*(e.abort_all() for e in engines))
        await asyncio.gather(*(e.wait_idle(timeout_s) for e in engines))

    async def shutdown(self) -> None:
        """Stops monitoring, deregisters and stops every launched engine, then stops the router.

        Every step runs even when an earlier one raises; the error is raised after the last step.
        """
        async with contextlib.AsyncExitStack() as stack:
            # Callbacks run last-in first-out: the engines in order, then the router.
            stack.push_async_callback(asyncio.to_thread, self.router.stop)
            for tracked in reversed(self._tracked):
                stack.push_async_callback(self._retire, tracked)
            await self.stop_monitor()

    async def _retire(self, tracked: _Tracked) -> None:
        try:
            if tracked.in_rotation and await asyncio.to_thread(tracked.engine.alive):
                with contextlib.suppress(RouterError):
                    await self.router.remove_worker(tracked.engine.url)
        finally:
            tracked.in_rotation = False
            await asyncio.to_thread(tracked.engine.stop)
