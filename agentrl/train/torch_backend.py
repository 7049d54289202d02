"""The plain PyTorch train backend: any Hugging Face causal LM, on CPU, CUDA or Ascend NPU.

One optimiser step over a :class:`TrainingBatch`:

1. every rank plans the same packing and takes its share (balanced by tokens);
2. old logprobs (recompute mode) and reference logprobs (KL loss) are computed without gradient;
3. each micro-batch's share of the objective is back-propagated (gradient accumulation);
4. gradients are summed over ranks, checked for NaN/inf, clipped, and the optimiser steps.

How the model is held (:mod:`agentrl.train.torch_model`): packed rows are attended per document
without a mask across the row (:mod:`agentrl.train.attention`); tokens are scored from hidden
states inside the forward, never building the ``[tokens, vocab]`` logits (:mod:`agentrl.train.lm_head`);
a bfloat16 model keeps float32 master weights and optimizer state (:mod:`agentrl.train.precision`);
decoder layers may be recomputed in the backward pass (:mod:`agentrl.train.recompute`); with data
parallelism parameters, gradients and optimizer state are sharded over the ranks with FSDP2
(:mod:`agentrl.train.sharding`), and ranks with fewer micro-batches run padding rows so that all
run the same collectives.

The objective's shares are divided by the step's global counts, so the result is the same for any
packing and any number of ranks (tested to 1e-6 in float64). A non-finite loss or gradient stops
the step with :class:`NonFiniteLossError` on every rank before any parameter changes.

Example::

    backend = TorchTrainBackend(model, TorchBackendConfig(device="cpu"), vocab_size=len(tokenizer))
    metrics = backend.train_step(build_training_batch(trajectories))
    backend.save_checkpoint("ckpt/step_1"); backend.export_hf("hf/step_1")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist

from agentrl.algorithms.kinds import RoutingReplay
from agentrl.model_folder import check_model_folder, has_tokenizer
from agentrl.train import torch_state
from agentrl.train.batching import TrainingBatch
from agentrl.train.config import TorchBackendConfig
from agentrl.train.device import resolve_device
from agentrl.train.distributed import DistInfo, all_reduce_gradients, all_reduce_sum
from agentrl.train.lora import LoraAdapter
from agentrl.train.moe import (
    MoeRouting,
    check_moe_lora,
    fit_experts_kernel,
    per_expert_weights,
    routing_shares_prefix,
)
from agentrl.train.objective import StepCounts, micro_batch_objective, sft_objective
from agentrl.train.packing import MicroBatch, collate, padding_micro_batch, plan_micro_batches
from agentrl.train.prefix import plan_shared_prefix_micro_batches, shared_prefix_layout
from agentrl.train.scoring import TokenScorer
from agentrl.train.sharding import sharded_named_weights
from agentrl.train.torch_model import prepare_model, update_parameters

__all__ = ["NonFiniteLossError", "TorchTrainBackend"]

Objective = Literal["policy", "sft"]
_ROUTING_COUNTS = ["moe_routed", "moe_used_differs", "moe_router_differs", "moe_unrouted"]


class NonFiniteLossError(RuntimeError):
    """The loss or gradient of a step was NaN/inf; ``diagnostics`` says where. Nothing was updated."""

    def __init__(self, message: str, diagnostics: dict[str, Any]) -> None:
        super().__init__(f"{message}; diagnostics: {diagnostics}")
        self.diagnostics = diagnostics


class TorchTrainBackend:
    """Trains a Hugging Face causal LM with the GRPO-family objective of ``config.loss``.

    The model is kept in eval mode (no dropout), so scoring and training forwards agree.
    Not thread-safe. In data parallel, construct one per rank after ``torch.distributed`` is
    initialised, with identical weights, and call every method on every rank with the same batch.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: TorchBackendConfig | None = None,
        *,
        ref_model: torch.nn.Module | None = None,
        vocab_size: int | None = None,
        tokenizer: Any | None = None,
    ) -> None:
        self.config = config or TorchBackendConfig()
        self.tokenizer = tokenizer  # written next to the weights by export_hf
        if vocab_size is None and tokenizer is not None:
            vocab_size = len(tokenizer)
        cfg = self.config
        self.device = resolve_device(cfg.device)
        self.dtype = cfg.torch_dtype  # the compute dtype
        self.dist = DistInfo.current()
        # a LoRA run replicates its frozen base: only the adapter's gradients are summed over ranks
        self.sharded = cfg.sharding == "fsdp" or (cfg.sharding == "auto" and self.dist.world_size > 1
                                                  and cfg.lora is None)
        # Both need one forward per row: a shared prefix runs two (and its cache cannot be recomputed).
        self.shared_prefix = cfg.shared_prefix and not self.sharded and cfg.activation_checkpointing == "none"
        self.vocab_rows = _embedding_rows(model)
        if vocab_size is not None and vocab_size > self.vocab_rows:
            raise ValueError(
                f"vocab_size: the tokenizer has {vocab_size} tokens but the model's input embedding has "
                f"{self.vocab_rows} rows; ids >= {self.vocab_rows} would be out of range (wrong tokenizer or model?)"
            )
        if cfg.loss.kl_loss_coef > 0 and ref_model is None and cfg.lora is None:
            raise ValueError("ref_model: loss.kl_loss_coef > 0 needs a reference model; pass ref_model=")
        if ref_model is not None and cfg.lora is not None:
            raise ValueError("ref_model: a LoRA backend's reference is its own base model (the adapter disabled); "
                             "expected ref_model=None")
        # mixture of experts: the routers replay (or compare with) the engine's routing; installed on the
        # Hugging Face model before it is wrapped (LoRA, checkpointing, FSDP keep the modules)
        check_moe_lora(getattr(model, "config", None), cfg.lora)
        for held in (model, ref_model):
            if held is not None:
                fit_experts_kernel(held, cfg.torch_dtype)
        self.routing = MoeRouting.install(model, replay=cfg.loss.routing_replay)
        ref_routing = MoeRouting.install(ref_model, replay=cfg.loss.routing_replay) if ref_model is not None else None
        prepared = prepare_model(model, cfg, self.device, sharded=self.sharded, trainable=True)
        self.model, self.attention = prepared.model, prepared.attention
        self.adapter = prepared.adapter  # LoRA: the adapter that trains (None: the model itself)
        self.ref_model: torch.nn.Module | None = None
        self.scorer = TokenScorer(cfg, self.device, attention=self.attention)
        self.scorer.register(self.model, prepared.head)
        self.scorer.register_routing(self.model, self.routing)
        if ref_model is not None:
            ref = prepare_model(ref_model, cfg, self.device, sharded=self.sharded, trainable=False)
            self.ref_model = ref.model
            self.scorer.register(ref.model, ref.head)
            self.scorer.register_routing(ref.model, ref_routing)
        params, self.masters = update_parameters(self.model, cfg, sharded=self.sharded)
        self.update_params = params  # what the optimizer steps (and clipping and the all-reduce read)
        opt = cfg.optimizer
        fused = not self.sharded and bool(params) and params[0].device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            params, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay, eps=opt.eps,
            **({"fused": True} if fused else {"foreach": False}),  # no whole-model temporaries
        )
        self.step = 0
        torch.manual_seed(cfg.seed)
        if cfg.verify_packing:
            self.scorer.verify_packing(self.model, self.vocab_rows)
        self.scorer.verify_fused(self.model, self.vocab_rows, required=cfg.fused_lm_head is True)
        if self.shared_prefix:
            self.scorer.verify_shared_prefix(self.model, self.vocab_rows)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, config: TorchBackendConfig | None = None, *, with_ref_model: bool = False,
        vocab_size: int | None = None,
    ) -> TorchTrainBackend:
        """Load a model (and optionally a frozen copy as reference) from a local Hugging Face folder.

        The folder is checked first (one-line :class:`~agentrl.model_folder.ModelFolderError`). Its
        tokenizer, when it has one, is loaded too: it bounds ``vocab_size`` unless one is given and
        :meth:`export_hf` writes it next to each exported checkpoint.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = check_model_folder(path, needs=("config", "weights"), what="from_pretrained: path")
        cfg = config or TorchBackendConfig()
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=cfg.torch_dtype)
        with_ref_model = with_ref_model and cfg.lora is None  # LoRA: the base with the adapter disabled
        ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=cfg.torch_dtype) if with_ref_model else None
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True) if has_tokenizer(folder) else None
        return cls(model, cfg, ref_model=ref, vocab_size=vocab_size, tokenizer=tokenizer)

    # -- forward passes ------------------------------------------------------------------------
    def _plan(self, batch: TrainingBatch, micro_batches: list[list[int]] | None) -> list[MicroBatch]:
        if not batch.sequences:
            raise ValueError("batch: expected at least one training sequence, got an empty batch")
        for i, seq in enumerate(batch.sequences):
            bad = [t for t in seq.tokens if not 0 <= t < self.vocab_rows]
            if bad:
                raise ValueError(
                    f"batch.sequences[{i}].tokens: id {bad[0]} (rollout {seq.rollout_id!r}) is outside the model's "
                    f"vocabulary [0, {self.vocab_rows}); tokenizer and model do not match"
                )
        cfg = self.config
        if micro_batches is None and self.shared_prefix:
            micro_batches = plan_shared_prefix_micro_batches(
                [s.tokens for s in batch.sequences], cfg.packing, min_prefix=cfg.shared_prefix_min_tokens,
                world_size=self.dist.world_size, rank=self.dist.rank)
        elif micro_batches is None:
            lengths = [len(s.tokens) - 1 for s in batch.sequences]
            micro_batches = plan_micro_batches(lengths, cfg.packing, world_size=self.dist.world_size,
                                               rank=self.dist.rank)
        float_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        # A one-token sequence has nothing to score (and nothing to train); it only counts as a rollout.
        scored = [[i for i in idx if len(batch.sequences[i].tokens) > 1] for idx in micro_batches]
        mbs = []
        for idx in scored:
            if not idx:
                continue
            mb = collate(batch.sequences, idx, dtype=float_dtype, device=self.device)
            if self.shared_prefix:
                mb.prefix = shared_prefix_layout([batch.sequences[i].tokens for i in idx],
                                                 min_prefix=cfg.shared_prefix_min_tokens, device=self.device)
                if mb.prefix is not None and self.routing is not None and not routing_shares_prefix(mb):
                    mb.prefix = None  # the engine routed the shared prefix differently per sequence: one row each
            mbs.append(mb)
        if self.sharded:  # every rank runs as many forwards (each gathers parameters collectively)
            most = torch.tensor([len(mbs)], device=self.device)
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            mbs += [padding_micro_batch(dtype=float_dtype, device=self.device) for _ in range(int(most) - len(mbs))]
        return mbs

    def compute_logprobs(self, batch: TrainingBatch, *, reference: bool = False) -> list[list[float]]:
        """Per sequence, position-aligned logprobs of its tokens (entry 0 is 0.0) under the current
        (or the reference) model, without gradient. In data parallel each rank scores its share
        and one summing all-reduce gives every rank the whole batch's logprobs."""
        model, context = self._scoring_model(reference)
        lengths = [len(s.tokens) - 1 for s in batch.sequences]
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + max(n, 0))
        flat = torch.zeros(offsets[-1], dtype=torch.float64, device=self.device)
        for mb in self._plan(batch, None):
            with context():
                scored = self.scorer.logprobs(model, mb)
            if mb.padding:
                continue
            for idx, piece in zip(mb.indices, mb.split(scored), strict=True):
                flat[offsets[idx]: offsets[idx + 1]] = piece.double()
        flat = all_reduce_sum(flat).cpu()
        return [[0.0, *flat[offsets[i]: offsets[i + 1]].tolist()] for i in range(len(batch.sequences))]

    def routing_differences(self, batch: TrainingBatch) -> list[Any]:
        """Per sequence, a numpy ``int32`` array over its tokens: at each position with the engine's
        routing (the ``routed_experts`` channel), the number of MoE layers whose router here picks other
        experts; -1 elsewhere (the last token included). For inspection
        (:func:`~agentrl.train.moe.mark_routing_differences`); one forward without gradient."""
        if self.routing is None:
            raise ValueError("routing_differences: the model is not a mixture of experts")
        out = [np.full(len(s.tokens), -1, dtype=np.int32) for s in batch.sequences]
        for mb in self._plan(batch, None):
            if mb.padding:
                continue
            counts = self.scorer.routing_differences(self.model, mb)
            for idx, piece in zip(mb.indices, mb.split(counts), strict=True):
                out[idx][: len(piece)] = piece.numpy()
        return out

    def _scoring_model(self, reference: bool) -> tuple[torch.nn.Module, Callable[[], AbstractContextManager[Any]]]:
        """The model that scores (the policy, or the reference) and the context it scores in: a LoRA
        backend's reference is its own model with the adapter disabled."""
        if not reference:
            return self.model, nullcontext
        if self.adapter is not None:
            return self.model, self.adapter.disabled
        if self.ref_model is None:
            raise ValueError("reference: no reference model was given to this backend")
        return self.ref_model, nullcontext

    def fill_old_logprobs(self, batch: TrainingBatch) -> None:
        """Score the batch under the current weights and store the result as every sequence's
        ``old_logprobs``. With ``old_logprobs="recompute"``, sequences that carry them are not
        re-scored, so several optimiser steps on one rollout batch (PPO epochs, mini-batches) keep
        the ratio relative to the policy that started them."""
        for seq, lps in zip(batch.sequences, self.compute_logprobs(batch), strict=True):
            seq.old_logprobs = lps

    # -- the step ------------------------------------------------------------------------------
    def forward_backward(
        self, batch: TrainingBatch, *, micro_batches: list[list[int]] | None = None,
        objective: Objective = "policy",
    ) -> dict[str, float]:
        """Accumulate this rank's share of the step gradient, then sum gradients over ranks.

        In ``old_logprobs="recompute"`` mode, a micro-batch whose sequences all carry
        ``old_logprobs`` uses them; others are scored first (no gradient). See
        :meth:`fill_old_logprobs` for several steps on one batch. Likewise, with a KL loss, a
        micro-batch whose sequences all carry ``ref_logprobs`` is not re-scored by the reference model.

        ``micro_batches`` overrides the packing plan (lists of batch indices for this rank).
        ``objective="sft"``: the supervised objective instead (:func:`~agentrl.train.objective.sft_objective`:
        mean NLL of the mask-1 tokens; no old or reference logprobs are computed; ``config.loss`` is
        not read but for its temperature, which should be 1.0 for SFT).
        Returns step metrics (summed over ranks). Raises :class:`NonFiniteLossError` on NaN/inf.
        """
        if objective not in ("policy", "sft"):
            raise ValueError(f"objective={objective!r}: expected 'policy' or 'sft'")
        mbs = self._plan(batch, micro_batches)
        if objective == "policy":
            self._fill_side_logprobs(mbs)
        counts = StepCounts(num_rollouts=batch.num_rollouts, num_tokens=batch.num_trainable_tokens)
        self._zero_grad()
        sums: dict[str, torch.Tensor] = {}
        bad: dict[str, Any] | None = None
        for k, mb in enumerate(mbs):
            with self.adapter.dropout_on() if self.adapter is not None else nullcontext():
                loss, metrics = (self._micro_batch(mb, counts) if objective == "policy"
                                 else self._sft_micro_batch(mb, counts))
            if bad is None and not torch.isfinite(loss.detach()).all():
                bad = self._diagnose(batch, mb, k, loss)
            for name, value in metrics.items():
                sums[name] = sums.get(name, torch.zeros((), dtype=torch.float64)) + value.double().cpu()
            sums["loss"] = sums.get("loss", torch.zeros((), dtype=torch.float64)) + loss.detach().double().cpu()
        if not self.sharded:  # FSDP reduce-scatters (sums) gradients in the backward pass itself
            all_reduce_gradients(self.update_params)
        real = [mb for mb in mbs if not mb.padding]
        run = sum(mb.prefix.num_tokens if mb.prefix is not None else mb.num_tokens for mb in real)
        return self._finish_metrics(sums, bad, len(real), (sum(mb.num_tokens for mb in real), run), objective)

    def _fill_side_logprobs(self, mbs: list[MicroBatch]) -> None:
        """Old logprobs (recompute mode) and reference logprobs (KL loss) of the micro-batches that
        lack them. Sharded, a forward on one rank needs one on every rank: a micro-batch is scored
        when any rank's micro-batch at that position needs it (padding rows included)."""
        cfg = self.config.loss
        jobs: list[tuple[str, bool]] = []
        if cfg.old_logprobs == "recompute":
            jobs.append(("old_logprobs", False))
        if cfg.kl_loss_coef > 0 and (self.ref_model is not None or self.adapter is not None):
            jobs.append(("ref_logprobs", True))
        for field, reference in jobs:
            model, context = self._scoring_model(reference)
            need = [float(getattr(mb, field) is None and not mb.padding) for mb in mbs]
            if self.sharded and need:
                flags = torch.tensor(need, device=self.device)
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
                need = flags.tolist()
            for mb, wanted in zip(mbs, need, strict=True):
                if wanted:
                    with context():
                        scored = self.scorer.logprobs(model, mb)
                    if getattr(mb, field) is None:
                        setattr(mb, field, scored)

    def _micro_batch(self, mb: MicroBatch, counts: StepCounts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.config.loss
        logprobs, entropy, anchor = self.scorer.scores(
            self.model, mb, entropy="grad" if cfg.entropy_coef > 0 else "metric")
        loss, metrics = micro_batch_objective(mb, logprobs, entropy, cfg, counts)
        if mb.num_trainable == 0:
            # Keep the graph connected to every parameter used, so backward runs the same on all ranks.
            loss = loss + 0.0 * anchor.sum()
        loss.backward()
        return loss, metrics

    def _sft_micro_batch(self, mb: MicroBatch, counts: StepCounts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logprobs, _, anchor = self.scorer.scores(self.model, mb, entropy="none")
        loss, metrics = sft_objective(mb, logprobs, counts)
        if mb.num_trainable == 0:
            loss = loss + 0.0 * anchor.sum()
        loss.backward()
        return loss, metrics

    def _diagnose(self, batch: TrainingBatch, mb: MicroBatch, index: int, loss: torch.Tensor) -> dict[str, Any]:
        # Sharded, a forward on one rank only would wait for the others forever: report the loss alone.
        logprobs = self.scorer.logprobs(self.model, mb) if not self.sharded else torch.zeros(1)
        return {
            "step": self.step, "rank": self.dist.rank, "micro_batch": index, "loss": float(loss.detach()),
            "rollout_ids": [batch.sequences[i].rollout_id for i in mb.indices],
            "nonfinite_logprobs": int((~torch.isfinite(logprobs)).sum()),
            "nonfinite_advantages": int((~torch.isfinite(mb.advantages)).sum()),
            "nonfinite_rollout_logprobs": int((~torch.isfinite(mb.rollout_logprobs)).sum()),
            "nonfinite_params": [n for n, p in self.model.named_parameters() if not torch.isfinite(_local(p)).all()][:5],
        }

    def _finish_metrics(
        self, sums: dict[str, torch.Tensor], bad: dict[str, Any] | None, n_mbs: int, n_tokens: tuple[int, int],
        objective: Objective = "policy",
    ) -> dict[str, float]:
        # Every rank takes part in the same collectives: the names are fixed by the config and the objective.
        names = ["loss", "pg_loss", "clipfrac", "ppo_kl", "train_rollout_abs_diff", "entropy"]
        if objective == "sft":
            names = ["loss"]
        elif self.config.loss.kl_loss_coef > 0:
            names.append("kl")
        if self.routing is not None:  # counts of this rank's training forwards (see agentrl.train.moe)
            stats, self.routing.stats = self.routing.stats, type(self.routing.stats)()
            if objective == "policy":
                sums.update({name: torch.tensor(float(v), dtype=torch.float64) for name, v in zip(
                    _ROUTING_COUNTS, (stats.routed, stats.used_differs, stats.router_differs, stats.unrouted),
                    strict=True)})
                names += _ROUTING_COUNTS
        vec = torch.stack([sums.get(n, torch.zeros((), dtype=torch.float64)) for n in names]
                          + [torch.tensor(float(bad is not None), dtype=torch.float64),
                             torch.tensor(float(n_mbs), dtype=torch.float64),
                             torch.tensor(float(n_tokens[0]), dtype=torch.float64),
                             torch.tensor(float(n_tokens[1]), dtype=torch.float64)])
        vec = all_reduce_sum(vec.to(self.device)).cpu()
        if bad is not None or float(vec[len(names)]) > 0 or not bool(torch.isfinite(vec[: len(names)]).all()):
            self._zero_grad()
            raise NonFiniteLossError(
                f"non-finite loss at step {self.step}; the step was not applied",
                bad or {"step": self.step, "rank": self.dist.rank, "where": "another rank"},
            )
        metrics = {name: float(vec[i]) for i, name in enumerate(names)}
        if _ROUTING_COUNTS[0] in metrics:
            metrics.update(self._routing_metrics(*(metrics.pop(n) for n in _ROUTING_COUNTS)))
        metrics["micro_batches"] = float(vec[len(names) + 1])
        metrics["packed_tokens"] = float(vec[len(names) + 2])
        metrics["forward_tokens"] = float(vec[len(names) + 3])  # fewer than packed_tokens with shared prefixes
        return metrics

    def _routing_metrics(self, routed: float, used: float, router: float, unrouted: float) -> dict[str, float]:
        """The step's routing figures (summed over ranks); with replay on, no routed token may have
        used experts other than the engine's."""
        assert self.routing is not None
        if self.config.loss.routing_replay is RoutingReplay.ROLLOUT and used > 0:
            self._zero_grad()
            raise RuntimeError(f"routing replay: {int(used)} of {int(routed)} tokens were trained through experts "
                               "other than the engine's; the step was not applied")
        n = max(routed, 1.0)
        return {"moe/routing_differs": used / n, "moe/router_disagrees": router / n, "moe/routed_tokens": routed,
                "moe/unrouted_tokens": unrouted,
                "moe/replay": float(self.config.loss.routing_replay is RoutingReplay.ROLLOUT)}

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.masters is not None:
            self.masters.zero_grad()

    def clip_gradients(self) -> torch.Tensor:
        """Clip the (already summed) gradient to ``optimizer.grad_clip``; returns the norm before
        clipping (a global norm under FSDP)."""
        clip = self.config.optimizer.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.update_params, clip if clip is not None else math.inf)
        full = getattr(norm, "full_tensor", None)
        return full() if callable(full) else norm

    def apply_update(self) -> None:
        """Step the optimizer on the clipped gradient, round master weights into the model, zero
        the gradients."""
        self.optimizer.step()
        if self.masters is not None:
            self.masters.copy_to_model()
        self._zero_grad()

    def optim_step(self) -> dict[str, float]:
        """Clip the (already summed) gradient, check it is finite, step the optimiser."""
        norm = self.clip_gradients()
        if not math.isfinite(float(norm)):
            self._zero_grad()
            raise NonFiniteLossError(f"non-finite gradient norm at step {self.step}; the step was not applied",
                                     {"step": self.step, "grad_norm": float(norm)})
        self.apply_update()
        self.step += 1
        return {"grad_norm": float(norm), "lr": float(self.optimizer.param_groups[0]["lr"]), "step": float(self.step)}

    def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """``forward_backward`` then ``optim_step``; returns their metrics merged."""
        metrics = self.forward_backward(batch)
        metrics.update(self.optim_step())
        return metrics

    def sft_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One supervised step: mean next-token NLL over the batch's mask-1 tokens, then ``optim_step``.
        ``metrics["loss"]`` is that mean NLL (nats per trained token, before the update)."""
        metrics = self.forward_backward(batch, objective="sft")
        metrics.update(self.optim_step())
        return metrics

    # -- state -----------------------------------------------------------------------------------
    def save_checkpoint(self, directory: str | Path) -> Path:
        """Write model, master weights, optimiser and step (rank 0) and this rank's RNG state
        (:mod:`agentrl.train.torch_state`); returns the directory. Collective under FSDP."""
        return torch_state.save_checkpoint(self, directory)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote (every rank reads the rank-0 file)."""
        torch_state.load_checkpoint(self, directory)

    def export_hf(self, directory: str | Path, *, tokenizer: Any | None = None) -> Path:
        """Save the model in Hugging Face format (config + safetensors in ``config.export_dtype``) with
        its tokenizer, so that the folder serves on its own (an engine launch or
        ``update_weights_from_disk`` loads both). Collective under FSDP.

        ``tokenizer`` defaults to the backend's (``from_pretrained`` loads the model folder's); with
        neither, ``ValueError`` — a folder without a tokenizer cannot start an engine.
        """
        return torch_state.export_hf(self, directory, tokenizer)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the current weights, detached, for syncing inference engines, under the
        checkpoint's names (a mixture of experts by expert: :func:`~agentrl.train.moe.per_expert_weights`).
        Under FSDP each tensor is gathered whole on every rank (every rank must iterate, in step)."""
        weights = self._named_weights()
        yield from per_expert_weights(weights) if self.routing is not None else weights

    def _named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.sharded:
            yield from sharded_named_weights(self.model)
            return
        if self.adapter is not None:  # LoRA: the weights the engine would serve with the adapter merged
            yield from self.adapter.merged_state().items()
            return
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.detach()

    def export_adapter(self, directory: str | Path) -> Path:
        """LoRA: the adapter as a peft folder (``adapter_config.json``, ``adapter_model.safetensors`` in
        ``config.export_dtype``), from rank 0. ``ValueError`` without ``config.lora``."""
        adapter = self._require_adapter("export_adapter")
        path = Path(directory)
        if self.dist.rank == 0:
            adapter.save(path, self.config.export_torch_dtype)
        return path

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        """LoRA: the adapter's weights under the engine's names, on the host, in ``config.export_dtype``."""
        return self._require_adapter("adapter_tensors").tensors(self.config.export_torch_dtype)

    def _require_adapter(self, what: str) -> LoraAdapter:
        if self.adapter is None:
            raise ValueError(f"{what}: this backend trains the whole model (config.lora is None); expected a LoRA "
                             "backend")
        return self.adapter

    def offloadable(self) -> list[torch.Tensor]:
        """Tensors besides the optimizer state that may wait in host memory between steps: the
        float32 master weights (the model's own weights stay for scoring and export)."""
        return list(self.masters.params) if self.masters is not None else []


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor itself otherwise)."""
    local = getattr(tensor, "to_local", None)
    return local() if callable(local) else tensor


def _embedding_rows(model: torch.nn.Module) -> int:
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    weight = getattr(emb, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise TypeError("model: expected a Hugging Face causal LM with get_input_embeddings()")
    return int(weight.shape[0])
