"""Packing training sequences into micro-batches and balancing them across data-parallel ranks.

A micro-batch is one packed row: its sequences are concatenated (no padding) and told apart by
``position_ids`` that restart at 0 for each sequence, which Hugging Face models turn into a
block-diagonal causal mask (the backend verifies this on start). The token budget bounds the row
length, so memory is bounded whatever the length distribution.

Planning is a pure function of the sequence lengths: every rank computes the same plan and takes
its share, so no coordination is needed. Ranks are balanced by tokens (greedy, longest first),
then each rank's sequences are bin-packed (first-fit or best-fit decreasing).

Because the reducer divides each token by its rollout's full denominator, the objective does not
depend on the plan (tested: three different packings give the same loss and gradients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from agentrl.token_data import Alignment, TokenChannel
from agentrl.train.batching import TrainSequence
from agentrl.train.config import PackingConfig

if TYPE_CHECKING:
    from agentrl.train.prefix import PrefixLayout

__all__ = ["ChannelRows", "MicroBatch", "collate", "pack_indices", "padding_micro_batch", "partition_for_ranks",
           "plan_micro_batches"]


def _check_lengths(lengths: Sequence[int], max_tokens: int) -> None:
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise ValueError(
                f"lengths[{i}]: a sequence of {n} input tokens does not fit max_tokens={max_tokens} "
                "(sequences are never split); raise PackingConfig.max_tokens or cap sequence length"
            )


def pack_indices(
    lengths: Sequence[int], max_tokens: int, algorithm: str = "best_fit_decreasing"
) -> list[list[int]]:
    """Bin-pack item indices by length into bins of at most ``max_tokens``; longest items first.

    Returns bins of indices (each bin sorted ascending), in order of creation. Deterministic.
    """
    _check_lengths(lengths, max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = lengths[i]
        choice = -1
        for b, room in enumerate(free):
            if room >= n and (choice < 0 or (algorithm == "best_fit_decreasing" and room < free[choice])):
                choice = b
                if algorithm == "first_fit_decreasing":
                    break
        if choice < 0:
            bins.append([])
            free.append(max_tokens)
            choice = len(bins) - 1
        bins[choice].append(i)
        free[choice] -= n
    return [sorted(b) for b in bins]


def partition_for_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Split item indices over ``world_size`` ranks, balancing total length (longest first, to the
    lightest rank). A rank may get nothing when there are fewer items than ranks."""
    if world_size < 1:
        raise ValueError(f"world_size: expected a positive integer, got {world_size!r}")
    loads = [0] * world_size
    parts: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        parts[rank].append(i)
        loads[rank] += lengths[i]
    return [sorted(p) for p in parts]


