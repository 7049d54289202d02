"""Adapters that give the runner one async interface to each side, wherever it runs.

- :class:`LocalTrainer`: a :class:`~agentrl.runner.trainer.TrainService` in this process; its
  methods run in a worker thread so the event loop (and the rollouts of the async modes) keeps going.
- :class:`ActorProxy`: any Ray actor handle; ``await proxy.method(...)`` is
  ``await handle.method.remote(...)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.runner.trainer import TrainService
from agentrl.train.batching import TrainingBatch

__all__ = ["ActorProxy", "LocalTrainer"]


class LocalTrainer:
    """The trainer side in-process (one rank)."""

    def __init__(self, service: TrainService) -> None:
        self.service = service

    async def train(self, batch: TrainingBatch, step: int) -> dict[str, float]:
        return await asyncio.to_thread(self.service.train, batch, step)

    async def export(self, folder: str) -> str:
        return await asyncio.to_thread(self.service.export, folder)

    async def score(self, sequences: list[list[int]]) -> list[list[float]]:
        return await asyncio.to_thread(self.service.score, sequences)

    async def probe_adapter(self, folder: str, sequences: list[list[int]], seed: int) -> dict[str, Any]:
        return await asyncio.to_thread(self.service.probe_adapter, folder, sequences, seed)

    async def export_merged(self, folder: str) -> str:
        return await asyncio.to_thread(self.service.export_merged, folder)

    async def save(self, folder: str) -> str:
        return await asyncio.to_thread(self.service.save, folder)

    async def load(self, folder: str) -> None:
        await asyncio.to_thread(self.service.load, folder)

    async def digest(self) -> str:
        return await asyncio.to_thread(self.service.digest)

    async def warmup(self, run_dir: str | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(self.service.warmup, run_dir)

    async def offload(self) -> dict[str, float]:
        return await asyncio.to_thread(self.service.offload)

    async def onload(self) -> dict[str, float]:
        return await asyncio.to_thread(self.service.onload)

    async def push(self, version: int, targets: list[Any], *, flush: bool, exact: bool) -> dict[str, Any]:
        """:class:`~agentrl.runner.weight_transports.Pusher`: the service sends its weights."""
        return await asyncio.to_thread(self.service.push_weights, version, targets, flush=flush, exact=exact)


class ActorProxy:
    """``await proxy.name(*args)`` calls the actor method ``name`` and awaits its result."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    @property
    def handle(self) -> Any:
        return self._handle

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._handle, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await method.remote(*args, **kwargs)

        call.__name__ = name
        return call
