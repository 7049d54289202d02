"""One packed row through a ``GPTModel`` stage, with per-sequence positions and attention.

The backend packs several sequences into one row (the torch backend's plan). Megatron's own
forward would give the row's tokens positions ``0..S-1`` for RoPE and one causal mask over the
whole row; here each sequence is scored exactly as if it were alone:

- ``attention="per_document"`` (default): each token gets the RoPE angle of its ``position_ids``
  entry (restarting at 0 per sequence) and the core attention
  (:mod:`agentrl.train.megatron.attention`) reads the documents' offsets from the
  ``attention_mask`` argument: no ``[S, S]`` tensor anywhere;
- ``attention="te"``: Transformer Engine's attention on THD-packed sequences (``PackedSeqParams``),
  RoPE restarting per document inside megatron-core;
- ``attention="dense"``: a ``[1, 1, S, S]`` block-diagonal causal mask (True = masked) for the local
  ``DotProductAttention`` (quadratic in the row; the reference).

``head="hidden"`` returns the last stage's final hidden states instead of the logits, for scoring
with the fused vocabulary-parallel head (the ``[S, V/TP]`` logits never exist).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["block_causal_mask", "document_offsets", "packed_forward"]


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """``[1, 1, S, S]`` bool, True where query ``i`` must not see key ``j``: a later key, or a key of
    another packed sequence (a new sequence starts wherever the position is 0)."""
    if position_ids.dim() != 1:
        raise ValueError(f"position_ids: expected a 1-D row, got shape {tuple(position_ids.shape)}")
    segment = torch.cumsum((position_ids == 0).to(torch.long), dim=0)
    n = position_ids.shape[0]
    idx = torch.arange(n, device=position_ids.device)
    allowed = (segment[:, None] == segment[None, :]) & (idx[None, :] <= idx[:, None])
    return (~allowed)[None, None]


def document_offsets(position_ids: torch.Tensor, lengths: Sequence[int] | None = None) -> torch.Tensor:
    """The row's cumulative document offsets ``[0, n0, n0+n1, ..., S]`` (int32), from ``lengths`` or,
    without them, from the positions (a document starts wherever the position is 0)."""
    if lengths is None:
        starts = [i for i in torch.nonzero(position_ids == 0)[:, 0].tolist() if i > 0]
        bounds = [0, *starts, int(position_ids.numel())]
        lengths = [b - a for a, b in itertools.pairwise(bounds)]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + int(n))
    return torch.tensor(offsets, dtype=torch.int32, device=position_ids.device)


def packed_forward(model: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, *,
                   lengths: Sequence[int] | None = None, attention: str = "per_document",
                   head: str = "logits") -> torch.Tensor:
    """Run one stage on a packed row (``input_ids``/``position_ids`` are 1-D, length ``S``;
    ``lengths``: the documents' lengths, read from the positions when None).

    First stage: embeds ``input_ids``; later stages read the tensor Megatron's schedule set with
    ``set_input_tensor``. Returns the hidden states ``[S, 1, H]`` on inner stages; on the last stage
    this rank's vocabulary slice of the logits ``[S, V/P]`` (``head="logits"``) or the final hidden
    states ``[S, H]`` (``head="hidden"``).
    """
    ids, pos = input_ids[None], position_ids[None]
    hidden = model.embedding(input_ids=ids, position_ids=pos) if model.pre_process else None
    packed_seq_params = None
    if attention == "te":
        from megatron.core.packed_seq_params import PackedSeqParams

        cu = document_offsets(position_ids, lengths)
        longest = int((cu[1:] - cu[:-1]).max())
        packed_seq_params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                            max_seqlen_q=longest, max_seqlen_kv=longest)
        rope = model.rotary_pos_emb(longest)  # per document from 0: megatron-core splits it by cu_seqlens
        mask = None
    else:
        table = model.rotary_pos_emb(int(position_ids.max()) + 1)  # [max_pos, 1, 1, head_dim]
        rope = table[position_ids]
        mask = block_causal_mask(position_ids) if attention == "dense" else document_offsets(position_ids, lengths)
    hidden = model.decoder(hidden_states=hidden, attention_mask=mask, rotary_pos_emb=rope,
                           packed_seq_params=packed_seq_params)
    if not model.post_process:
        return torch.as_tensor(hidden)
    if head == "hidden":
        return torch.as_tensor(hidden)[:, 0, :]
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    logits, _ = model.output_layer(hidden, weight=weight)
    return torch.as_tensor(logits[:, 0, :])
