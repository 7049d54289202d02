"""The megatron-core train backend: the :class:`~agentrl.train.TorchTrainBackend` contract with TP/PP/DP.

One optimiser step over a :class:`TrainingBatch`:

1. every data-parallel replica plans the same packing as the torch backend and takes its share
   (all ranks of one replica — its TP × PP group — process the same micro-batches);
2. old logprobs (recompute mode) and reference logprobs (KL loss) come from forward-only passes of
   Megatron's schedule;
3. the GRPO-family objective of ``config.loss`` (the torch backend's
   :func:`~agentrl.train.objective.micro_batch_objective`, on vocab-parallel logprobs) runs inside
   Megatron's forward-backward schedule; a micro-batch without trainable tokens adds
   ``0 · logits.sum()`` so every rank runs the same backward and no collective waits forever;
4. gradients are summed over data-parallel ranks (and tied embeddings over the first and last
   stages), the global norm is checked and clipped, and Megatron's optimizer steps.

Results equal the torch backend's on the same batch (tested on CPU in float32 with TP=2).
Every public method is collective: call it on every rank, with the same arguments.

A mixture-of-experts model (``qwen3_moe``) adds expert parallelism: the ranks of one expert-parallel
group run the same number of micro-batches (padding rows where a rank has fewer, since every MoE
layer exchanges tokens among them), and every forward can replay the engine's routing
(:mod:`agentrl.train.megatron.moe`); a training step then reports the routing metrics too.

Example::

    backend = MegatronTrainBackend.from_pretrained("models/qwen3-4b", MegatronBackendConfig(tensor_parallel_size=2))
    metrics = backend.train_step(build_training_batch(trajectories))
    backend.export_hf("hf/step_1")
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.algorithms.fused_logprobs import scores_from_hidden
from agentrl.algorithms.kinds import RoutingReplay
from agentrl.model_folder import check_model_folder, has_tokenizer
from agentrl.train.batching import TrainingBatch
from agentrl.train.device import device_module, resolve_device
from agentrl.train.megatron.attention import resolve_attention
from agentrl.train.megatron.config import MegatronBackendConfig
from agentrl.train.megatron.moe import (
    MoeRouting,
    check_routing_channels,
    resolve_grouped_gemm,
    step_routing_metrics,
)
from agentrl.train.megatron.parallel import ParallelLayout, setup_model_parallel
from agentrl.train.megatron.qwen3 import (
    Qwen3Spec,
    build_gpt_model,
    check_transformer_config,
    transformer_config,
)
from agentrl.train.megatron.schedule import run_schedule, unwrap
from agentrl.train.megatron.state import MegatronCheckpointer
from agentrl.train.megatron.vocab_parallel import vocab_parallel_logprobs
from agentrl.train.megatron.weights import iter_hf_weights, load_hf_weights, read_hf_state
from agentrl.train.objective import StepCounts, micro_batch_objective, sft_objective
from agentrl.train.packing import MicroBatch, collate, padding_micro_batch, plan_micro_batches
from agentrl.train.torch_backend import NonFiniteLossError

__all__ = ["MegatronTrainBackend"]


class MegatronTrainBackend:
    """Trains a Hugging Face Qwen3 model as a megatron-core ``GPTModel`` (see the module doc).

    ``hf_state``: the Hugging Face tensors (every rank reads the full set and keeps its shards);
    ``hf_config``: the model's ``transformers`` config (written next to exported weights).
    ``with_ref_model``: keep a frozen copy of the initial weights for KL-loss reference logprobs.
    Not thread-safe.
    """

    def __init__(self, hf_state: Mapping[str, torch.Tensor], hf_config: Any,
                 config: MegatronBackendConfig | None = None, *, with_ref_model: bool = False,
                 tokenizer: Any | None = None, vocab_size: int | None = None) -> None:
        self.config = config or MegatronBackendConfig()
        self.hf_config = hf_config
        self.tokenizer = tokenizer
        self.spec = Qwen3Spec.from_hf(hf_config)
        cfg = self.config
        self.device = resolve_device(cfg.device)
        cpu_init = self.device.type == "cpu"
        self.padded_vocab = cfg.padded_vocab_size(self.spec.vocab_size)
        self.grouped_gemm = resolve_grouped_gemm(cfg.moe_grouped_gemm, self.device) if self.spec.is_moe else False
        # Compare the two configs before any accelerator or process group is touched.
        check_transformer_config(self.spec, transformer_config(self.spec, cfg, cpu_init=cpu_init,
                                                               grouped_gemm=self.grouped_gemm),
                                 rotary_base=self.spec.rope_theta, vocab_size=self.padded_vocab,
                                 share_embeddings=self.spec.tie_word_embeddings)
        if vocab_size is None and tokenizer is not None:
            vocab_size = len(tokenizer)
        if vocab_size is not None and vocab_size > self.spec.vocab_size:
            raise ValueError(f"vocab_size: the tokenizer has {vocab_size} tokens but the model's vocabulary has "
                             f"{self.spec.vocab_size} rows (wrong tokenizer or model?)")
        if cfg.loss.kl_loss_coef > 0 and not with_ref_model:
            raise ValueError("with_ref_model: loss.kl_loss_coef > 0 needs a reference model; pass with_ref_model=True")
        self.attention = resolve_attention(cfg.attention, self.device)
        self._scoring_model: Any = None
        self.head = "hidden" if cfg.fused_lm_head else "logits"
        module = device_module(self.device)
        if module is not None:
            module.set_device(self.device)
        torch.manual_seed(cfg.seed)
        self.layout: ParallelLayout = setup_model_parallel(cfg, self.device)
        self.routing: dict[int, MoeRouting] = {}  # per model (id), for MoE models
        self.model = self._build(hf_state, trainable=True)
        self.ref_model = self._build(hf_state, trainable=False) if with_ref_model else None
        self.optimizer = self._optimizer()
        self.step = 0
        self.checkpointer = MegatronCheckpointer(self)

    @classmethod
    def from_pretrained(cls, path: str | Path, config: MegatronBackendConfig | None = None, *,
                        with_ref_model: bool = False, vocab_size: int | None = None) -> MegatronTrainBackend:
        """Build from a local Hugging Face folder (config, safetensors and, if present, tokenizer)."""
        from transformers import AutoConfig, AutoTokenizer

        folder = check_model_folder(path, needs=("config", "weights"), what="from_pretrained: path")
        hf_config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True) if has_tokenizer(folder) else None
        return cls(read_hf_state(folder), hf_config, config, with_ref_model=with_ref_model, tokenizer=tokenizer,
                   vocab_size=vocab_size)

    # -- construction ----------------------------------------------------------------------------
    def _build(self, hf_state: Mapping[str, torch.Tensor], *, trainable: bool) -> Any:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        cfg, layout = self.config, self.layout
        model = build_gpt_model(self.spec, cfg, pre_process=layout.first_stage, post_process=layout.last_stage,
                                cpu_init=self.device.type == "cpu", attention=self.attention,
                                grouped_gemm=self.grouped_gemm)
        load_hf_weights(model, hf_state, self.spec, layout, self.padded_vocab)
        model = model.to(self.device).eval()  # eval: no dropout anywhere (it is 0 anyway, checked)
        routing = MoeRouting(model, replay=self._replay) if self.spec.is_moe else None
        if not trainable:
            if routing is not None:
                self.routing[id(model)] = routing
            return model.requires_grad_(False)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=self._distributed_optimizer)
        # The model config's calculate_per_token_loss makes DDP sum (not average) over DP ranks.
        wrapped = DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)
        if routing is not None:
            self.routing[id(wrapped)] = routing
        # Megatron recomputes only in training mode; with dropout 0 that mode changes nothing else.
        return wrapped.train() if cfg.activation_checkpointing != "none" else wrapped.eval()

    @property
    def _replay(self) -> bool:
        """Whether MoE forwards replay the engine's routing (``loss.routing_replay``)."""
        return self.config.loss.routing_replay is RoutingReplay.ROLLOUT

    @property
    def _distributed_optimizer(self) -> bool:
        choice = self.config.use_distributed_optimizer
        return self.device.type != "cpu" if choice is None else choice

    def _optimizer(self) -> Any:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        opt, dtype = self.config.optimizer, self.config.torch_dtype
        mconfig = OptimizerConfig(
            optimizer="adam", lr=opt.lr, weight_decay=opt.weight_decay, adam_beta1=opt.betas[0],
            adam_beta2=opt.betas[1], adam_eps=opt.eps, clip_grad=0.0,  # clipping is ours: see optim_step
            bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=dtype,
            use_distributed_optimizer=self._distributed_optimizer)
        # {}: weight decay on every parameter, as the torch backend (Megatron's default skips norms).
        return get_megatron_optimizer(mconfig, [self.model], config_overrides={})

    # -- planning and scoring --------------------------------------------------------------------
    def _plan(self, batch: TrainingBatch, micro_batches: list[list[int]] | None = None) -> list[MicroBatch]:
        if not batch.sequences:
            raise ValueError("batch: expected at least one training sequence, got an empty batch")
        for i, seq in enumerate(batch.sequences):
            bad = [t for t in seq.tokens if not 0 <= t < self.spec.vocab_size]
            if bad:
                raise ValueError(f"batch.sequences[{i}].tokens: id {bad[0]} (rollout {seq.rollout_id!r}) is outside "
                                 f"the model's vocabulary [0, {self.spec.vocab_size})")
        spec = self.spec
        if spec.is_moe:
            check_routing_channels(batch.sequences, layers=spec.num_layers, top_k=spec.experts_per_token,
                                   experts=spec.num_experts)
        if micro_batches is None:
            lengths = [len(s.tokens) - 1 for s in batch.sequences]
            micro_batches = plan_micro_batches(lengths, self.config.packing, world_size=self.layout.dp_size,
                                               rank=self.layout.dp_rank)
        scored = [[i for i in idx if len(batch.sequences[i].tokens) > 1] for idx in micro_batches]
        mbs = [collate(batch.sequences, idx, dtype=torch.float32, device=self.device) for idx in scored if idx]
        if self.layout.ep_size > 1:  # every MoE layer exchanges tokens among the expert-parallel ranks
            most = torch.tensor([len(mbs)], device=self.device)
            dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.layout.dp_group)
            mbs += [padding_micro_batch(device=self.device) for _ in range(int(most) - len(mbs))]
        return mbs

    def _logprobs(self, mb: MicroBatch, logits: torch.Tensor, *, entropy_grad: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs and entropy of ``mb``'s targets from the last stage's output: its logits slice, or
        (fused head) its final hidden states and this rank's slice of the output embedding."""
        layout = self.layout
        if self.head == "hidden":
            return self._fused_logprobs(mb, logits, entropy_grad=entropy_grad)
        return vocab_parallel_logprobs(
            logits, mb.target_ids, vocab_start=layout.tp_rank * logits.shape[-1], valid_vocab=self.spec.vocab_size,
            group=layout.tp_group if layout.tp_size > 1 else None, temperature=self.config.loss.temperature,
            chunk_size=self.config.logprob_chunk_size, entropy_grad=entropy_grad)

    def _fused_logprobs(self, mb: MicroBatch, hidden: torch.Tensor, *, entropy_grad: bool
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region

        layout, stage = self.layout, unwrap(self._scoring_model)  # the model the schedule is running
        weight = (stage.shared_embedding_or_output_weight() if stage.share_embeddings_and_output_weights
                  else stage.output_layer.weight)
        group = layout.tp_group if layout.tp_size > 1 else None
        if group is not None:  # the output layer's input: identity forward, all-reduced gradient
            hidden = copy_to_tensor_model_parallel_region(hidden)
        ops = {"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}

        def all_reduce(tensor: torch.Tensor, op: str) -> None:
            dist.all_reduce(tensor, op=ops[op], group=group)

        lp, ent = scores_from_hidden(
            hidden, weight, mb.target_ids, temperature=self.config.loss.temperature,
            chunk_size=self.config.logprob_chunk_size, entropy="grad" if entropy_grad else "metric",
            vocab_start=layout.tp_rank * weight.shape[0], valid_vocab=self.spec.vocab_size,
            all_reduce=all_reduce if group is not None else None)
        assert ent is not None
        return lp, ent

    def _score_only(self, model: Any, mbs: list[MicroBatch]) -> list[torch.Tensor]:
        """Logprobs of each micro-batch (no gradient); on the last stage only, else an empty list."""
        def score(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            lp, _ = self._logprobs(mb, logits)
            return torch.zeros((), device=logits.device), {"logprobs": lp.detach()}

        self._scoring_model = model
        routing = self.routing.get(id(model))
        if routing is not None:
            routing.start(record=False)
        try:
            with torch.no_grad():
                out = run_schedule(model, mbs, score, forward_only=True, attention=self.attention, head=self.head,
                                   hooks=routing)
        finally:
            if routing is not None:
                routing.finish()
        return [values["logprobs"] for values in out]

    def _all_reduce_world(self, tensor: torch.Tensor) -> torch.Tensor:
        if dist.get_world_size() > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def compute_logprobs(self, batch: TrainingBatch, *, reference: bool = False) -> list[list[float]]:
        """Per sequence, position-aligned logprobs of its tokens (entry 0 is 0.0), the same on every rank."""
        model = self.ref_model if reference else self.model
        if model is None:
            raise ValueError("reference: no reference model was built (with_ref_model=False)")
        lengths = [len(s.tokens) - 1 for s in batch.sequences]
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + max(n, 0))
        flat = torch.zeros(offsets[-1], dtype=torch.float64, device=self.device)
        mbs = self._plan(batch)
        scored = self._score_only(model, mbs)
        if self.layout.reports:
            for mb, lp in zip(mbs, scored, strict=True):
                if mb.padding:
                    continue
                for idx, piece in zip(mb.indices, mb.split(lp), strict=True):
                    flat[offsets[idx]: offsets[idx + 1]] = piece.double()
        flat = self._all_reduce_world(flat).cpu()
        return [[0.0, *flat[offsets[i]: offsets[i + 1]].tolist()] for i in range(len(batch.sequences))]

    def fill_old_logprobs(self, batch: TrainingBatch) -> None:
        """Store the current policy's logprobs as every sequence's ``old_logprobs``."""
        for seq, lps in zip(batch.sequences, self.compute_logprobs(batch), strict=True):
            seq.old_logprobs = lps

    # -- the step --------------------------------------------------------------------------------
    def forward_backward(self, batch: TrainingBatch, *, micro_batches: list[list[int]] | None = None,
                         objective: str = "policy") -> dict[str, float]:
        """Accumulate the step gradient (summed over data-parallel ranks); returns step metrics.
        Same semantics as :meth:`TorchTrainBackend.forward_backward`."""
        if objective not in ("policy", "sft"):
            raise ValueError(f"objective={objective!r}: expected 'policy' or 'sft'")
        mbs = self._plan(batch, micro_batches)
        cfg = self.config.loss
        if objective == "policy":
            self._fill_side_logprobs(mbs)
        counts = StepCounts(num_rollouts=batch.num_rollouts, num_tokens=batch.num_trainable_tokens)

        def score(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            if objective == "sft":
                lp, _ = self._logprobs(mb, logits)
                loss, metrics = sft_objective(mb, lp, counts)
                metrics = {}
            else:
                lp, ent = self._logprobs(mb, logits, entropy_grad=cfg.entropy_coef > 0)
                loss, metrics = micro_batch_objective(mb, lp, ent, cfg, counts)
            if float(mb.loss_mask.sum()) == 0:
                loss = loss + 0.0 * logits.sum()  # the same backward on every rank
            finite = torch.isfinite(loss.detach()).all()
            return loss, {**metrics, "loss": loss.detach(), "nonfinite": (~finite).to(loss.dtype)}

        self._zero_grads()
        self._scoring_model = self.model
        routing = self.routing.get(id(self.model))
        if routing is not None:
            routing.start(record=True)
        try:
            out = run_schedule(self.model, mbs, score, forward_only=False, attention=self.attention, head=self.head,
                               hooks=routing)
        finally:
            if routing is not None:
                routing.finish()
        self._finalize_grads()
        real = [mb for mb in mbs if not mb.padding]
        metrics = self._finish_metrics(out, len(real), sum(mb.num_tokens for mb in real), objective)
        if routing is not None:
            metrics.update(step_routing_metrics([routing], self.layout, self.device, replay=self._replay))
        return metrics

    def _fill_side_logprobs(self, mbs: list[MicroBatch]) -> None:
        cfg = self.config.loss
        jobs: list[tuple[str, Any]] = []
        if cfg.old_logprobs == "recompute":
            jobs.append(("old_logprobs", self.model))
        if cfg.kl_loss_coef > 0 and self.ref_model is not None:
            jobs.append(("ref_logprobs", self.ref_model))
        for field, model in jobs:
            todo = self._side_todo(mbs, field)
            for mb, lp in zip(todo, self._score_only(model, todo), strict=False):
                if getattr(mb, field) is None:
                    setattr(mb, field, lp)
            if not self.layout.last_stage:  # only the last stage computes the loss
                for mb in todo:
                    setattr(mb, field, torch.zeros_like(mb.loss_mask))

    def _side_todo(self, mbs: list[MicroBatch], field: str) -> list[MicroBatch]:
        """The micro-batches to score for ``field``: those without it; with expert parallelism every
        micro-batch (padding included) when any rank has one without it, so that the expert-parallel
        ranks run the same forwards."""
        todo = [mb for mb in mbs if getattr(mb, field) is None and not mb.padding]
        if self.layout.ep_size == 1:
            return todo
        need = torch.tensor([float(bool(todo))], device=self.device)
        dist.all_reduce(need, op=dist.ReduceOp.MAX, group=self.layout.dp_group)
        return list(mbs) if float(need) > 0 else []

    def _zero_grads(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _finalize_grads(self) -> None:
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.model])

    def _finish_metrics(self, out: list[dict[str, torch.Tensor]], n_mbs: int, n_tokens: int,
                        objective: str) -> dict[str, float]:
        names = ["loss", "pg_loss", "clipfrac", "ppo_kl", "train_rollout_abs_diff", "entropy"]
        if objective == "sft":
            names = ["loss"]
        elif self.config.loss.kl_loss_coef > 0:
            names.append("kl")
        sums = torch.zeros(len(names) + 3, dtype=torch.float64)
        if self.layout.reports:
            for values in out:
                for i, name in enumerate(names):
                    if name in values:
                        sums[i] += float(values[name])
                sums[len(names)] += float(values["nonfinite"])
            sums[len(names) + 1] = n_mbs
            sums[len(names) + 2] = n_tokens
        sums = self._all_reduce_world(sums.to(self.device)).cpu()
        if float(sums[len(names)]) > 0 or not bool(torch.isfinite(sums[: len(names)]).all()):
            self._zero_grads()
            raise NonFiniteLossError(f"non-finite loss at step {self.step}; the step was not applied",
                                     {"step": self.step, "rank": dist.get_rank()})
        metrics = {name: float(sums[i]) for i, name in enumerate(names)}
        metrics["micro_batches"] = float(sums[len(names) + 1])
        metrics["packed_tokens"] = float(sums[len(names) + 2])
        return metrics

    def optim_step(self) -> dict[str, float]:
        """Check and clip the global gradient norm, then step Megatron's optimizer.

        The norm is Megatron's (over the model-parallel group, replicated and tied parameters
        counted once); clipping scales the gradients here because megatron-core's own clipping
        kernel accepts CUDA tensors only."""
        found_inf = self.optimizer.prepare_grads()
        norm = float(self.optimizer.get_grad_norm())
        if found_inf or not math.isfinite(norm):
            self._zero_grads()
            raise NonFiniteLossError(f"non-finite gradient norm at step {self.step}; the step was not applied",
                                     {"step": self.step, "grad_norm": norm})
        clip = self.config.optimizer.grad_clip
        if clip is not None and clip / (norm + 1e-6) < 1.0:
            coef = clip / (norm + 1e-6)
            for param in self.optimizer.get_parameters():
                if param.grad is not None:
                    param.grad.mul_(coef)
        self.optimizer.step_with_ready_grads()
        self._zero_grads()
        self.step += 1
        return {"grad_norm": norm, "lr": float(self.optimizer.param_groups[0]["lr"]), "step": float(self.step)}

    def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """``forward_backward`` then ``optim_step``; returns their metrics merged."""
        metrics = self.forward_backward(batch)
        metrics.update(self.optim_step())
        return metrics

    def sft_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One supervised step (mean next-token NLL of the mask-1 tokens), then ``optim_step``."""
        metrics = self.forward_backward(batch, objective="sft")
        metrics.update(self.optim_step())
        return metrics

    # -- weights and state -----------------------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, full tensor)`` of the current weights, on every rank (collective, in step)."""
        yield from iter_hf_weights(unwrap(self.model), self.spec, self.layout)

    def export_hf(self, directory: str | Path, *, tokenizer: Any | None = None) -> Path:
        """Write a Hugging Face folder (config, safetensors, tokenizer) from global rank 0."""
        return self.checkpointer.export_hf(directory, tokenizer=tokenizer)

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Each model-parallel rank of replica 0 writes its shard and optimizer state; every rank its RNG."""
        return self.checkpointer.save(directory)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore what :meth:`save_checkpoint` wrote (same TP and PP sizes)."""
        self.checkpointer.load(directory)
