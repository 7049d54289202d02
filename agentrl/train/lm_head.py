"""The output projection of a Hugging Face causal LM, switched per call: logits, hidden states, or
token scores computed inside the model's own forward without the logits.

:class:`HeadSwitch` replaces the ``forward`` of the model's output embedding (a bias-free
``nn.Linear``; parameter names and the module tree are unchanged, so checkpoints and exports are
the same) by one that, depending on the mode set around a call, returns

- the logits (no mode: the original projection);
- the hidden states it was given (``hidden()``: the shared-prefix path scores them afterwards);
- :class:`Scored` log-probs and entropy at given targets (``scoring(...)``), computed by
  :func:`agentrl.algorithms.scores_from_hidden` chunk by chunk: the ``[tokens, vocab]`` logits never
  exist, forward or backward.

Scoring inside the forward matters under FSDP: the projection's weight is only gathered (and its
gradient only reduced) inside the root module's forward and backward.

Example::

    head = HeadSwitch(model)
    with head.scoring(ScoreRequest(targets, temperature=1.0, chunk_size=128, entropy="metric")):
        logprobs, entropy = model(input_ids=ids[None], use_cache=False).logits
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from agentrl.algorithms.fused_logprobs import EntropyMode, scores_from_hidden

__all__ = ["HeadSwitch", "ScoreRequest", "Scored", "output_projection"]


class Scored(NamedTuple):
    """What the switched head returns while scoring: ``[tokens]`` log-probs and entropy (or None)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None


@dataclass(frozen=True)
class ScoreRequest:
    """Targets (one id per position of the row) and how to score them."""

    targets: torch.Tensor
    temperature: float
    chunk_size: int
    entropy: EntropyMode = "none"


def output_projection(model: torch.nn.Module) -> torch.nn.Linear:
    """The model's output embedding, checked to be a bias-free ``nn.Linear`` (else ``ValueError``)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise ValueError("fused_lm_head: the model's output embedding is not a bias-free nn.Linear; set "
                         "fused_lm_head=False")
    return head


class HeadSwitch:
    """Switches the output projection of ``model`` per call (see the module doc). The mode is per
    thread: a forward on one thread (a probe scoring) never sees the mode another thread set."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.head = output_projection(model)
        self._local = threading.local()
        self.head.forward = self._forward  # type: ignore[method-assign, assignment]

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def _forward(self, hidden: torch.Tensor) -> torch.Tensor | Scored:
        mode = getattr(self._local, "mode", None)
        if mode is None:
            return F.linear(hidden, self.head.weight)
        if mode == "hidden":
            return hidden
        assert isinstance(mode, ScoreRequest)
        rows = hidden.reshape(-1, hidden.shape[-1])
        lp, ent = scores_from_hidden(rows, self.head.weight, mode.targets, temperature=mode.temperature,
                                     chunk_size=mode.chunk_size, entropy=mode.entropy)
        return Scored(lp, ent)

    @contextlib.contextmanager
    def _set(self, mode: str | ScoreRequest | None) -> Iterator[None]:
        previous = getattr(self._local, "mode", None)
        self._local.mode = mode
        try:
            yield
        finally:
            self._local.mode = previous

    def scoring(self, request: ScoreRequest) -> contextlib.AbstractContextManager[None]:
        """Calls inside return :class:`Scored` instead of logits."""
        return self._set(request)

    def hidden(self) -> contextlib.AbstractContextManager[None]:
        """Calls inside return the hidden states instead of logits."""
        return self._set("hidden")

    def logits(self) -> contextlib.AbstractContextManager[None]:
        """Calls inside return the model's logits (the default outside any mode)."""
        return self._set(None)
