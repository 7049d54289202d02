"""A trainer's weights as flat byte buckets, for weight updates that do not go through disk.

SGLang loads a "flattened bucket": one ``uint8`` tensor holding many weights back to back, with
per-weight metadata (name, shape, dtype, byte range). :class:`WeightBuckets` lays a backend's
weights out that way once (Hugging Face names, as the backend yields them; a tied weight once, under
its first name; every weight in the export dtype), then fills **one reused buffer** per bucket, one
bucket at a time (building a fresh 1 GB bucket each sync cost ~2 s on CPU; a buffer refilled in
place ~0.1 s). The buffer lives on the trainer's device, or in shared host memory
(``shared=True``: the CPU engine maps it through torch's ``file_system`` sharing, with no copy).

A bucket is only refilled after its consumer is done with it (the caller waits for the engine's
reply before asking for the next): reusing a buffer the engine still reads would corrupt weights.

Example::

    buckets = WeightBuckets(backend.named_weights, dtype=torch.bfloat16, bucket_bytes=512 << 20,
                            device=backend.device)
    for bucket in buckets.fill():          # the same buffer each time, refilled
        send(bucket.flat, bucket.entries)
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

__all__ = ["Bucket", "BucketEntry", "WeightBuckets", "quiet_shm_manager"]


@dataclass(frozen=True)
class BucketEntry:
    """One weight in a bucket: its name, shape, dtype and byte range in the flat buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    start: int
    end: int

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


@dataclass
class Bucket:
    """A filled bucket: ``flat`` (the reused buffer, ``nbytes`` long) and its ``entries``."""

    index: int
    flat: torch.Tensor
    entries: tuple[BucketEntry, ...]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return self.entries[-1].end if self.entries else 0


class WeightBuckets:
    """Buckets of at most ``bucket_bytes`` (a weight larger than that gets a bucket of its own).

    ``named_weights``: called at each :meth:`fill` (a backend's ``named_weights``; for Megatron every
    rank must iterate it, since it gathers shards collectively). ``dtype``: the export dtype
    (``None``: each weight's own). Not thread-safe.
    """

    def __init__(self, named_weights: Callable[[], Iterable[tuple[str, torch.Tensor]]], *,
                 dtype: torch.dtype | None, bucket_bytes: int, device: torch.device | str = "cpu",
                 shared: bool = False) -> None:
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"WeightBuckets(bucket_bytes={bucket_bytes!r}): expected an int >= 1")
        self.named_weights = named_weights
        self.dtype = dtype
        self.bucket_bytes = bucket_bytes
        self.device = torch.device(device)
        self.shared = shared
        self.layout: list[tuple[BucketEntry, ...]] | None = None
        self._buffer: torch.Tensor | None = None

    @property
    def total_bytes(self) -> int:
        return sum(b[-1].end for b in self.layout or [] if b)

    def _plan(self, weights: list[tuple[str, torch.Tensor]]) -> list[tuple[BucketEntry, ...]]:
        buckets: list[tuple[BucketEntry, ...]] = []
        current: list[BucketEntry] = []
        offset = 0
        for name, tensor in weights:
            dtype = self.dtype or tensor.dtype
            size = tensor.numel() * dtype.itemsize
            offset += -offset % dtype.itemsize  # SGLang refuses a weight not aligned to its dtype
            if current and offset + size > self.bucket_bytes:
                buckets.append(tuple(current))
                current, offset = [], 0
            current.append(BucketEntry(name, tuple(tensor.shape), dtype, offset, offset + size))
            offset += size
        if current:
            buckets.append(tuple(current))
        if not buckets:
            raise ValueError("WeightBuckets: the backend yielded no weights")
        return buckets

    def _buffer_for(self, nbytes: int) -> torch.Tensor:
        if self._buffer is None or self._buffer.numel() < nbytes:
            largest = max(b[-1].end for b in self.layout or [()] if b)
            buffer = torch.empty(max(largest, nbytes), dtype=torch.uint8, device=self.device)
            if self.shared:
                with quiet_shm_manager():
                    buffer.share_memory_()
            self._buffer = buffer
        return self._buffer

    def fill(self) -> Iterator[Bucket]:
        """Yields every bucket filled with the current weights, in the same buffer each time (use a
        bucket before taking the next). The first call also fixes the layout; a later call whose
        weights differ in names or shapes raises ``ValueError``."""
        seen: dict[tuple[int, int], str] = {}  # (storage address, offset) -> the first name
        weights: list[tuple[str, torch.Tensor]] = []
        for name, tensor in self.named_weights():
            key = ((tensor.untyped_storage().data_ptr(), int(tensor.storage_offset())) if tensor.numel()
                   else (0, id(tensor)))
            if key in seen and seen[key] != name:
                continue  # a tied weight (lm_head = embed_tokens): the engine ties it itself
            seen[key] = name
            weights.append((name, tensor))
        if self.layout is None:
            self.layout = self._plan(weights)
        by_name = dict(weights)
        for index, entries in enumerate(self.layout):
            t0 = time.perf_counter()
            flat = self._buffer_for(entries[-1].end)[: entries[-1].end]
            for entry in entries:
                found = by_name.get(entry.name)
                if found is None or tuple(found.shape) != entry.shape:
                    raise ValueError(f"WeightBuckets: weight {entry.name!r} is missing or changed shape since the "
                                     f"layout was made ({entry.shape}); expected the same model")
                target = flat[entry.start:entry.end].view(entry.dtype).view(entry.shape)
                target.copy_(found.detach(), non_blocking=False)
            yield Bucket(index, flat, entries, {"fill_s": time.perf_counter() - t0})


@contextlib.contextmanager
def quiet_shm_manager() -> Iterator[None]:
    """Runs the block with stdout and stderr pointed at ``/dev/null`` at the descriptor level, so
    that torch's ``torch_shm_manager`` helper (started by the first ``file_system`` shared-memory
    allocation, and alive as long as the memory is mapped) does not inherit and hold open this
    process's output: a parent that captures it would wait for the engine to stop."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)
