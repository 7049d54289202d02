"""Scoring packed micro-batches with a Hugging Face causal LM: token log-probs and entropy.

Two paths, chosen per model by the backend (``TorchBackendConfig.fused_lm_head``):

- **fused** (the default where the head allows it): the model's output head scores the targets
  from the decoder's hidden states inside the forward (:mod:`agentrl.train.lm_head`,
  :func:`agentrl.algorithms.scores_from_hidden`), so the ``[tokens, vocab]`` logits and their
  gradient never exist; the entropy (metric or bonus) comes from the same chunks. Only for plain
  projections; :meth:`TokenScorer.verify_fused` compares it with the model's logits on a probe.
- **logits**: ``model(...).logits`` (in the compute dtype) then a chunked float32 log-softmax
  (:func:`agentrl.algorithms.logprobs_from_logits`); works for any causal LM.

With packed attention (:mod:`agentrl.train.attention`) each call carries the row's documents, so
documents never see each other whatever the model's cache settings; every call also passes
``use_cache=False``, which keeps transformers' own packed-sequence detection on for models that
keep their own attention (with a cache object it switches off and documents attend to each other).

:meth:`TokenScorer.verify_packing` checks that the model attends within packed sequences only;
:meth:`TokenScorer.verify_shared_prefix` that the shared-prefix path (:mod:`agentrl.train.prefix`)
reproduces each sequence scored alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Literal

import torch

from agentrl.algorithms import entropy_from_logits, logprobs_from_logits, scores_from_hidden
from agentrl.token_data import ROUTED_EXPERTS
from agentrl.train.attention import Documents
from agentrl.train.config import TorchBackendConfig
from agentrl.train.lm_head import HeadSwitch, Scored, ScoreRequest
from agentrl.train.moe import MoeRouting, shared_prefix_routing
from agentrl.train.packing import MicroBatch
from agentrl.train.prefix import PrefixLayout, shared_prefix_layout

__all__ = ["TokenScorer"]

EntropyMode = Literal["none", "metric", "grad"]


class TokenScorer:
    """Runs micro-batches through a model and scores their target tokens (see the module doc).

    ``attention``: the packed-attention kernel the models use (``"model"``: their own attention, no
    documents passed). :meth:`register` tells it each model's head switch (None: logits path)."""

    def __init__(self, config: TorchBackendConfig, device: torch.device, *, attention: str = "model") -> None:
        self.config = config
        self.device = device
        self.attention = attention
        self._heads: dict[int, HeadSwitch] = {}
        self._routing: dict[int, MoeRouting] = {}

    def register(self, model: torch.nn.Module, head: HeadSwitch | None) -> None:
        """Score ``model`` through ``head`` (the fused path), or through its logits when None."""
        if head is None:
            self._heads.pop(id(model), None)
        else:
            self._heads[id(model)] = head

    def register_routing(self, model: torch.nn.Module, routing: MoeRouting | None) -> None:
        """Bind the engine's routing (a micro-batch's ``routed_experts`` channel) to every forward of
        ``model`` (a mixture of experts; :mod:`agentrl.train.moe`)."""
        if routing is None:
            self._routing.pop(id(model), None)
        else:
            self._routing[id(model)] = routing

    def routing(self, model: torch.nn.Module) -> MoeRouting | None:
        return self._routing.get(id(model))

    def _bound(self, model: torch.nn.Module, experts: torch.Tensor | None, present: torch.Tensor | None, *,
               real: torch.Tensor | None = None, record: bool = True) -> contextlib.AbstractContextManager[object]:
        routing = self._routing.get(id(model))
        if routing is None:
            return contextlib.nullcontext()
        # only forwards that train are counted in the routing figures (scoring runs the same weights again)
        return routing.bind(experts, present, real=real, record=record and torch.is_grad_enabled())

    def head(self, model: torch.nn.Module) -> HeadSwitch | None:
        """The head switch ``model`` is scored through (None: the logits path)."""
        return self._heads.get(id(model))

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        dtype = self.config.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def documents(self, lengths: tuple[int, ...]) -> dict[str, Any]:
        """The keyword arguments that tell packed attention a row's documents (none for ``"model"``)."""
        if self.attention == "model":
            return {}
        return {"agentrl_documents": Documents.from_lengths(lengths, device=self.device)}

    def scores(
        self, model: torch.nn.Module, mb: MicroBatch, *, entropy: EntropyMode = "none"
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``(logprobs [N], entropy [N] or None, anchor)``; ``anchor`` is a tensor of the graph that
        depends on every parameter used (logits, hidden states or the scores themselves) for the
        empty-micro-batch guard ``loss + 0 * anchor.sum()``. ``entropy="grad"`` keeps the entropy
        differentiable. A micro-batch with a :class:`~agentrl.train.prefix.PrefixLayout` runs its
        shared prefix once; the results are in the packed layout either way."""
        channel = mb.channels.get(ROUTED_EXPERTS)
        experts, present = (channel.values, channel.present) if channel is not None else (None, None)
        if mb.prefix is not None:
            passes: tuple[Any, Any] = (None, None)  # each pass's engine routing
            if experts is not None and present is not None and self.routing(model) is not None:
                split = shared_prefix_routing(experts, present, mb.document_lengths, mb.prefix.prefix_len,
                                              int(mb.prefix.suffix_ids.shape[1]))
                if split is None:  # the backend's plan leaves such a micro-batch unshared
                    raise ValueError("shared prefix: the sequences' engine routing of the prefix differs; expected "
                                     "a plain micro-batch (see agentrl.train.moe.routing_shares_prefix)")
                passes = split
            source, extra = self._shared_forward(model, mb.prefix, passes, record=not mb.padding)
            lp_src, ent_src = self._score_rows(model, source, mb.prefix.source_targets, entropy)
            lp_first, _ = self._score_rows(model, extra, mb.prefix.first_targets, "none")
            gather = mb.prefix.gather
            lp = torch.cat([lp_src, lp_first])[gather]
            if ent_src is None:
                return lp, None, source
            last = ent_src[mb.prefix.prefix_len - 1: mb.prefix.prefix_len].expand(mb.prefix.num_sequences)
            return lp, torch.cat([ent_src, last])[gather], source
        inputs = {"input_ids": mb.input_ids[None], "position_ids": mb.position_ids[None], "use_cache": False,
                  **self.documents(mb.document_lengths)}
        head = self.head(model)
        with self.autocast(), self._bound(model, experts, present, record=not mb.padding):
            if head is not None:
                request = ScoreRequest(mb.target_ids, self.config.loss.temperature, self.config.logprob_chunk_size,
                                       entropy)
                with head.scoring(request):
                    scored = model(**inputs).logits
                assert isinstance(scored, Scored)
                return scored.logprobs, scored.entropy, scored.logprobs
            out = model(**inputs).logits[0]
        lp, ent = self._score_rows(model, out, mb.target_ids, entropy)
        return lp, ent, out

    def _forward(self, model: torch.nn.Module, **inputs: Any) -> tuple[torch.Tensor, Any]:
        """``(logits, or hidden states on the fused path, [B, T, D]; cache)`` of one forward pass."""
        head = self.head(model)
        with head.hidden() if head is not None else contextlib.nullcontext():
            out = model(**inputs)
        return out.logits, getattr(out, "past_key_values", None)

    def _score_rows(
        self, model: torch.nn.Module, rows: torch.Tensor, targets: torch.Tensor, entropy: EntropyMode
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of ``targets`` (and entropy) from ``rows`` ([R, D]: logits, or hidden states when fused)."""
        temp, chunk = self.config.loss.temperature, self.config.logprob_chunk_size
        head = self.head(model)
        if head is not None:
            return scores_from_hidden(rows, head.weight, targets, temperature=temp, chunk_size=chunk, entropy=entropy)
        lp = logprobs_from_logits(rows, targets, temperature=temp, chunk_size=chunk)
        if entropy == "grad":
            return lp, entropy_from_logits(rows, temperature=temp, chunk_size=chunk)
        if entropy == "metric":
            with torch.no_grad():
                return lp, entropy_from_logits(rows.detach(), temperature=temp, chunk_size=chunk)
        return lp, None

    def _shared_forward(self, model: torch.nn.Module, layout: PrefixLayout, routing: tuple[Any, Any] = (None, None),
                        *, record: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The two passes of a shared-prefix micro-batch: ``(source [P + k·L, D], last prefix row
        expanded [k, D])``. The prefix's keys and values are expanded (not copied) over the ``k``
        suffix rows, so backward sums every suffix's gradient into the one prefix computation.
        ``routing``: each pass's engine routing (:func:`~agentrl.train.moe.shared_prefix_routing`)."""
        p, k, width = layout.prefix_len, layout.num_sequences, int(layout.suffix_ids.shape[1])
        (prefix_experts, prefix_present), (suffix_experts, suffix_present) = (
            pair if pair is not None else (None, None) for pair in routing)
        with self.autocast():
            with self._bound(model, prefix_experts, prefix_present, record=record):
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
            with self._bound(model, suffix_experts, suffix_present, real=layout.suffix_mask.reshape(-1).bool(),
                             record=record):
                suffix_out, _ = self._forward(model, input_ids=layout.suffix_ids, position_ids=positions,
                                              attention_mask=mask, past_key_values=cache, use_cache=True)
        prefix_rows = prefix_out[0]
        source = torch.cat([prefix_rows, suffix_out.reshape(k * width, -1)])
        return source, prefix_rows[p - 1].expand(k, -1)

    def routing_differences(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """``[N]`` per position: the MoE layers whose router (the trainer's own) picks other experts than
        the micro-batch's engine routing; -1 where the engine's is missing. One plain packed forward
        without gradient (a shared prefix is not used: this is for inspection)."""
        routing = self.routing(model)
        channel = mb.channels.get(ROUTED_EXPERTS)
        if routing is None or channel is None:
            return torch.full((mb.num_tokens,), -1, dtype=torch.int32)
        inputs = {"input_ids": mb.input_ids[None], "position_ids": mb.position_ids[None], "use_cache": False,
                  **self.documents(mb.document_lengths)}
        head = self.head(model)
        with torch.no_grad(), self.autocast(), routing.collect(channel.values, channel.present) as binding:
            with head.logits() if head is not None else contextlib.nullcontext():
                model(**inputs)
        assert binding.layer_counts is not None
        return torch.where(channel.present, binding.layer_counts, -1).cpu()

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
        if _is_fake(model):
            return
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

    def verify_fused(self, model: torch.nn.Module, vocab_rows: int, *, required: bool = False) -> None:
        """Check that the fused path reproduces the model's own logits on a probe. On a mismatch,
        raise when ``required`` (``fused_lm_head=True``), else fall back to the logits path."""
        head = self.head(model)
        if head is None or _is_fake(model):
            return
        a, b, _ = self._probe(vocab_rows)
        ids = torch.cat([a, b])
        inputs = {"input_ids": ids[None, :-1], "position_ids": torch.arange(11, device=self.device)[None],
                  "use_cache": False}
        temperature = self.config.loss.temperature
        with torch.no_grad():  # both paths without autocast: the check is about the head, not precision
            with head.logits():
                logits = model(**inputs).logits[0]
            plain = logprobs_from_logits(logits, ids[1:], temperature=temperature).double()
            try:
                with head.scoring(ScoreRequest(ids[1:], temperature, self.config.logprob_chunk_size)):
                    scored = model(**inputs).logits
                why = f"by {float((scored.logprobs.double() - plain).abs().max()):.3g}"
                ok = float((scored.logprobs.double() - plain).abs().max()) <= 1e-3 * (1 + float(plain.abs().max()))
            except (TypeError, ValueError, RuntimeError, AttributeError) as exc:  # the forward reworks the head's output
                why, ok = f"(the model's forward does not return its head's output as is: {type(exc).__name__}: {exc})", False
        if ok:
            return
        if not required:
            self.register(model, None)
            return
        raise ValueError(
            f"fused_lm_head: log-probs from hidden states differ from the model's logits {why} (logit scaling, "
            "soft-capping or a non-standard head?); set fused_lm_head=False for this model"
        )

    def verify_shared_prefix(self, model: torch.nn.Module, vocab_rows: int) -> None:
        """Raise unless two sequences scored with a shared prefix match each scored alone (on a probe,
        without autocast: the check is about the key/value cache, not precision)."""
        if _is_fake(model):
            return
        gen = torch.Generator().manual_seed(4321)
        common = torch.randint(0, vocab_rows, (6,), generator=gen).tolist()
        seqs = [common + torch.randint(0, vocab_rows, (n,), generator=gen).tolist() for n in (5, 3)]
        exact = TokenScorer(dataclasses.replace(self.config, autocast="none"), self.device, attention=self.attention)
        exact._heads = self._heads
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


def _is_fake(model: torch.nn.Module) -> bool:
    """A model of fake (shape-only) tensors, built to measure memory: it has no values to check."""
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(p, FakeTensor) for p in model.parameters())


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
