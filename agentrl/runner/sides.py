"""Adapters that give the runner one async interface to each side, wherever it runs.

- :class:`LocalTrainer`: a :class:`~agentrl.runner.trainer.TrainService` in this process; each
  :class:`~agentrl.runner.loop.TrainSide` method runs the service's method of that name in a worker
  thread, so the event loop (and the rollouts of the async modes) keeps going.
- :class:`ActorProxy`: any Ray actor handle; ``await proxy.method(...)`` is
  ``await handle.method.remote(...)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agentrl.runner._forward import Forwarded, forwards, protocol_methods
from agentrl.runner._interfaces import TrainSide

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from agentrl.runner.trainer import TrainService
    from agentrl.runner.weight_push import PushTarget

__all__ = ["ActorProxy", "LocalTrainer"]


def _in_thread(name: str) -> Callable[..., Awaitable[object]]:
    async def method(self: LocalTrainer, *args: Any, **kwargs: Any) -> object:
        return await asyncio.to_thread(getattr(self.service, name), *args, **kwargs)

    return method


@forwards(protocol_methods(TrainSide), _in_thread)
class LocalTrainer(Forwarded):
    """The trainer side in-process (one rank): a :class:`~agentrl.runner.loop.TrainSide`, and the
    :class:`~agentrl.runner.weight_transports.Pusher` of ``sync.method`` tensor or distributed."""

    def __init__(self, service: TrainService) -> None:
        self.service = service

    async def push(self, version: int, targets: list[PushTarget], *, flush: bool, exact: bool) -> dict[str, Any]:
        """:class:`~agentrl.runner.weight_transports.Pusher`: the service sends its weights."""
        return await asyncio.to_thread(self.service.push_weights, version, targets, flush=flush, exact=exact)


class ActorProxy:
    """``await proxy.name(*args)`` calls the actor method ``name`` and awaits its result."""

    def __init__(self, handle: ActorHandle[Any]) -> None:
        self._handle = handle

    @property
    def handle(self) -> ActorHandle[Any]:
        return self._handle

    def __getattr__(self, name: str) -> Callable[..., Awaitable[object]]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._handle, name)

        async def call(*args: Any, **kwargs: Any) -> object:
            return await method.remote(*args, **kwargs)

        call.__name__ = name
        return call
