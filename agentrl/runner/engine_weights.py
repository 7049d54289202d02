"""The rollout side's weight loader of a run: a :class:`~agentrl.runner.weights.WeightSync` over the
engine group, by the run's ``sync.method``.

- ``disk``: the trainer (maybe in another process) writes version *v* into a staging folder
  ``root/.export-v000003``; the sync's export step moves its files into the version folder (a rename
  on the same disk), then every engine in rotation loads it.
- ``tensor`` / ``distributed``: the trainer sends its weights itself, through the
  :class:`~agentrl.runner.weight_transports.Pusher` the runner gives :meth:`EngineWeights.set_pusher`
  once both sides run; nothing is written.

:meth:`resync` gives a restarted engine the current version before it serves again: from the
version's folder (``disk``), or pushed by the trainer while its weights still are that version;
when they moved on (an asynchronous run trains while engines generate), the engine waits on
standby and the next sync brings it up to date and readmits it.

A LoRA run (``adapter_switch``: the client's :meth:`~agentrl.rollout.InferenceClient.set_adapter`)
syncs its adapter alone (:class:`~agentrl.runner.weight_transports.AdapterLoad`), by the same methods
but ``distributed``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.runner.weight_transports import AdapterLoad, Pusher, PushLoad, WeightsMovedError
from agentrl.runner.weights import WeightSync

if TYPE_CHECKING:
    from agentrl.rollout.engine import SGLangEngine
    from agentrl.rollout.health import EngineGroup
    from agentrl.runner.weight_push import PushTarget

__all__ = ["EngineWeights"]


class EngineWeights:
    """The engines' :class:`~agentrl.runner.rollout_service.WeightLoader` (see the module doc)."""

    def __init__(self, sync: WeightSync, group: EngineGroup | None = None, wait_s: float = 600.0, *,
                 method: str = "disk", bucket_bytes: int = 512 << 20,
                 adapter_switch: Callable[[str, int], None] | None = None) -> None:
        self.sync = sync
        self.group = group
        self.wait_s = wait_s
        self.method = method
        self.bucket_bytes = bucket_bytes
        self._tag = secrets.token_hex(4)  # weight-update group names unique to this run
        # a LoRA run: only the adapter travels; the client follows each version it loads
        self.adapter_switch = adapter_switch
        if adapter_switch is not None and method == "disk":
            self.sync.transport = AdapterLoad("disk", switch=adapter_switch)

    def folder(self, version: int) -> Path:
        return self.sync.root / f".export-{self.sync.folder(version).name}"

    def set_pusher(self, pusher: Pusher) -> None:
        """The trainer's sender, for ``tensor`` and ``distributed`` (a no-op for ``disk``)."""
        if self.method == "disk":
            return
        if self.adapter_switch is not None:
            self.sync.transport = AdapterLoad(self.method, switch=self.adapter_switch, pusher=pusher, target=self.target)
        else:
            self.sync.transport = PushLoad(self.method, pusher, self.target)

    def target(self, engine: SGLangEngine) -> PushTarget:
        """The engine as the trainer's pusher addresses it: TP size, node, and a group name of its own
        (new after each restart: the old group died with the engine)."""
        from agentrl.runner.weight_push import PushTarget

        tp = engine.config.tp_size if engine.config is not None else 1
        return PushTarget(url=engine.url, tp_size=tp, node=getattr(engine.process, "node", None),
                          group=f"agentrl-{self._tag}-{engine.url.rsplit(':', 1)[-1]}-r{engine.restarts}")

    async def resync(self, engine: SGLangEngine) -> bool:
        """The current version into a restarted engine: True when it holds it (back into rotation),
        False when the trainer's weights moved on (standby until the next sync)."""
        try:
            await self.sync.load_current(engine)
        except WeightsMovedError:
            return False
        return True

    async def load(self, version: int, folder: Path) -> dict[str, float]:
        if self.group is not None:  # every engine is being restarted: wait for one (it then gets this version)
            await self.group.wait_any_in_rotation(self.wait_s, standby=True)
        if self.method == "disk":
            if not folder.is_dir():
                raise FileNotFoundError(f"weight sync v{version}: the trainer did not write {str(folder)!r}")

            def move(target: Path) -> None:
                for item in folder.iterdir():
                    item.rename(target / item.name)
                folder.rmdir()

            report = await self.sync.sync(version, move)
        else:
            if not isinstance(self.sync.transport, (PushLoad, AdapterLoad)):
                raise RuntimeError(f"sync.method={self.method!r}: the trainer's pusher was not set (set_pusher)")
            report = await self.sync.sync(version)
        if self.group is not None:  # engines on standby that took this version serve again
            for engine in [e for e in self.sync.engines if e.url in report.engines_updated]:
                if self.group.on_standby(engine):
                    await self.group.readmit(engine)
        metrics: dict[str, Any] = report.to_metrics()
        return metrics
