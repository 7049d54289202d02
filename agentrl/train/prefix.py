"""Shared-prefix micro-batches: a prompt that several sequences share is run once, not once per sequence.

The G sequences of a GRPO group start with the same prompt, and often every sequence of a step
starts with the same system prompt and tool listing. A micro-batch whose sequences share a
prefix of ``P`` tokens is scored in two passes (:meth:`agentrl.train.scoring.TokenScorer.scores`):

1. the prefix alone (one row of ``P`` tokens), keeping its per-layer keys and values;
2. the ``k`` suffixes as one right-padded batch (positions ``P, P+1, ...``) attending to the
   prefix's keys and values expanded over the batch, so the gradient of every suffix flows back
   into the one prefix computation.

The results are scattered back into the packed layout of :class:`~agentrl.train.packing.MicroBatch`
(one entry per position of each sequence), so the objective, the reducer and the metrics are the
same code as on the plain path and give the same numbers (tested to 1e-6 in float64). The logit
that predicts each sequence's first suffix token comes from the prefix's last position.

:func:`plan_shared_prefix_micro_batches` plans micro-batches so that sequences sharing a prefix
land together: sequences sorted by their tokens put shared prefixes next to each other, and runs
of them form micro-batches whose cost counts the prefix once (``P + k·L``, with ``L`` the longest
suffix: the padded batch). Sequences that share nothing worth sharing are packed as before.

Example::

    plan = plan_shared_prefix_micro_batches([s.tokens for s in batch.sequences], PackingConfig(), min_prefix=32)
    layout = shared_prefix_layout([batch.sequences[i].tokens for i in plan[0]], min_prefix=32)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.train.config import PackingConfig
from agentrl.train.packing import _check_lengths, pack_indices, partition_for_ranks

__all__ = ["PrefixLayout", "common_prefix_length", "plan_shared_prefix_micro_batches", "shared_prefix_layout"]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class PrefixLayout:
    """How one micro-batch of ``k`` sequences is run as a shared prefix plus a padded suffix batch.

    Rows of the *source*: the prefix's ``P`` positions, then the suffix batch's ``k × L`` positions
    (row-major). ``source_targets`` is the token each source row predicts (prefix row ``P-1`` has
    one per sequence: ``first_targets``; padded rows predict token 0 and are never read).
    ``gather`` maps each position of the packed layout to an entry of
    ``cat(source scores, first-target scores)``.
    """

    prefix_len: int
    prefix_ids: torch.Tensor  # [P]
    suffix_ids: torch.Tensor  # [k, L], right-padded with token 0
    suffix_mask: torch.Tensor  # [k, L], 1 for real suffix tokens
    source_targets: torch.Tensor  # [P + k·L]
    first_targets: torch.Tensor  # [k]
    gather: torch.Tensor  # [N]

    @property
    def num_sequences(self) -> int:
        return int(self.suffix_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Tokens the two passes run: ``P + k·L`` (padding included)."""
        return self.prefix_len + int(self.suffix_ids.numel())

    def to(self, device: torch.device | None) -> PrefixLayout:
        if device is None:
            return self
        return PrefixLayout(self.prefix_len, *(t.to(device) for t in (
            self.prefix_ids, self.suffix_ids, self.suffix_mask, self.source_targets, self.first_targets,
            self.gather)))


def _shared_length(tokens: Sequence[Sequence[int]]) -> int:
    """The prefix the sequences can share: their common prefix, leaving every sequence at least one
    suffix input token (its last token is a target only, so ``P <= len - 2``)."""
    first = tokens[0]
    length = min(len(t) for t in tokens) - 2
    for other in tokens[1:]:
        length = min(length, common_prefix_length(first, other))
    return max(length, 0)


def _cost(prefix: int, lengths: Sequence[int]) -> int:
    """Tokens run by the shared path (prefix once, suffixes padded to the longest)."""
    return prefix + len(lengths) * max(n - 1 - prefix for n in lengths)


