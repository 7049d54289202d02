"""Scoring packed micro-batches with a Hugging Face causal LM: token log-probs and entropy.

Two paths, chosen by ``TorchBackendConfig.fused_lm_head``:

- **logits** (default): ``model(...).logits`` then chunked log-softmax; works for any causal LM.
- **fused**: the decoder's hidden states and the output embedding go straight to
  :func:`agentrl.algorithms.logprobs_from_hidden`, so the ``[tokens, vocab]`` logits and their
  gradient never exist. Only for plain projections; :meth:`TokenScorer.verify_fused` compares the
  two paths on a probe before it is used.

:meth:`TokenScorer.verify_packing` checks that the model attends within packed sequences only.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import torch

from agentrl.algorithms import (
    entropy_from_hidden,
    entropy_from_logits,
    logprobs_from_hidden,
    logprobs_from_logits,
)
from agentrl.train.config import TorchBackendConfig
from agentrl.train.packing import MicroBatch

__all__ = ["TokenScorer"]

EntropyMode = Literal["none", "metric", "grad"]


def _lm_weight(model: torch.nn.Module) -> torch.Tensor:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise ValueError(
            "fused_lm_head: the model's output embedding is not a bias-free nn.Linear; set fused_lm_head=False"
        )
    return head.weight


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    base = getattr(model, "base_model", None)
    if not isinstance(base, torch.nn.Module) or base is model:
        raise ValueError("fused_lm_head: the model exposes no base_model (decoder) to run; set fused_lm_head=False")
    return base


class TokenScorer:
    """Runs micro-batches through a model and scores their target tokens (see the module doc)."""

    def __init__(self, config: TorchBackendConfig, device: torch.device) -> None:
        self.config = config
        self.device = device

    def autocast(self) -> Any:
        dtype = self.config.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def scores(
        self, model: torch.nn.Module, mb: MicroBatch, *, entropy: EntropyMode = "none"
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``(logprobs [N], entropy [N] or None, anchor)``; ``anchor`` is the largest tensor of the
        graph (logits or hidden states) for the empty-micro-batch guard ``loss + 0 * anchor.sum()``.
        ``entropy="grad"`` keeps the entropy differentiable (logits path only)."""
        temp, chunk = self.config.loss.temperature, self.config.logprob_chunk_size
        ids, pos = mb.input_ids[None], mb.position_ids[None]
        if self.config.fused_lm_head:
            with self.autocast():
                hidden = _decoder(model)(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state[0]
            weight = _lm_weight(model)
            lp = logprobs_from_hidden(hidden, weight, mb.target_ids, temperature=temp, chunk_size=chunk)
            ent = None if entropy == "none" else entropy_from_hidden(
                hidden.detach(), weight.detach(), temperature=temp, chunk_size=chunk)
            return lp, ent, hidden
        with self.autocast():
            logits: torch.Tensor = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        lp = logprobs_from_logits(logits, mb.target_ids, temperature=temp, chunk_size=chunk)
        if entropy == "grad":
            return lp, entropy_from_logits(logits, temperature=temp, chunk_size=chunk), logits
        if entropy == "metric":
            with torch.no_grad():
                return lp, entropy_from_logits(logits.detach(), temperature=temp, chunk_size=chunk), logits
        return lp, None, logits

    def logprobs(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """Target log-probs without gradient."""
        with torch.no_grad():
            return self.scores(model, mb)[0]

    def _probe(self, vocab_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1234)
        a = torch.randint(0, vocab_rows, (7,), generator=gen).to(self.device)
        b = torch.randint(0, vocab_rows, (5,), generator=gen).to(self.device)
        positions = torch.cat([torch.arange(7), torch.arange(5)]).to(self.device)
        return a, b, positions

    def verify_packing(self, model: torch.nn.Module, vocab_rows: int) -> None:
        """Raise if packed sequences (position ids restarting at 0) see each other's tokens."""
        a, b, positions = self._probe(vocab_rows)
        both = torch.cat([a, b])[None]
        with torch.no_grad():
            alone = model(input_ids=b[None], use_cache=False).logits[0].double()
            packed = model(input_ids=both, position_ids=positions[None], use_cache=False).logits[0, 7:].double()
            leaked = model(input_ids=both, position_ids=positions[None], attention_mask=torch.ones_like(both),
                           use_cache=False).logits[0, 7:].double()
        err = float((packed - alone).abs().max())
        leak = float((leaked - alone).abs().max())
        if err > 0.5 * leak + 1e-6 * (1 + float(alone.abs().max())):
            raise RuntimeError(
                f"model: packed sequences leak attention into each other (max logit error {err:.3g} vs {leak:.3g} "
                "for full attention); use a model whose attention masks by position_ids (Hugging Face models built "
                "on masking_utils, or flash-attention varlen) or set verify_packing=False at your own risk"
            )

    def verify_fused(self, model: torch.nn.Module, vocab_rows: int) -> None:
        """Raise unless the fused path reproduces the model's own logits path on a probe."""
        a, b, _ = self._probe(vocab_rows)
        ids = torch.cat([a, b])
        mb = MicroBatch(input_ids=ids[:-1], position_ids=torch.arange(11, device=self.device), target_ids=ids[1:],
                        loss_mask=torch.ones(11), advantages=torch.zeros(11), rollout_logprobs=torch.zeros(11),
                        denominators=torch.ones(11), sequence_ids=torch.zeros(11, dtype=torch.long), indices=[0])
        with torch.no_grad():  # both paths without autocast: the check is about the head, not precision
            hidden = _decoder(model)(input_ids=mb.input_ids[None], position_ids=mb.position_ids[None],
                                     use_cache=False).last_hidden_state[0]
            fused = logprobs_from_hidden(hidden, _lm_weight(model), mb.target_ids,
                                         temperature=self.config.loss.temperature).double()
            logits = model(input_ids=mb.input_ids[None], position_ids=mb.position_ids[None], use_cache=False).logits[0]
            plain = logprobs_from_logits(logits, mb.target_ids, temperature=self.config.loss.temperature).double()
        err = float((fused - plain).abs().max())
        if err > 1e-3 * (1 + float(plain.abs().max())):
            raise ValueError(
                f"fused_lm_head: log-probs from hidden states differ from the model's logits by {err:.3g} (logit "
                "scaling, soft-capping or a non-standard head?); set fused_lm_head=False for this model"
            )
