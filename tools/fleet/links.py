"""How the router reaches an executor: a :class:`ExecutorLink` per executor.

- :class:`RayLink`: an :class:`~agentrl.tools.fleet.executor.ExecutorActor` on a Ray node. A call
  whose actor is gone (``RayActorError``: the actor died, or its node did), or whose answer Ray lost
  (any other ``RayError``: the actor itself answers every call with a value) raises
  :class:`~agentrl.tools.fleet.errors.ExecutorLostError`; a call cancelled by its caller is cancelled
  in the actor too (``ray.cancel``), so the sandbox stops what it ran.
- :class:`LocalLink`: a :class:`~agentrl.tools.fleet.executor.SandboxExecutor` (or any object with its
  methods) in this process: the router's tests, and a fleet of in-process executors. ``lose()`` makes it
  behave as a dead actor.

Every link answers ``call(method, *args, **kwargs)`` with the method's value (its exception re-raised)
and the seconds it took inside the executor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Protocol

from agentrl.tools.fleet.errors import ExecutorLostError
from agentrl.tools.fleet.executor import ExecutorActor, ExecutorSettings, Outcome

__all__ = ["ExecutorLink", "LocalLink", "RayLink", "start_ray_executor"]


class ExecutorLink(Protocol):
    """One executor as the router sees it (module doc)."""

    node: str

    async def call(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """``method(*args, **kwargs)`` on the executor: its value and the seconds it ran there."""
        ...

    def kill(self) -> None:
        """Stops the executor without waiting for it (its processes go with it)."""
        ...


class LocalLink:
    """An executor object in this process (module doc)."""

    def __init__(self, executor: Any, node: str = "local") -> None:
        self.executor = executor
        self.node = node
        self.lost = False

    def lose(self) -> None:
        """From now on every call (and every call in flight) fails as if the executor died."""
        self.lost = True

    async def call(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        if self.lost:
            raise ExecutorLostError(f"the executor on node {self.node} is gone", node=self.node)
        started = time.perf_counter()
        value = await getattr(self.executor, method)(*args, **kwargs)
        if self.lost:
            raise ExecutorLostError(f"the executor on node {self.node} died during {method}", node=self.node)
        return value, time.perf_counter() - started

    def kill(self) -> None:
        self.lost = True


class RayLink:
    """An :class:`ExecutorActor` handle (module doc)."""

    def __init__(self, actor: Any, node: str) -> None:
        self.actor = actor
        self.node = node

    async def call(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        import ray

        ref = self.actor.call.remote(method, args, kwargs)
        try:
            outcome, inside_s = await ref
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except ray.exceptions.RayError as exc:  # the actor died (or its node), or its answer was lost
            raise ExecutorLostError(f"the executor on node {self.node} is gone ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})",
                                    node=self.node) from None
        assert isinstance(outcome, Outcome)
        return outcome.unwrap(), float(inside_s)

    def kill(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone with its node: nothing to stop
            pass


def start_ray_executor(index: int, node: str, settings: ExecutorSettings, *, max_concurrency: int,
                       env: Mapping[str, str] | None = None) -> RayLink:
    """Starts an :class:`ExecutorActor` on node ``node`` (hard node affinity, no CPU reserved: the
    sandboxes' CPU is the node's, limited by the sandbox's own limits) and returns its link. ``env``:
    variables set in the actor's process (Ray's ``runtime_env``; the sandboxes never see them). The
    caller waits for ``call("ready")`` with the fleet's start-up time-out."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(ExecutorActor).options(
        num_cpus=0, max_concurrency=max_concurrency, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        **({"runtime_env": {"env_vars": dict(env)}} if env else {})).remote(index, settings)
    return RayLink(actor, node)