def plan_micro_batches(
    lengths: Sequence[int], config: PackingConfig, *, world_size: int = 1, rank: int = 0
) -> list[list[int]]:
    """This rank's micro-batches as lists of indices into ``lengths`` (input-token counts)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, got {rank!r}")
    _check_lengths(lengths, config.max_tokens)
    mine = partition_for_ranks(lengths, world_size)[rank]
    local = pack_indices([lengths[i] for i in mine], config.max_tokens, config.algorithm)
    return [[mine[j] for j in b] for b in local]


@dataclass
class ChannelRows:
    """One per-token channel of a micro-batch, in its packed layout: ``values`` ``[N, *row_shape]`` and
    ``present`` ``[N]`` (bool). A ``position`` channel (routing) is taken from each sequence's rows
    ``[:-1]`` (the inputs), a ``token`` channel (a logprob) from ``[1:]`` (the targets)."""

    values: torch.Tensor
    present: torch.Tensor

    @property
    def complete(self) -> bool:
        return bool(self.present.all())


# numpy dtypes torch has no tensor type for, and what they widen to
_TORCH_WIDEN = {"uint16": "int32"}


def _collate_channels(picked: Sequence[TrainSequence], device: torch.device | None) -> dict[str, ChannelRows]:
    names = sorted({name for s in picked for name in s.channels})
    out: dict[str, ChannelRows] = {}
    for name in names:
        spec = next(s.channels[name] for s in picked if name in s.channels)
        values, present = [], []
        for seq in picked:
            channel = seq.channels.get(name)
            n = len(seq.tokens) - 1
            if channel is None:  # this sequence has no such rows: absent throughout
                channel = TokenChannel(spec.dtype, spec.row_shape, length=len(seq.tokens), alignment=spec.alignment)
            elif (channel.dtype, channel.row_shape, channel.alignment) != (spec.dtype, spec.row_shape, spec.alignment):
                raise ValueError(f"channels[{name!r}]: sequences disagree on the channel's layout "
                                 f"({channel!r} and {spec!r}); expected one dtype, row shape and alignment")
            lo = 0 if channel.alignment is Alignment.POSITION else 1
            values.append(channel.values[lo: lo + n])
            present.append(channel.present[lo: lo + n])
        stacked = np.concatenate(values).astype(_TORCH_WIDEN.get(spec.dtype, spec.dtype), copy=False)
        out[name] = ChannelRows(values=torch.from_numpy(np.ascontiguousarray(stacked)).to(device),
                                present=torch.from_numpy(np.concatenate(present)).to(device))
    return out


@dataclass
class MicroBatch:
    """One packed row, shifted for next-token scoring; every tensor is 1-D of length ``N``.

    Position ``p`` holds input token ``x_p`` and describes the prediction of ``x_{p+1}`` of the
    same sequence: ``target_ids``, ``loss_mask``, ``advantages``, the logprobs and ``denominators``
    all refer to that next token. The last token of each sequence is not an input.
    ``sequence_ids`` numbers the sequences of this row 0..k-1; ``indices`` are their batch indices.
    ``prefix``: when set, the scorer runs the sequences' shared prefix once (see
    :mod:`agentrl.train.prefix`); every tensor above keeps the packed layout either way.
    ``lengths``: each sequence's number of positions (what packed attention needs as Python ints;
    derived from ``sequence_ids`` when empty). ``trainable``: how many positions have loss mask 1
    (``None``: counted from ``loss_mask``). ``padding``: a stand-in row with nothing to train, run
    only so that every rank of a sharded model runs the same collectives (never scored or counted).
    ``channels``: the sequences' per-token side data in the packed layout (:class:`ChannelRows`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    target_ids: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    rollout_logprobs: torch.Tensor
    denominators: torch.Tensor
    sequence_ids: torch.Tensor
    indices: list[int]
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    prefix: PrefixLayout | None = None
    lengths: tuple[int, ...] = ()
    trainable: int | None = None
    padding: bool = False
    channels: dict[str, ChannelRows] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def document_lengths(self) -> tuple[int, ...]:
        """Positions per sequence, in row order."""
        if self.lengths:
            return self.lengths
        return tuple(torch.bincount(self.sequence_ids, minlength=len(self.indices)).tolist())

    @property
    def num_trainable(self) -> int:
        """Positions with loss mask 1 (from ``trainable`` when set: no device sync)."""
        if self.trainable is not None:
            return self.trainable
        return int((self.loss_mask != 0).sum())

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Cut a per-position tensor back into one piece per sequence (length ``len(tokens) - 1``)."""
        counts = torch.bincount(self.sequence_ids, minlength=len(self.indices)).tolist()
        return list(torch.split(values, counts))


def _shifted(seq: TrainSequence, name: str) -> list[float]:
    values = getattr(seq, name)
    return [float(v) for v in values[1:]]


def collate(sequences: Sequence[TrainSequence], indices: Sequence[int], *, dtype: torch.dtype = torch.float32,
            device: torch.device | None = None) -> MicroBatch:
    """Pack ``sequences[i] for i in indices`` into one :class:`MicroBatch` (float fields in ``dtype``)."""
    if not indices:
        raise ValueError("indices: expected at least one sequence for a micro-batch, got none")
    picked = [sequences[i] for i in indices]
    inputs: list[int] = []
    positions: list[int] = []
    targets: list[int] = []
    seq_ids: list[int] = []
    for k, seq in enumerate(picked):
        n = len(seq.tokens) - 1
        inputs += seq.tokens[:-1]
        targets += seq.tokens[1:]
        positions += list(range(n))
        seq_ids += [k] * n
    with_old = all(s.old_logprobs is not None for s in picked)
    with_ref = all(s.ref_logprobs is not None for s in picked)

    def floats(name: str) -> torch.Tensor:
        return torch.tensor([v for s in picked for v in _shifted(s, name)], dtype=dtype, device=device)

    return MicroBatch(
        input_ids=torch.tensor(inputs, dtype=torch.long, device=device),
        position_ids=torch.tensor(positions, dtype=torch.long, device=device),
        target_ids=torch.tensor(targets, dtype=torch.long, device=device),
        loss_mask=floats("loss_mask"),
        advantages=floats("advantages"),
        rollout_logprobs=floats("rollout_logprobs"),
        denominators=torch.tensor([s.denominator for s in picked for _ in range(len(s.tokens) - 1)],
                                  dtype=dtype, device=device),
        sequence_ids=torch.tensor(seq_ids, dtype=torch.long, device=device),
        indices=list(indices),
        old_logprobs=floats("old_logprobs") if with_old else None,
        ref_logprobs=floats("ref_logprobs") if with_ref else None,
        lengths=tuple(len(s.tokens) - 1 for s in picked),
        trainable=sum(1 for s in picked for m in s.loss_mask[1:] if m),
        channels=_collate_channels(picked, device),
    )


def padding_micro_batch(*, dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> MicroBatch:
    """A one-position row with nothing to train (``padding=True``): ranks of a sharded model that
    have fewer micro-batches than others run it so that every rank runs the same collectives."""
    zeros = torch.zeros(1, dtype=dtype, device=device)
    ids = torch.zeros(1, dtype=torch.long, device=device)
    return MicroBatch(input_ids=ids, position_ids=ids.clone(), target_ids=ids.clone(), loss_mask=zeros,
                      advantages=zeros.clone(), rollout_logprobs=zeros.clone(), denominators=torch.ones_like(zeros),
                      sequence_ids=ids.clone(), indices=[], old_logprobs=zeros.clone(), ref_logprobs=zeros.clone(),
                      lengths=(1,), trainable=0, padding=True)
