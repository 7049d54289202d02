"""Packed micro-batches through megatron-core's forward-backward schedule.

:func:`run_schedule` feeds this rank's micro-batches to Megatron's schedule (no pipelining,
or 1F1B across pipeline stages) and applies ``score`` to the last stage's logits of each one.
``score(mb, logits or hidden states) -> (loss, values)`` returns the micro-batch's loss *share* (already divided by
the step's global counts) and detached per-micro-batch values; the values come back from the
last stage, in micro-batch order (an empty list on other stages).

Megatron's own rescaling is switched off: the model config sets ``calculate_per_token_loss``, so
the schedule neither divides by the number of micro-batches nor by a token count, and the
backend's DDP sums (does not average) gradients over data-parallel ranks. The shares then add
up to the step objective exactly as in the torch backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from agentrl.train.megatron.forward import packed_forward
from agentrl.train.packing import MicroBatch

__all__ = ["ForwardHooks", "Score", "run_schedule", "unwrap"]

Score = Callable[[MicroBatch, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class ForwardHooks(Protocol):
    """Called around each micro-batch's forward on this stage (a MoE model's routing replay)."""

    def before_forward(self, mb: MicroBatch) -> None: ...

    def after_forward(self, mb: MicroBatch) -> None: ...


def unwrap(model: Any) -> Any:
    """The ``GPTModel`` inside Megatron's wrappers (DDP, Float16Module)."""
    while hasattr(model, "module"):
        model = model.module
    return model


def run_schedule(model: Any, micro_batches: Sequence[MicroBatch], score: Score, *,
                 forward_only: bool, attention: str = "per_document", head: str = "logits",
                 hooks: ForwardHooks | None = None) -> list[dict[str, torch.Tensor]]:
    """Run ``micro_batches`` (this rank's, identical across its TP/PP group) through the schedule;
    ``attention`` and ``head`` are :func:`~agentrl.train.megatron.forward.packed_forward`'s (``score``
    then gets the last stage's logits, or its hidden states with ``head="hidden"``); ``hooks`` run
    before and after each micro-batch's forward (not around a recomputation in the backward pass)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not micro_batches:
        return []
    data = iter(micro_batches)

    def forward_step(data_iterator: Any, wrapped: Any) -> tuple[torch.Tensor, Callable[..., Any]]:
        mb: MicroBatch = next(data_iterator)
        if hooks is not None:
            hooks.before_forward(mb)
        output = packed_forward(unwrap(wrapped), mb.input_ids, mb.position_ids, lengths=mb.document_lengths,
                                attention=attention, head=head)
        if hooks is not None:
            hooks.after_forward(mb)

        def loss_func(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
            loss, values = score(mb, logits)
            # A count of 1 per micro-batch; with calculate_per_token_loss Megatron only sums it.
            return loss, torch.ones((), dtype=torch.int, device=loss.device), values

        return output, loss_func

    forward_backward = get_forward_backward_func()
    seq_length = max(mb.num_tokens for mb in micro_batches)
    out: list[dict[str, torch.Tensor]] = forward_backward(
        forward_step_func=forward_step, data_iterator=data, model=[model], num_microbatches=len(micro_batches),
        seq_length=seq_length, micro_batch_size=1, forward_only=forward_only)
    return out
