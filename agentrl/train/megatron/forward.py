"""One packed row through a ``GPTModel`` stage, with per-sequence positions.

The backend packs several sequences into one row (the torch backend's plan). Megatron's own
forward would give the row's tokens positions ``0..S-1`` for RoPE and one causal mask over the
whole row; here each token gets the RoPE angle of its ``position_ids`` entry (restarting at 0 per
sequence) and attention is block-diagonal causal, so a packed row scores each sequence exactly as
if it were alone. The block mask is ``[1, 1, S, S]`` (True = masked), what megatron-core's local
attention takes; Transformer Engine's THD packing would avoid that memory on GPUs.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["block_causal_mask", "packed_forward"]


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


def packed_forward(model: Any, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Run one stage on a packed row (``input_ids``/``position_ids`` are 1-D, length ``S``).

    First stage: embeds ``input_ids``; later stages read the tensor Megatron's schedule set with
    ``set_input_tensor``. Returns the hidden states ``[S, 1, H]`` on inner stages, or this rank's
    vocabulary slice of the logits ``[S, V/P]`` on the last stage.
    """
    ids, pos = input_ids[None], position_ids[None]
    hidden = model.embedding(input_ids=ids, position_ids=pos) if model.pre_process else None
    table = model.rotary_pos_emb(int(position_ids.max()) + 1)  # [max_pos, 1, 1, head_dim]
    rope = table[position_ids]
    mask = block_causal_mask(position_ids)
    hidden = model.decoder(hidden_states=hidden, attention_mask=mask, rotary_pos_emb=rope)
    if not model.post_process:
        return torch.as_tensor(hidden)
    weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
    logits, _ = model.output_layer(hidden, weight=weight)
    return torch.as_tensor(logits[:, 0, :])
