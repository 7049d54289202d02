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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentrl.model_folder import ModelFolderError
from agentrl.rollout.engine import EngineError, SGLangEngine

if TYPE_CHECKING:
    from agentrl.runner.weight_push import PushTarget  # the trainer's side (torch) stays out of config checks

__all__ = ["DiskLoad", "PushLoad", "Pusher", "Transport", "WeightsMovedError"]


class WeightsMovedError(RuntimeError):
    """The trainer's weights moved past the version asked for (a step ran since): they can only be
    sent as the next version, with the next sync."""


class Transport(Protocol):
    """The load phase of a sync: per engine, ``None`` (loaded) or why not."""

    method: str

    async def load(self, engines: Sequence[SGLangEngine], version: int, folder: Path | None, *,
                   flush: bool) -> dict[str, str | None]: ...


class Pusher(Protocol):
    """The trainer's weight sender, wherever it runs (:meth:`TrainService.push_weights` in this
    process, or every rank of the train group): returns the push report's dict, with ``moved``
    true (nothing sent) when ``exact`` and the trainer's weights are no longer ``version``."""

    async def push(self, version: int, targets: list[PushTarget], *, flush: bool, exact: bool) -> dict[str, Any]: ...


class DiskLoad:
    """``update_weights_from_disk`` from the exported folder on every engine at once
    (``abort_requests``: SGLang's ``abort_all_requests`` with it)."""

    method = "disk"

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


class PushLoad:
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
