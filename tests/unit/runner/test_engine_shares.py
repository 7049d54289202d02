"""Colocated on accelerators, the engines' memory share is computed from the devices' memory as one engine
host per node reads it (each read imports torch in that actor), the smallest node's figure winning."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.runner import RunConfig
from agentrl.runner.device_plan import trainer_resident_bytes
from agentrl.runner.devices import GIB, colocated_shares
from agentrl.runner.ray_run import _engine_shares
from agentrl.testing import build_tiny_model


class _Method:
    def __init__(self, fn: Callable[[], Awaitable[Any]]) -> None:
        self.fn = fn

    def remote(self) -> Awaitable[Any]:  # what an actor handle's method gives: something to await
        return self.fn()


class _Host:
    def __init__(self, node: str, memory_gib: float | None) -> None:
        self.node, self.memory, self.reads = node, memory_gib, 0
        self.where = _Method(self._where)
        self.device_memory_bytes = _Method(self._read)

    async def _where(self) -> dict[str, Any]:
        return {"node": self.node, "devices": ["0"]}

    async def _read(self) -> int | None:
        self.reads += 1
        return None if self.memory is None else int(self.memory * GIB)


def _config(placement: str = "colocated", **cluster: Any) -> RunConfig:
    return RunConfig.from_dict({"model": {"path": str(build_tiny_model())}, "data": {"train": {"path": "rows.jsonl"}},
                                "environment": {"name": "toy_arithmetic"},
                                "cluster": {"placement": placement, "accelerator": "gpu", **cluster}})


def test_one_host_per_node_reads_and_the_smallest_node_sets_the_share() -> None:
    config = _config()
    hosts = [_Host("a", 141), _Host("a", 141), _Host("b", 80), _Host("b", 80), _Host("a", 141)]
    shares = asyncio.run(_engine_shares(config, hosts))
    assert [h.reads for h in hosts] == [1, 0, 1, 0, 0]
    resident = trainer_resident_bytes(config)
    assert resident is not None and shares == colocated_shares(80 * GIB, resident)


def test_no_reading_falls_back_to_the_configured_memory_and_disaggregated_reads_nothing() -> None:
    hosts = [_Host("a", None), _Host("b", None)]
    config = _config(accelerator_memory_gib=24)
    resident = trainer_resident_bytes(config)
    assert resident is not None
    assert asyncio.run(_engine_shares(config, hosts)) == colocated_shares(24 * GIB, resident)
    assert asyncio.run(_engine_shares(_config(), hosts)) is None  # nothing read, nothing configured
    apart = [_Host("a", 80)]
    assert asyncio.run(_engine_shares(_config("disaggregated"), apart)) is None and apart[0].reads == 0
