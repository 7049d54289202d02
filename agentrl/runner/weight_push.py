"""The trainer's side of a weight sync that does not go through disk: it sends its weights to the
engines itself, bucket by bucket, in ``model.dtype``.

- ``tensor`` (the engines on this trainer's host: colocated): each bucket is one flat buffer on the
  device (CUDA IPC handles, with SGLang's device-UUID reductions) or in shared host memory (CPU,
  torch's ``file_system`` sharing), serialized for ``/update_weights_from_tensor`` with one payload
  per TP rank (each rank loads full tensors and shards them itself). The buffer is reused: it is
  refilled only after the engine answered.
- ``distributed`` (anywhere): one process group per engine (this trainer as rank 0, the engine's TP
  ranks after it; an engine that fails does not take the others' group with it), joined on first
  use the way SGLang's ``init_custom_process_group`` builds its side; each bucket is broadcast while
  ``/update_weights_from_distributed`` waits for it (gloo on CPU, NCCL on GPU).

The rollout side pauses the engines and opens SGLang's update session before (``begin``), closes it
and checks each engine's version after; this module only moves the bytes. Every rank of the trainer
calls :meth:`WeightPusher.push` (a Megatron trainer gathers its shards collectively); rank 0 sends.
Per engine, the result is ``None`` (loaded) or the error.
"""

from __future__ import annotations

import asyncio
import base64
import io
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from agentrl.rollout.engine import EngineError, SGLangEngine
from agentrl.train.distributed import host_tcp_store
from agentrl.train.weight_stream import Bucket, WeightBuckets

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore

__all__ = ["PUSH_METHODS", "PushReport", "PushTarget", "WeightPusher", "push_adapter"]

PUSH_METHODS = ("tensor", "distributed")
GROUP_TIMEOUT_S = 1800.0  # SGLang's side of the group has this fixed timeout; the trainer's matches it


@dataclass(frozen=True)
class PushTarget:
    """One engine to send to: its URL, TP size, Ray node (``None``: this machine) and group name."""

    url: str
    tp_size: int = 1
    node: str | None = None
    group: str = ""


@dataclass
class PushReport:
    """Per engine ``None`` (loaded) or its error; bytes sent and seconds per phase (rank 0's)."""

    errors: dict[str, str | None] = field(default_factory=dict)
    bytes: int = 0
    buckets: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"errors": dict(self.errors), "bytes": self.bytes, "buckets": self.buckets,
                "timings": dict(self.timings)}


def _serialize(obj: object) -> str:
    """What SGLang's ``MultiprocessingSerializer.serialize(obj, output_str=True)`` writes: a
    ``ForkingPickler`` pickle (tensors travel as shared-memory files or CUDA IPC handles), base64."""
    from multiprocessing.reduction import ForkingPickler

    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return base64.b64encode(buf.getvalue()).decode("ascii")


async def push_adapter(tensors: dict[str, torch.Tensor], config: dict[str, Any], name: str,
                       targets: Sequence[PushTarget]) -> PushReport:
    """A LoRA adapter from tensors to engines on this host (``/load_lora_adapter_from_tensors``, one
    payload per TP rank): the tensors travel in shared host memory (file-system sharing: the default
    file-descriptor strategy kills the engine's scheduler). A name left loaded by an earlier try of the
    same version is unloaded first. Per engine ``None`` or its error."""
    torch.multiprocessing.set_sharing_strategy("file_system")
    started = time.perf_counter()
    shared = {k: v.detach().cpu().contiguous().share_memory_() for k, v in tensors.items()}
    payload = _serialize(shared)
    report = PushReport(errors={t.url: None for t in targets})
    prepared = time.perf_counter()

    async def one(target: PushTarget) -> None:
        engine = SGLangEngine(target.url, None, None)
        try:
            try:
                await engine.load_lora_adapter_from_tensors(name, config, [payload] * target.tp_size)
            except EngineError as err:
                if "already loaded" not in str(err):
                    raise
                await engine.unload_lora_adapter(name)
                await engine.load_lora_adapter_from_tensors(name, config, [payload] * target.tp_size)
        except EngineError as err:
            report.errors[target.url] = str(err)

    await asyncio.gather(*(one(t) for t in targets))
    nbytes = sum(t.numel() * t.element_size() for t in shared.values())
    report.bytes = nbytes * sum(1 for t in targets if report.errors[t.url] is None)
    report.timings = {"fill_s": prepared - started, "transfer_s": time.perf_counter() - prepared,
                      "push_s": time.perf_counter() - started}
    return report


