"""Scoring packed micro-batches with a Hugging Face causal LM: token log-probs and entropy.

Two paths, chosen by ``TorchBackendConfig.fused_lm_head``:

- **logits** (default): ``model(...).logits`` then chunked log-softmax; works for any causal LM.
- **fused**: the decoder's hidden states and the output embedding go straight to
  :func:`agentrl.algorithms.logprobs_from_hidden`, so the ``[tokens, vocab]`` logits and their
  gradient never exist. Only for plain projections; :meth:`TokenScorer.verify_fused` compares the
  two paths on a probe before it is used.

:meth:`TokenScorer.verify_packing` checks that the model attends within packed sequences only;
:meth:`TokenScorer.verify_shared_prefix` that the shared-prefix path (:mod:`agentrl.train.prefix`)
reproduces each sequence scored alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from agentrl.train.prefix import PrefixLayout, shared_prefix_layout

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
        ``entropy="grad"`` keeps the entropy differentiable (logits path only). A micro-batch with a
        :class:`~agentrl.train.prefix.PrefixLayout` runs its shared prefix once; the results are in
        the packed layout either way."""
        if mb.prefix is not None:
            source, extra = self._shared_forward(model, mb.prefix)
            lp_src, ent_src = self._score_rows(model, source, mb.prefix.source_targets, entropy)
            lp_first, _ = self._score_rows(model, extra, mb.prefix.first_targets, "none")
            gather = mb.prefix.gather
            lp = torch.cat([lp_src, lp_first])[gather]
            if ent_src is None:
                return lp, None, source
            shared = ent_src[mb.prefix.prefix_len - 1: mb.prefix.prefix_len].expand(mb.prefix.num_sequences)
            return lp, torch.cat([ent_src, shared])[gather], source
        with self.autocast():
            out = self._forward(model, input_ids=mb.input_ids[None], position_ids=mb.position_ids[None],
                                use_cache=False)[0][0]
        lp, ent = self._score_rows(model, out, mb.target_ids, entropy)
        return lp, ent, out

    def _forward(self, model: torch.nn.Module, **inputs: Any) -> tuple[torch.Tensor, Any]:
        """``(logits or hidden states [B, T, D], cache)`` of one forward pass."""
        if self.config.fused_lm_head:
            out = _decoder(model)(**inputs)
            return out.last_hidden_state, getattr(out, "past_key_values", None)
        out = model(**inputs)
        return out.logits, getattr(out, "past_key_values", None)

    def _score_rows(
        self, model: torch.nn.Module, rows: torch.Tensor, targets: torch.Tensor, entropy: EntropyMode
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of ``targets`` (and entropy) from ``rows`` ([R, D]: logits, or hidden states when fused)."""
        temp, chunk = self.config.loss.temperature, self.config.logprob_chunk_size
        if self.config.fused_lm_head:
            weight = _lm_weight(model)
            lp = logprobs_from_hidden(rows, weight, targets, temperature=temp, chunk_size=chunk)
            ent = None if entropy == "none" else entropy_from_hidden(
                rows.detach(), weight.detach(), temperature=temp, chunk_size=chunk)
            return lp, ent
        lp = logprobs_from_logits(rows, targets, temperature=temp, chunk_size=chunk)
        if entropy == "grad":
            return lp, entropy_from_logits(rows, temperature=temp, chunk_size=chunk)
        if entropy == "metric":
            with torch.no_grad():
                return lp, entropy_from_logits(rows.detach(), temperature=temp, chunk_size=chunk)
        return lp, None

    def _shared_forward(self, model: torch.nn.Module, layout: PrefixLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """The two passes of a shared-prefix micro-batch: ``(source [P + k·L, D], last prefix row
        expanded [k, D])``. The prefix's keys and values are expanded (not copied) over the ``k``
        suffix rows, so backward sums every suffix's gradient into the one prefix computation."""
        p, k, width = layout.prefix_len, layout.num_sequences, int(layout.suffix_ids.shape[1])
        with self.autocast():
            prefix_out, cache = self._forward(
                model, input_ids=layout.prefix_ids[None], position_ids=torch.arange(p, device=self.device)[None],
                use_cache=True)
            layers = getattr(cache, "layers", None)
            if not layers:
                raise ValueError("shared_prefix: the model returned no per-layer key/value cache from a prefix pass; "
                                 "set shared_prefix=False for this model")
            for layer in layers:
                layer.keys = layer.keys.expand(k, -1, -1, -1)
                layer.values = layer.values.expand(k, -1, -1, -1)
            mask = torch.cat([torch.ones(k, p, dtype=torch.long, device=self.device), layout.suffix_mask], dim=1)
            positions = torch.arange(p, p + width, device=self.device)[None].expand(k, -1)
            suffix_out, _ = self._forward(model, input_ids=layout.suffix_ids, position_ids=positions,
                                          attention_mask=mask, past_key_values=cache, use_cache=True)
        prefix_rows = prefix_out[0]
        source = torch.cat([prefix_rows, suffix_out.reshape(k * width, -1)])
        return source, prefix_rows[p - 1].expand(k, -1)

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

    def verify_shared_prefix(self, model: torch.nn.Module, vocab_rows: int) -> None:
        """Raise unless two sequences scored with a shared prefix match each scored alone (on a probe,
        without autocast: the check is about the key/value cache, not precision)."""
        gen = torch.Generator().manual_seed(4321)
        common = torch.randint(0, vocab_rows, (6,), generator=gen).tolist()
        seqs = [common + torch.randint(0, vocab_rows, (n,), generator=gen).tolist() for n in (5, 3)]
        exact = TokenScorer(dataclasses.replace(self.config, autocast="none"), self.device)
        both = _token_micro_batch(seqs, self.device)
        both.prefix = shared_prefix_layout(seqs, min_prefix=1, device=self.device)
        with torch.no_grad():
            shared = exact.scores(model, both)[0].double()
            alone = torch.cat([exact.scores(model, _token_micro_batch([s], self.device))[0] for s in seqs]).double()
        err = float((shared - alone).abs().max())
        if err > 1e-3 * (1 + float(alone.abs().max())):
            raise ValueError(
                f"shared_prefix: log-probs with a shared prefix differ from each sequence scored alone by {err:.3g} "
                "(the model's key/value cache cannot be expanded over a batch, or its positions are not 1-D "
                "offsets); set shared_prefix=False for this model"
            )


def _token_micro_batch(seqs: list[list[int]], device: torch.device) -> MicroBatch:
    """A packed micro-batch of bare token sequences (no mask, advantages or logprobs), for probes."""
    inputs = [t for s in seqs for t in s[:-1]]
    n = len(inputs)
    return MicroBatch(
        input_ids=torch.tensor(inputs, device=device),
        position_ids=torch.tensor([p for s in seqs for p in range(len(s) - 1)], device=device),
        target_ids=torch.tensor([t for s in seqs for t in s[1:]], device=device),
        loss_mask=torch.zeros(n), advantages=torch.zeros(n), rollout_logprobs=torch.zeros(n),
        denominators=torch.ones(n), sequence_ids=torch.tensor([k for k, s in enumerate(seqs) for _ in s[1:]]),
        indices=list(range(len(seqs))),
    )
