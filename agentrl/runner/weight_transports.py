"""How a weight sync's load phase reaches the engines: from a folder, or from the trainer directly.

A :class:`~agentrl.runner.weights.WeightSync` pauses the engines, runs its transport's ``load`` on
the ones that paused, verifies each engine's version, and resumes them; the transport only moves
the weights and says, per engine, whether that worked (``None``) or why not.

- :class:`DiskLoad` (``sync.method = "disk"``): ``update_weights_from_disk`` with the folder the
  trainer exported, on every engine at once.
- :class:`PushLoad` (``"tensor"``, ``"distributed"``): SGLang's update session is opened on every
  engine (``begin_weight_update``), the trainer sends its weights bucket by bucket
  (:class:`~agentrl.runner.weight_push.WeightPusher`, through a :class:`Pusher`: in this process or
  in the train actors), and the session is closed (``end_weight_update``) on every engine that
  opened one, also when the push failed. An engine whose push failed part way holds a mix of two
  versions: it is reported failed, so the sync retries it and, after that, takes it out of rotation
  (the health monitor restarts it and it gets the current version before it serves again).
- :class:`AdapterLoad` (``train.lora``): only the LoRA adapter travels, loaded *beside* the one being
  served under a new name per version (:func:`adapter_name`): from the folder the trainer wrote
  (``disk``: ``/load_lora_adapter``) or pushed by the trainer from tensors (``tensor``:
  ``/load_lora_adapter_from_tensors``). Nothing changes under a running request, so the engines do
  not pause. Verified by the engine listing the name (``/v1/models``); then the client sends every
  new request through it (:meth:`AdapterLoad.activate`) and the previous version is unloaded, which
  SGLang does once no request uses it: a request admitted under the old adapter keeps it (SGLang pins
  a request's adapter, across retraction too) and its tokens say the old version.

The weights' transports verify an engine by its ``weight_version``; the adapter's by its adapter list.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentrl.model_folder import ModelFolderError, check_model_folder
from agentrl.rollout.engine import EngineError, SGLangEngine

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from agentrl.runner.weight_push import PushTarget  # the trainer's side (torch) stays out of config checks

__all__ = ["AdapterLoad", "DiskLoad", "PushLoad", "Pusher", "Transport", "WeightsMovedError", "adapter_name",
           "check_adapter_folder"]

ADAPTER_PREFIX = "agentrl-v"


def adapter_name(version: int) -> str:
    """The name the engines serve version ``version`` of a LoRA run's adapter under (SGLang refuses a
    name already loaded, so each version has its own)."""
    return f"{ADAPTER_PREFIX}{version}"


def check_adapter_folder(folder: Path) -> None:
    """A peft adapter folder: ``adapter_config.json`` and ``adapter_model.safetensors``."""
    missing = [n for n in ("adapter_config.json", "adapter_model.safetensors") if not (folder / n).is_file()]
    if missing:
        raise ModelFolderError(f"{str(folder)!r} is not a LoRA adapter folder: no {', '.join(missing)}")


class WeightsMovedError(RuntimeError):
    """The trainer's weights moved past the version asked for (a step ran since): they can only be
    sent as the next version, with the next sync."""


class Transport(Protocol):
    """The load phase of a sync: per engine, ``None`` (loaded) or why not; and how a loaded engine
    is checked. ``pauses``: whether the engines pause around the load; ``needs_folder``: whether the
    trainer exports a folder first (``check_folder`` checks it)."""

    method: str
    pauses: bool
    needs_folder: bool

    async def load(self, engines: Sequence[SGLangEngine], version: int, folder: Path | None, *,
                   flush: bool) -> dict[str, str | None]: ...

    def check_folder(self, folder: Path) -> None: ...

    async def verify(self, engine: SGLangEngine, version: int) -> str | None: ...

    async def activate(self, version: int, engines: Sequence[SGLangEngine]) -> None: ...


class _WeightsTransport:
    """What the transports of whole weights share: engines pause around the load, and an engine is
    checked by its ``weight_version``."""

    method = "disk"
    pauses = True
    needs_folder = False

    def check_folder(self, folder: Path) -> None:
        check_model_folder(folder, needs=("config", "weights"), what=f"export({folder.name})")

    async def verify(self, engine: SGLangEngine, version: int) -> str | None:
        try:
            got: str | None = await engine.weight_version()
        except EngineError as err:
            return f"/model_info unanswered: {err}"
        return None if got == str(version) else f"/model_info reports weight_version {got!r}, expected {str(version)!r}"

    async def activate(self, version: int, engines: Sequence[SGLangEngine]) -> None:
        """Nothing to do: the engines serve the new weights to every request once resumed."""


class Pusher(Protocol):
    """The trainer's weight sender, wherever it runs (:meth:`TrainService.push_weights` in this
    process, or every rank of the train group): returns the push report's dict, with ``moved``
    true (nothing sent) when ``exact`` and the trainer's weights are no longer ``version``."""

    async def push(self, version: int, targets: list[PushTarget], *, flush: bool, exact: bool) -> dict[str, Any]: ...