def _this_node() -> str | None:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else None
    except Exception:  # not in a Ray process
        return None


class WeightPusher:
    """Sends a backend's weights to engines (see the module doc). One per trainer rank; not thread-safe.

    ``named_weights``: the backend's (every rank iterates it); ``rank``: this trainer rank (0 sends);
    ``device``: where the weights live (``cpu``: shared memory and gloo; ``cuda``: IPC and NCCL).
    """

    def __init__(self, named_weights: Callable[[], Iterable[tuple[str, torch.Tensor]]], *, method: str,
                 dtype: torch.dtype | None, bucket_bytes: int, device: torch.device, rank: int = 0) -> None:
        if method not in PUSH_METHODS:
            raise ValueError(f"WeightPusher(method={method!r}): expected one of {', '.join(PUSH_METHODS)}")
        self.method, self.rank, self.device = method, rank, device
        shared = method == "tensor" and device.type == "cpu"
        self.buckets = WeightBuckets(named_weights, dtype=dtype, bucket_bytes=bucket_bytes, device=device,
                                     shared=shared)
        self.groups: dict[str, Any] = {}  # group name (one per engine incarnation) -> this side of it
        self.flush = True
        if method == "tensor":
            self._prepare_tensor_sharing()

    def _prepare_tensor_sharing(self) -> None:
        if self.device.type == "cpu":
            # the default file_descriptor strategy makes the engine's scheduler die ("digest sent was
            # rejected"): tensors travel as named shared-memory files instead
            torch.multiprocessing.set_sharing_strategy("file_system")
        elif self.device.type == "cuda":
            from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

            monkey_patch_torch_reductions()  # device UUIDs, not indices: the engine sees other devices

    # -- the push -------------------------------------------------------------------------------------
    def push(self, version: int, targets: Sequence[PushTarget], *, flush: bool = True) -> PushReport:
        """Sends every bucket to every target; returns the outcome per engine (rank 0; other ranks
        only take part in the gather and return an empty report). ``flush``: the engines flush their
        prefix cache with the last bucket (not while requests stay in the running batch)."""
        self.flush = flush
        return asyncio.run(self._push(version, list(targets)))

    async def _push(self, version: int, targets: list[PushTarget]) -> PushReport:
        report = PushReport(errors={t.url: None for t in targets})
        started = time.perf_counter()
        timings = {"fill_s": 0.0, "transfer_s": 0.0, "setup_s": 0.0}
        if self.rank != 0:
            for _ in self.buckets.named_weights():  # take part in a collective gather (Megatron); no buffer
                pass
            return PushReport()
        live = list(targets)
        if self.method == "distributed":
            t0 = time.perf_counter()
            live = await self._join_groups(live, report)
            timings["setup_s"] = time.perf_counter() - t0
        engines = {t.url: SGLangEngine(t.url, None, None) for t in live}
        count = 0
        for bucket in self.buckets.fill():
            count += 1
            timings["fill_s"] += bucket.timings["fill_s"]
            live = [t for t in live if report.errors[t.url] is None]
            if not live:
                continue
            t0 = time.perf_counter()
            last = self.flush and bucket.index == len(self.buckets.layout or []) - 1
            if self.method == "tensor":
                await self._send_tensor(bucket, live, engines, str(version), last, report)
            else:
                await self._send_distributed(bucket, live, engines, str(version), last, report)
            timings["transfer_s"] += time.perf_counter() - t0
            report.bytes += bucket.nbytes * len(live)
        report.buckets = count
        timings["push_s"] = time.perf_counter() - started
        report.timings = timings
        return report

    async def _send_tensor(self, bucket: Bucket, targets: list[PushTarget], engines: dict[str, SGLangEngine],
                           version: str, last: bool, report: PushReport) -> None:
        metadata = [SimpleNamespace(name=e.name, shape=torch.Size(e.shape), dtype=e.dtype, start_idx=e.start,
                                    end_idx=e.end, numel=e.end - e.start) for e in bucket.entries]
        payload = _serialize({"flattened_tensor": bucket.flat, "metadata": metadata})

        async def one(target: PushTarget) -> None:
            try:
                await engines[target.url].update_weights_from_tensor(
                    [payload] * target.tp_size, version, load_format="flattened_bucket", flush_cache=last)
            except EngineError as err:
                report.errors[target.url] = str(err)

        await asyncio.gather(*(one(t) for t in targets))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    async def _send_distributed(self, bucket: Bucket, targets: list[PushTarget],
                                engines: dict[str, SGLangEngine], version: str, last: bool,
                                report: PushReport) -> None:
        names = [e.name for e in bucket.entries]
        dtypes = [e.dtype_name for e in bucket.entries]
        shapes = [list(e.shape) for e in bucket.entries]

        async def receive(target: PushTarget) -> None:
            try:
                await engines[target.url].update_weights_from_distributed(
                    names, dtypes, shapes, target.group, version, flush_cache=last, load_format="flattened_bucket")
            except EngineError as err:
                report.errors[target.url] = str(err)

        replies = [asyncio.ensure_future(receive(t)) for t in targets]
        for target in targets:  # the engine allocates its receive buffer on the request, then joins
            try:
                await asyncio.to_thread(torch.distributed.broadcast, bucket.flat, 0, self.groups[target.group])
            except Exception as err:  # a peer gone mid-broadcast: that engine holds a mix now
                report.errors[target.url] = f"broadcast failed: {type(err).__name__}: {err}"
        await asyncio.gather(*replies)

    # -- process groups ------------------------------------------------------------------------------
    async def _join_groups(self, targets: list[PushTarget], report: PushReport) -> list[PushTarget]:
        """Joins the group of every target not joined yet (the engine's HTTP init and this side's
        rendezvous at once); a target whose group fails is reported and dropped."""
        new = [t for t in targets if t.group not in self.groups]
        await asyncio.gather(*(self._join(t, report) for t in new))
        return [t for t in targets if t.group in self.groups]

    async def _join(self, target: PushTarget, report: PushReport) -> None:
        here = _this_node()
        address = "127.0.0.1" if target.node is None or target.node == here else _node_ip()
        backend = "gloo" if self.device.type == "cpu" else ("hccl" if self.device.type == "npu" else "nccl")
        engine = SGLangEngine(target.url, None, None)
        world = 1 + target.tp_size
        # this side hosts the group's store, bound before the engine is told its port
        store = host_tcp_store(world, GROUP_TIMEOUT_S)
        init = asyncio.ensure_future(engine.init_weights_update_group(address, store.port, 1, world, target.group,
                                                                      backend))
        try:
            group = await asyncio.to_thread(join_group, backend, store, world, target.group)
            await init
        except Exception as err:  # the engine refused, or the rendezvous timed out
            init.cancel()
            report.errors[target.url] = f"joining weight-update group {target.group!r} failed: {type(err).__name__}: {err}"
            return
        self.groups[target.group] = group

    def forget(self, name: str) -> None:
        """Drops this side of group ``name`` (its engine died: a restarted one joins a new group)."""
        group = self.groups.pop(name, None)
        if group is not None:
            try:
                torch.distributed.destroy_process_group(group)
            except Exception:  # a group whose peer died may not tear down cleanly
                pass


def _node_ip() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # outside Ray: this host's outward address
        return socket.gethostbyname(socket.gethostname())


def join_group(backend: str, store: TCPStore, world_size: int,
               name: str) -> torch.distributed.ProcessGroup:
    """This process as rank 0 of ``name`` on the master ``store`` it hosts (:func:`host_tcp_store`),
    built as SGLang's ``init_custom_process_group`` builds the engine's side (a ``PrefixStore`` named
    after the group, no default group needed)."""
    from torch.distributed.distributed_c10d import (
        Backend,
        GroupName,
        PrefixStore,
        _new_process_group_helper,
        _world,
    )

    timeout = timedelta(seconds=GROUP_TIMEOUT_S)
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(world_size, 0, [], Backend(backend), PrefixStore(name, store),
                                         group_name=GroupName(name), timeout=timeout)
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    made: torch.distributed.ProcessGroup = group
    return made

