"""A teacher held by the trainer: a frozen Hugging Face model that scores token sequences.

On-policy distillation (:mod:`agentrl.algorithms.distill`) needs the teacher's logprob of every
token the student sampled. :class:`TeacherModel` is the train-side way to get it, like the reference
model of a KL loss: the model is loaded once per trainer rank, frozen, in eval mode, and runs the
same scoring path as the policy (packed rows attended per document, the fused output head, a shared
prompt run once per micro-batch: :class:`~agentrl.train.scoring.TokenScorer`), without gradient.

Contract: :meth:`TeacherModel.score` returns, per sequence, position-aligned logprobs (entry ``i``
is ``log π_T(tokens[i] | tokens[:i])``, entry 0 is 0.0) at temperature 1 (the teacher's own
distribution, whatever the student samples at). In data parallel every rank calls it with the same
sequences; each scores its share and one summing all-reduce gives every rank all of them. Not
thread-safe.

Example::

    teacher = TeacherModel.from_pretrained("models/teacher", TorchBackendConfig(device="cpu"))
    rows = teacher.score([[1, 2, 3, 4]])      # [[0.0, lp(2|1), lp(3|1,2), lp(4|1,2,3)]]
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from agentrl.model_folder import check_model_folder
from agentrl.train.batching import TrainingBatch, TrainSequence
from agentrl.train.config import LossConfig, TorchBackendConfig
from agentrl.train.device import resolve_device
from agentrl.train.distributed import DistInfo, all_reduce_sum
from agentrl.train.packing import MicroBatch, collate, plan_micro_batches
from agentrl.train.prefix import plan_shared_prefix_micro_batches, shared_prefix_layout
from agentrl.train.scoring import TokenScorer
from agentrl.train.torch_backend import _embedding_rows
from agentrl.train.torch_model import prepare_model

__all__ = ["TeacherModel", "scoring_batch"]


def scoring_batch(sequences: list[list[int]]) -> TrainingBatch:
    """``sequences`` as a batch of untrained sequences (no mask, advantages or logprobs), for scoring."""
    return TrainingBatch.from_sequences([
        TrainSequence(tokens=list(s), loss_mask=[0] * len(s), rollout_logprobs=[0.0] * len(s),
                      advantages=[0.0] * len(s), rollout_id=f"score-{i}", group_id="score", reward=0.0,
                      denominator=1.0) for i, s in enumerate(sequences)])


class TeacherModel:
    """A frozen model that scores sequences (see the module doc). ``config`` gives the device, dtype,
    attention, fused head, packing budget and shared-prefix settings (its loss and optimizer are not
    read: the teacher scores at temperature 1 and never trains)."""

    def __init__(self, model: torch.nn.Module, config: TorchBackendConfig | None = None) -> None:
        cfg = config or TorchBackendConfig()
        # temperature 1: the teacher's own distribution; no LoRA, sharding or recomputation for a frozen scorer
        self.config = dataclasses.replace(cfg, loss=LossConfig(temperature=1.0), lora=None, sharding="none",
                                          activation_checkpointing="none")
        self.device = resolve_device(self.config.device)
        self.dist = DistInfo.current()
        prepared = prepare_model(model, self.config, self.device, sharded=False, trainable=False)
        self.model = prepared.model
        self.vocab_rows = _embedding_rows(model)
        self.scorer = TokenScorer(self.config, self.device, attention=prepared.attention)
        self.scorer.register(self.model, prepared.head)
        self.scorer.verify_fused(self.model, self.vocab_rows, required=self.config.fused_lm_head is True)
        self.shared_prefix = self.config.shared_prefix
        if self.shared_prefix:
            self.scorer.verify_shared_prefix(self.model, self.vocab_rows)

    @classmethod
    def from_pretrained(cls, path: str | Path, config: TorchBackendConfig | None = None) -> TeacherModel:
        """The teacher from a local Hugging Face folder (checked first: one-line
        :class:`~agentrl.model_folder.ModelFolderError`), in ``config``'s compute dtype."""
        from transformers import AutoModelForCausalLM

        folder = check_model_folder(path, needs=("config", "weights"), what="teacher.path")
        cfg = config or TorchBackendConfig()
        return cls(AutoModelForCausalLM.from_pretrained(str(folder), dtype=cfg.torch_dtype), cfg)

    def _micro_batches(self, batch: TrainingBatch) -> list[MicroBatch]:
        cfg, seqs = self.config, batch.sequences
        for i, seq in enumerate(seqs):
            bad = [t for t in seq.tokens if not 0 <= t < self.vocab_rows]
            if bad:
                raise ValueError(f"sequences[{i}]: token id {bad[0]} is outside the teacher's vocabulary "
                                 f"[0, {self.vocab_rows}); the teacher must share the student's tokenizer")
        if self.shared_prefix:
            plan = plan_shared_prefix_micro_batches([s.tokens for s in seqs], cfg.packing,
                                                    min_prefix=cfg.shared_prefix_min_tokens,
                                                    world_size=self.dist.world_size, rank=self.dist.rank)
        else:
            plan = plan_micro_batches([len(s.tokens) - 1 for s in seqs], cfg.packing,
                                      world_size=self.dist.world_size, rank=self.dist.rank)
        mbs = []
        for idx in ([i for i in part if len(seqs[i].tokens) > 1] for part in plan):
            if not idx:
                continue
            mb = collate(seqs, idx, dtype=torch.float32, device=self.device)
            if self.shared_prefix:
                mb.prefix = shared_prefix_layout([seqs[i].tokens for i in idx],
                                                 min_prefix=cfg.shared_prefix_min_tokens, device=self.device)
            mbs.append(mb)
        return mbs

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Per sequence, ``log π_T`` of each token given the ones before (entry 0: 0.0); see the module doc."""
        batch = scoring_batch(sequences)
        offsets = [0]
        for s in sequences:
            offsets.append(offsets[-1] + max(len(s) - 1, 0))
        flat = torch.zeros(offsets[-1], dtype=torch.float64, device=self.device)
        for mb in self._micro_batches(batch):
            scored = self.scorer.logprobs(self.model, mb)
            for idx, piece in zip(mb.indices, mb.split(scored), strict=True):
                flat[offsets[idx]: offsets[idx + 1]] = piece.double()
        flat = all_reduce_sum(flat).cpu()
        return [[0.0, *flat[offsets[i]: offsets[i + 1]].tolist()][: max(len(s), 1)]
                for i, s in enumerate(sequences)]