class DiskLoad(_WeightsTransport):
    """``update_weights_from_disk`` from the exported folder on every engine at once
    (``abort_requests``: SGLang's ``abort_all_requests`` with it)."""

    method = "disk"
    needs_folder = True

    def __init__(self, *, abort_requests: bool = False) -> None:
        self.abort_requests = abort_requests

    async def load(self, engines: Sequence[SGLangEngine], version: int, folder: Path | None, *,
                   flush: bool) -> dict[str, str | None]:
        if folder is None:
            raise ValueError("DiskLoad.load: expected the exported folder")

        async def one(engine: SGLangEngine) -> str | None:
            try:
                await engine.update_weights_from_disk(folder, str(version), flush_cache=flush,
                                                      abort_all_requests=self.abort_requests)
            except (EngineError, ModelFolderError) as err:
                return str(err)
            return None

        results = await asyncio.gather(*(one(e) for e in engines))
        return {e.url: r for e, r in zip(engines, results, strict=True)}


class PushLoad(_WeightsTransport):
    """The trainer sends its weights inside SGLang's update session (see the module doc).

    ``target(engine)``: the engine as the pusher sees it (TP size, node, group name). ``exact``: a
    push that must carry the version asked for (a restarted engine catching up); else the trainer's
    current weights are that version by construction (the runner syncs right after the step).
    """

    def __init__(self, method: str, pusher: Pusher, target: Callable[[SGLangEngine], PushTarget]) -> None:
        self.method, self.pusher, self.target = method, pusher, target
        self.last: dict[str, Any] = {}
        self.partial: set[str] = set()  # engines a push reached and did not finish: not retried, taken out

    async def load(self, engines: Sequence[SGLangEngine], version: int, folder: Path | None, *,
                   flush: bool, exact: bool = False) -> dict[str, str | None]:
        errors: dict[str, str | None] = {e.url: None for e in engines}
        begun: list[SGLangEngine] = []
        self.partial = set()

        async def begin(engine: SGLangEngine) -> None:
            try:
                await engine.begin_weight_update()
                begun.append(engine)
            except EngineError as err:
                errors[engine.url] = f"begin_weight_update: {err}"

        await asyncio.gather(*(begin(e) for e in engines))
        try:
            if begun:
                report = await self.pusher.push(version, [self.target(e) for e in begun], flush=flush, exact=exact)
                if report.get("moved"):
                    raise WeightsMovedError(f"the trainer's weights moved past version {version}: they reach "
                                            "the engine with the next sync")
                self.last = report
                failed = {url: err for url, err in report.get("errors", {}).items() if url in errors and err}
                errors.update(failed)
                self.partial |= {url for url in failed if report.get("buckets", 0) > 0}
        except WeightsMovedError:
            raise
        except Exception as err:  # the trainer failed mid-push: every engine it sent to may hold a mix
            for engine in begun:
                errors[engine.url] = f"push failed: {type(err).__name__}: {err}"
                self.partial.add(engine.url)
        finally:
            await asyncio.gather(*(self._end(e, errors) for e in begun))
        return errors

    @staticmethod
    async def _end(engine: SGLangEngine, errors: dict[str, str | None]) -> None:
        try:
            await engine.end_weight_update()
        except EngineError as err:
            errors[engine.url] = errors[engine.url] or f"end_weight_update: {err}"


