"""One engine's host on its node: the Ray actor that starts the engine's SGLang server there, with
exactly the engine's devices visible.

A run on Ray places one :class:`EngineHost` per engine on the engine's bundle (it reserves the
engine's ``tp × dp`` accelerators, so Ray names them to it and no other actor gets them). The
rollout actor (scheduler, router, client) starts, restarts and stops each engine through its
host's :class:`HostStarter`, which fits :class:`~agentrl.rollout.engine.EngineStarter`; the engine
then serves on the host's node at ``127.0.0.1`` when that is the rollout actor's node, else on the
node's address.

What the host adds to the engine's config (:meth:`EngineHost.engine_config`): the visible-devices
variable (``CUDA_VISIBLE_DEVICES`` / ``ASCEND_RT_VISIBLE_DEVICES``) naming its devices,
``--base-gpu-id 0 --gpu-id-step 1`` (SGLang's rank *r* then runs on the *r*-th visible device), and
the CPU plan's pinning on a CPU machine. It also reads its devices' memory and checks that a folder
the trainer wrote is visible on its node (disk weight sync needs a filesystem both can read).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agentrl.rollout.engine import EngineConfig, SGLangEngine
from agentrl.runner.devices import visible_devices_env
from agentrl.runner.placement import ACCELERATOR_RESOURCES

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

    from agentrl.runner.cpu import CpuPlan

T = TypeVar("T")

__all__ = ["EngineHost", "HostProcess", "HostStarter"]


class EngineHost:
    """Starts and owns engine ``index``'s server on this node (see the module doc)."""

    def __init__(self, accelerator: str, index: int, cpu: CpuPlan | None = None) -> None:
        self.accelerator = accelerator
        self.index = index
        self.cpu = cpu
        self.engine: SGLangEngine | None = None

    def where(self) -> dict[str, Any]:
        """This host's node id and address, and the accelerator ids Ray gave it (``[]`` on CPU)."""
        import ray

        context = ray.get_runtime_context()
        resource = ACCELERATOR_RESOURCES.get(self.accelerator)
        devices = [str(d) for d in context.get_accelerator_ids().get(resource, [])] if resource else []
        return {"node": str(context.get_node_id()), "ip": ray.util.get_node_ip_address(), "devices": devices,
                "pid": os.getpid()}

    def engine_config(self, config: EngineConfig, host: str) -> EngineConfig:
        """``config`` as this host starts it: bound to ``host``, with exactly its devices visible."""
        devices = self.where()["devices"]
        if self.accelerator == "cpu":
            return dataclasses.replace(config, host=host)
        env = {**config.env, **visible_devices_env(self.accelerator, devices)}
        return dataclasses.replace(config, host=host, env=env, base_gpu_id=0, gpu_id_step=1)

    async def launch(self, config: EngineConfig, port: int | None, host: str) -> tuple[str, int]:
        """Starts the engine (again, after a stop) and waits until it is healthy: ``(url, pid)``."""
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop)
        self.engine = await SGLangEngine.launch(dataclasses.replace(self.engine_config(config, host), port=port))
        assert self.engine.process is not None
        if self.cpu is not None:  # SGLang binds its threads itself only on AMX/arm64: pin the engine's tree
            self.cpu.pin(self.index, self.engine.process.pid)
        return self.engine.url, self.engine.process.pid

    def alive(self) -> bool:
        return self.engine is not None and self.engine.alive()

    def returncode(self) -> int | None:
        process = self.engine.process if self.engine is not None else None
        return process.returncode() if process is not None else None

    def stop(self) -> None:
        """Stops the engine's process tree (idempotent)."""
        if self.engine is not None:
            self.engine.stop()

    def kill_engine(self) -> None:
        """SIGKILL the engine's tree at once (what a crash looks like; used by failure tests)."""
        from agentrl.rollout.process import ManagedProcess

        if self.engine is not None and isinstance(self.engine.process, ManagedProcess):
            self.engine.process.kill_now()

    def device_memory_bytes(self) -> int | None:
        """The smallest total memory of this host's devices (``None`` on CPU or when unreadable)."""
        if self.accelerator == "cpu" or not self.where()["devices"]:
            return None
        try:
            import torch

            module = getattr(torch, "cuda" if self.accelerator == "gpu" else "npu")
            count = module.device_count()
            return min(int(module.get_device_properties(i).total_memory) for i in range(count)) if count else None
        except Exception:  # a fake device (tests), a driver that does not answer: the config's figure is used
            return None

    def reads(self, path: str, token: str) -> bool:
        """Whether ``path`` exists on this node and holds ``token`` (the disk sync's marker)."""
        try:
            return Path(path).read_text(encoding="utf-8") == token
        except OSError:
            return False


class HostProcess:
    """:class:`~agentrl.rollout.engine.EngineProcess` of an engine started by an :class:`EngineHost`
    actor (calls block on the actor: run them off the event loop)."""

    def __init__(self, host: ActorHandle[EngineHost], pid: int, timeout_s: float = 60.0) -> None:
        self.host = host
        self._pid = pid
        self.timeout_s = timeout_s

    @property
    def pid(self) -> int:
        return self._pid

    def _get(self, ref: ObjectRef[T]) -> T:
        import ray

        return ray.get(ref, timeout=self.timeout_s)

    def alive(self) -> bool:
        try:
            return bool(self._get(self.host.alive.remote()))
        except Exception:  # the host actor itself is gone: so is the engine it owned
            return False

    def returncode(self) -> int | None:
        try:
            code: int | None = self._get(self.host.returncode.remote())
        except Exception:
            return None
        return None if code is None else int(code)

    def stop(self) -> None:
        try:
            self._get(self.host.stop.remote())
        except Exception:  # a dead host cannot stop anything; its node's reaper ends what it started
            pass


class HostStarter:
    """:class:`~agentrl.rollout.engine.EngineStarter` through an :class:`EngineHost` actor: the engine
    serves on ``bind_host`` (``127.0.0.1`` on the rollout actor's node, else the node's address)."""

    def __init__(self, host: ActorHandle[EngineHost], bind_host: str) -> None:
        self.host = host
        self.bind_host = bind_host

    async def start(self, config: EngineConfig, port: int | None) -> tuple[str, HostProcess]:
        url, pid = await self.host.launch.remote(config, port, self.bind_host)
        return str(url), HostProcess(self.host, int(pid))
