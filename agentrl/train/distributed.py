"""Thin helpers over ``torch.distributed`` for data parallelism (gloo, NCCL or HCCL).

The backends do not wrap the model in DDP: each rank accumulates the gradient of its share of the
step objective (already divided by the *global* counts), then one summing all-reduce per
parameter gives every rank the full-batch gradient. That keeps ranks with a different number of
micro-batches, or none at all, correct and hang-free: every rank runs the same collectives.

Example::

    store = host_tcp_store(world_size, timeout_s=120)       # the launcher, before it starts the ranks
    init_process_group(rank, world_size, store.port, device, hosted=True)   # each rank; Ray sets up its own
    info = DistInfo.current()
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from agentrl.train.device import distributed_backend

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore

_BUCKET_NUMEL = 32 * 1024 * 1024

__all__ = ["DistInfo", "all_reduce_gradients", "all_reduce_sum", "barrier", "host_tcp_store", "init_process_group"]


@dataclass(frozen=True)
class DistInfo:
    """This process's rank and the world size (0 / 1 when torch.distributed is not initialised)."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def current(cls) -> DistInfo:
        if dist.is_available() and dist.is_initialized():
            return cls(rank=dist.get_rank(), world_size=dist.get_world_size())
        return cls()


def host_tcp_store(world_size: int, timeout_s: float) -> TCPStore:
    """The master TCP store of a ``world_size`` process group, listening on every interface of this
    host on a port the OS picks as it binds (``store.port``; the other ranks connect to it with
    ``TCPStore(address, port, world_size, is_master=False)``). Picking a free port first and binding
    it later races with every other process on the host: one that takes the port in between fails
    the group with EADDRINUSE."""
    from torch._C._distributed_c10d import TCPStore

    return TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=timedelta(seconds=timeout_s),
                    wait_for_workers=False)


def init_process_group(
    rank: int, world_size: int, port: int, device: torch.device, *, timeout_s: float = 120.0, hosted: bool = False,
    address: str = "127.0.0.1",
) -> None:
    """Join a process group rendezvousing on ``address:port`` with the device's backend.

    ``hosted``: the launcher holds the group's store on ``port`` (:func:`host_tcp_store`,
    bound before the ranks start), and every rank joins it as a client. Without it rank 0 binds ``port``
    itself when it gets here; a port the launcher found free seconds earlier may by then be taken by
    another process (an outgoing connection's ephemeral port, another server), and the group fails with
    EADDRINUSE.
    """
    os.environ.setdefault("MASTER_ADDR", address)
    os.environ["MASTER_PORT"] = str(port)
    timeout = timedelta(seconds=timeout_s)
    backend = distributed_backend(device)
    if hosted:
        from torch._C._distributed_c10d import TCPStore

        store = TCPStore(address, port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, store=store, timeout=timeout)
        return
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                            init_method=f"tcp://{address}:{port}", timeout=timeout)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks (a no-op in a single process). Returns ``tensor``."""
    if DistInfo.current().world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_gradients(parameters: Iterable[torch.Tensor]) -> None:
    """Give every trainable parameter a gradient (zeros if it had none) and sum them over ranks.

    Filling missing gradients keeps the collectives identical on every rank, so a rank whose
    micro-batches touched no parameter (or that had no micro-batch) cannot hang the others.
    """
    params = [p for p in parameters if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if DistInfo.current().world_size == 1:
        return
    # Coalesce into flat buckets per dtype: few collectives, bounded extra memory.
    buckets: list[list[torch.Tensor]] = []
    current: dict[torch.dtype, list[torch.Tensor]] = {}
    sizes: dict[torch.dtype, int] = {}
    for p in params:
        assert p.grad is not None
        bucket = current.setdefault(p.dtype, [])
        bucket.append(p.grad)
        sizes[p.dtype] = sizes.get(p.dtype, 0) + p.grad.numel()
        if sizes[p.dtype] >= _BUCKET_NUMEL:
            buckets.append(current.pop(p.dtype))
            sizes[p.dtype] = 0
    buckets.extend(current.values())
    for grads in buckets:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()


def barrier() -> None:
    """Wait for all ranks (a no-op in a single process)."""
    if DistInfo.current().world_size > 1:
        dist.barrier()