class AdapterLoad:
    """A LoRA run's adapter, loaded beside the served one under a new name per version (see the module
    doc). ``method``: ``disk`` (the folder the trainer wrote) or ``tensor`` (``pusher`` sends it from
    tensors to each ``target(engine)``). ``switch(name, version)``: points the run's client at a
    loaded version (every later request goes through it). Older versions are unloaded after the switch."""

    pauses = False

    def __init__(self, method: str, *, switch: Callable[[str, int], None] | None = None,
                 pusher: Pusher | None = None, target: Callable[[SGLangEngine], PushTarget] | None = None) -> None:
        if method not in ("disk", "tensor"):
            raise ValueError(f"AdapterLoad(method={method!r}): a LoRA adapter travels by 'disk' or 'tensor'")
        if method == "tensor" and (pusher is None or target is None):
            raise ValueError("AdapterLoad(method='tensor'): expected the trainer's pusher and the engines' targets")
        self.method, self.switch, self.pusher, self.target = method, switch, pusher, target
        self.needs_folder = method == "disk"
        self.last: dict[str, Any] = {}
        self.partial: set[str] = set()  # (an adapter load is whole or nothing: never partial)
        self.active: int | None = None  # the version requests go through
        self._unloading: set[asyncio.Future[None]] = set()

    def check_folder(self, folder: Path) -> None:
        check_adapter_folder(folder)

    async def load(self, engines: Sequence[SGLangEngine], version: int, folder: Path | None, *,
                   flush: bool, exact: bool = False) -> dict[str, str | None]:
        name = adapter_name(version)
        if self.method == "tensor":
            assert self.pusher is not None and self.target is not None
            report = await self.pusher.push(version, [self.target(e) for e in engines], flush=flush, exact=exact)
            if report.get("moved"):
                raise WeightsMovedError(f"the trainer's adapter moved past version {version}: it reaches the "
                                        "engine with the next sync")
            self.last = report
            errors = report.get("errors", {})
            return {e.url: errors.get(e.url) for e in engines}
        if folder is None:
            raise ValueError("AdapterLoad.load: method 'disk' expected the adapter folder")

        async def one(engine: SGLangEngine) -> str | None:
            try:
                await load_adapter_folder(engine, name, folder)
            except EngineError as err:
                return str(err)
            return None

        started = time.perf_counter()
        results = await asyncio.gather(*(one(e) for e in engines))
        self.last = {"timings": {"load_s": time.perf_counter() - started},
                     "bytes": _folder_bytes(folder) * len(engines)}
        return {e.url: r for e, r in zip(engines, results, strict=True)}

    async def verify(self, engine: SGLangEngine, version: int) -> str | None:
        name = adapter_name(version)
        try:
            loaded = await engine.lora_adapters()
        except EngineError as err:
            return f"/v1/models unanswered: {err}"
        return None if name in loaded else f"/v1/models lists adapters {loaded}, expected {name!r} among them"

    async def activate(self, version: int, engines: Sequence[SGLangEngine]) -> None:
        """Every later request goes through ``version``; the older versions are unloaded in the
        background (SGLang finishes the requests that use them first)."""
        previous, self.active = self.active, version
        if self.switch is not None:
            self.switch(adapter_name(version), version)
        if previous is not None and previous != version:
            for engine in engines:
                task = asyncio.ensure_future(_unload_quietly(engine, adapter_name(previous)))
                self._unloading.add(task)
                task.add_done_callback(self._unloading.discard)

    async def drain(self) -> None:
        """Waits for the background unloads (tests; a run's end)."""
        if self._unloading:
            await asyncio.gather(*self._unloading, return_exceptions=True)


async def load_adapter_folder(engine: SGLangEngine, name: str, folder: Path) -> None:
    """``/load_lora_adapter`` of ``folder`` under ``name``; a name left loaded by an earlier try of the
    same version is unloaded first (SGLang refuses a name it holds)."""
    try:
        await engine.load_lora_adapter(name, folder)
    except EngineError as err:
        if "already loaded" not in str(err):
            raise
        await engine.unload_lora_adapter(name)
        await engine.load_lora_adapter(name, folder)


async def _unload_quietly(engine: SGLangEngine, name: str) -> None:
    try:
        await engine.unload_lora_adapter(name)
    except EngineError as err:  # a restarted engine never held it; a dead one holds nothing
        log.info("unloading adapter %s on %s: %s", name, engine.url, err)


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