def shared_prefix_layout(
    tokens: Sequence[Sequence[int]], *, min_prefix: int, device: torch.device | None = None
) -> PrefixLayout | None:
    """The layout for running these sequences (in packed order) with a shared prefix, or None when
    the plain packed row is the better choice: fewer than two sequences, a common prefix shorter
    than ``min_prefix``, or no saving in tokens run (one long suffix padding all the others)."""
    if min_prefix < 1:
        raise ValueError(f"min_prefix: expected a positive integer, got {min_prefix!r}")
    k = len(tokens)
    if k < 2:
        return None
    p = _shared_length(tokens)
    lengths = [len(t) for t in tokens]
    if p < min_prefix or _cost(p, lengths) >= sum(n - 1 for n in lengths):
        return None
    width = max(n - 1 - p for n in lengths)
    suffix_ids = torch.zeros(k, width, dtype=torch.long)
    suffix_mask = torch.zeros(k, width, dtype=torch.long)
    source_targets = torch.zeros(p + k * width, dtype=torch.long)
    source_targets[: p - 1] = torch.tensor(tokens[0][1:p], dtype=torch.long)
    first_targets = torch.tensor([t[p] for t in tokens], dtype=torch.long)
    first_entry = p + k * width  # entries of the first-target scores follow the source's
    gather: list[int] = []
    for s, seq in enumerate(tokens):
        n_suffix = len(seq) - 1 - p
        suffix_ids[s, :n_suffix] = torch.tensor(seq[p: len(seq) - 1], dtype=torch.long)
        suffix_mask[s, :n_suffix] = 1
        row = p + s * width
        source_targets[row: row + n_suffix] = torch.tensor(seq[p + 1:], dtype=torch.long)
        gather += list(range(p - 1))
        gather.append(first_entry + s)
        gather += range(row, row + n_suffix)
    return PrefixLayout(
        prefix_len=p, prefix_ids=torch.tensor(tokens[0][:p], dtype=torch.long), suffix_ids=suffix_ids,
        suffix_mask=suffix_mask, source_targets=source_targets, first_targets=first_targets,
        gather=torch.tensor(gather, dtype=torch.long),
    ).to(device)


def _chunks(tokens: Sequence[Sequence[int]], order: Sequence[int], max_tokens: int, min_prefix: int) -> list[list[int]]:
    """Cut ``order`` (sorted by tokens) into runs that share at least ``min_prefix`` tokens and whose
    shared-path cost fits ``max_tokens``; greedy, in order."""
    runs: list[list[int]] = []
    run: list[int] = []
    shared = 0
    for i in order:
        if run:
            candidate = min(shared, common_prefix_length(tokens[run[-1]], tokens[i]), len(tokens[i]) - 2)
            lengths = [len(tokens[j]) for j in run] + [len(tokens[i])]
            if candidate >= min_prefix and _cost(candidate, lengths) <= max_tokens:
                run.append(i)
                shared = candidate
                continue
            runs.append(run)
        run, shared = [i], len(tokens[i]) - 2
    if run:
        runs.append(run)
    return runs


def plan_shared_prefix_micro_batches(
    tokens: Sequence[Sequence[int]], config: PackingConfig, *, min_prefix: int, world_size: int = 1, rank: int = 0
) -> list[list[int]]:
    """This rank's micro-batches (lists of indices into ``tokens``), sharing prefixes where they can.

    Ranks get the same share as :func:`~agentrl.train.packing.plan_micro_batches` (balanced by
    length). On a rank, sequences sorted by their tokens are cut greedily into runs sharing at least
    ``min_prefix`` leading tokens whose cost ``P + k·L`` fits ``config.max_tokens``; runs of two or
    more become micro-batches of their own, and the remaining sequences are bin-packed as usual.
    Deterministic, a pure function of the tokens.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, got {rank!r}")
    lengths = [len(t) - 1 for t in tokens]
    _check_lengths(lengths, config.max_tokens)
    mine = partition_for_ranks(lengths, world_size)[rank]
    order = sorted(mine, key=lambda i: (list(tokens[i]), i))
    plan: list[list[int]] = []
    singles: list[int] = []
    for run in _chunks(tokens, order, config.max_tokens, min_prefix):
        if len(run) > 1:
            plan.append(sorted(run))
        else:
            singles += run
    singles.sort()
    packed = pack_indices([lengths[i] for i in singles], config.max_tokens, config.algorithm)
    return plan + [[singles[j] for j in b] for b in packed]
