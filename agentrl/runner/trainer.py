"""The train side of a run: :class:`TrainService`, a plain object around one train backend rank.

It adds to the backend what a training *loop* needs around one optimiser step:

- the learning rate of the step from the optimiser section's schedule (warm-up, cosine);
- old logprobs scored once (recompute mode), and from them the **engine-vs-trainer mismatch**
  over the trained tokens (mean, max, quantiles of ``|engine − trainer|``), logged every step;
- a batch whose advantages are all zero is not run forward/backward at all (it would only move
  the optimiser's moments through weight decay), and is counted;
- export to a Hugging Face folder for the engines, scoring for the post-sync probe, checkpoints,
  and a digest of the weights (tests compare runs bitwise with it);
- a distillation teacher held by the trainer (``teacher.kind = "model"``): :meth:`score_teacher`.

It works in-process (the runner calls it through a thread) or inside a Ray actor, one per
data-parallel rank (:mod:`agentrl.runner.cluster`); it never knows which.

Example::

    service = TrainService.from_config(config)          # RunConfig: model, train, algorithm sections
    metrics = service.train(batch, step=0)              # TrainingBatch from build_training_batch
    service.export("weights/v000001")
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import torch

from agentrl.runner.probe import logprob_mismatch
from agentrl.runner.weight_push import PUSH_METHODS, PushTarget, WeightPusher, push_adapter
from agentrl.runner.weight_transports import adapter_name
from agentrl.train.base import TrainBackend
from agentrl.train.batching import TrainingBatch, TrainSequence
from agentrl.train.megatron.backend import MegatronTrainBackend
from agentrl.train.teacher import TeacherModel
from agentrl.train.torch_backend import TorchTrainBackend

if TYPE_CHECKING:
    from agentrl.runner._sections import ModelSection
    from agentrl.runner._warmup_section import WarmupSection
    from agentrl.runner.config import RunConfig
    from agentrl.train.config import OptimizerConfig

__all__ = ["TrainService"]


class TrainService:
    """One trainer rank. ``total_steps`` bounds a cosine schedule without ``decay_steps``."""

    def __init__(self, backend: TrainBackend, optimizer: OptimizerConfig | None = None, *,
                 total_steps: int | None = None, score_after_step: bool = False) -> None:
        self.backend = backend
        self.score_after_step = score_after_step
        self.optimizer = optimizer
        self.total_steps = total_steps
        self.skipped_steps = 0
        self.warmup_section: WarmupSection | None = None
        self.model_section: ModelSection | None = None
        self.push_method = "disk"
        self.push_bucket_bytes = 512 << 20
        self._pusher: WeightPusher | None = None
        self._pushed: tuple[int, int] | None = None  # (version, backend step) of the last push
        self.teacher: TeacherModel | None = None  # on-policy distillation's teacher, when the trainer holds it

    @classmethod
    def from_config(cls, config: RunConfig, *, threads: int | None = None) -> TrainService:
        """The run's train backend (``train.backend``: torch or megatron) on ``config.model.path`` with
        the run's loss, optimiser and packing. For megatron, ``torch.distributed`` is already
        initialised over the ``dp × tp × pp`` train ranks (the train group does it); every rank
        builds its service.

        ``threads``: ``torch.set_num_threads`` for this process (on a CPU machine the runner gives
        the trainer its share of the cores; oversubscription made a step 7× slower)."""
        if threads is not None:
            torch.set_num_threads(threads)
        backend: TrainBackend
        if config.train.backend == "megatron":
            backend = MegatronTrainBackend.from_pretrained(
                config.model.path, config.megatron_backend_config(), with_ref_model=config.algorithm.kl_coef > 0)
        else:
            backend = TorchTrainBackend.from_pretrained(
                config.model.path, config.torch_backend_config(),
                with_ref_model=config.algorithm.kl_coef > 0)
        service = cls(backend, config.train.optimizer, total_steps=config.train.steps,
                      score_after_step=config.train.score_after_step)
        service.warmup_section, service.model_section = config.warmup, config.model
        service.push_method = config.sync_method()
        service.push_bucket_bytes = config.sync.bucket_mb << 20
        if config.teacher is not None and config.teacher.on_trainer:
            assert config.teacher.path is not None
            service.teacher = TeacherModel.from_pretrained(config.teacher.path, config.torch_backend_config())
        return service

    # -- warm-up -------------------------------------------------------------------------------
    def warmup(self, run_dir: str | None = None) -> dict[str, Any]:
        """The config's supervised warm-up (:func:`~agentrl.runner.warmup.run_warmup`) on this rank's
        backend; rank 0 writes ``warmup.json`` and ``warmup_metrics.jsonl`` into ``run_dir``. Returns
        the report as a dict (``{}`` without a ``warmup`` section). Raises ``WarmupError``."""
        if self.warmup_section is None or self.model_section is None:
            return {}
        from transformers import AutoTokenizer

        from agentrl.chat import ChatTemplate
        from agentrl.model_folder import model_vocab_size
        from agentrl.runner.warmup import run_warmup
        from agentrl.sft.transcript import TranscriptBuilder

        model = self.model_section
        tokenizer = AutoTokenizer.from_pretrained(model.tokenizer, local_files_only=True)
        builder = TranscriptBuilder(ChatTemplate.from_name(model.template, tokenizer=tokenizer),
                                    vocab_size=model_vocab_size(model.path))
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        folder = run_dir if rank == 0 else None
        return run_warmup(self.backend, self.warmup_section, builder, run_dir=folder).to_dict()

    # -- one step ------------------------------------------------------------------------------
    def lr_at(self, step: int) -> float | None:
        if self.optimizer is None:
            return None
        return self.optimizer.lr_at(step, self.total_steps)

    def train(self, batch: TrainingBatch, step: int) -> dict[str, float]:
        """One optimiser step on ``batch`` (every rank gets the same batch); returns step metrics:
        the backend's, ``train/lr``, ``train/skipped`` and ``mismatch/*`` (engine vs trainer)."""
        started = time.perf_counter()
        lr = self.lr_at(step)
        if lr is not None:
            for group in self.backend.optimizer.param_groups:
                group["lr"] = lr
        metrics: dict[str, float] = {}
        if self.backend.config.loss.old_logprobs == "recompute":
            self.backend.fill_old_logprobs(batch)
            metrics.update({f"mismatch/{k}": v for k, v in _mismatch(batch.sequences).items()})
        else:
            scored = self.backend.compute_logprobs(batch)
            metrics.update({f"mismatch/{k}": v for k, v in _mismatch(batch.sequences, scored).items()})
        if all(a == 0.0 for s in batch.sequences for a, m in zip(s.advantages, s.loss_mask, strict=True) if m):
            self.skipped_steps += 1
            metrics.update({"train/skipped": 1.0, "train/step_s": time.perf_counter() - started})
            if lr is not None:
                metrics["train/lr"] = lr
            return metrics
        out = self.backend.train_step(batch)
        metrics.update({f"train/{k}": v for k, v in out.items()})
        if self.score_after_step:  # how far the update moved the policy from what the engine sampled
            after = self.backend.compute_logprobs(batch)
            metrics.update({f"mismatch_after/{k}": v for k, v in _mismatch(batch.sequences, after).items()})
        metrics["train/skipped"] = 0.0
        metrics["train/step_s"] = time.perf_counter() - started
        return metrics

    # -- sharing the device with colocated engines -------------------------------------------------
    def offload(self) -> dict[str, float]:
        """Frees the gradients and moves the optimizer state and the master weights to host memory,
        keeping the weights on the device (for the probe and the export): colocated engines then have
        the rest of it."""
        from agentrl.train.offload import offload

        return offload(self.backend.model.parameters(), self.backend.optimizer, self.backend.device,
                       extra=self._offloadable())

    def onload(self) -> dict[str, float]:
        """The optimizer state (and master weights) back on the device, before the next step."""
        from agentrl.train.offload import onload

        return onload(self.backend.optimizer, self.backend.device, extra=self._offloadable())

    def _offloadable(self) -> list[torch.Tensor]:
        """The float32 master weights of a torch-backend trainer (Megatron's live in its optimizer state).
        With ``optimizer_offload`` they are on the host already."""
        extra = getattr(self.backend, "offloadable", None)
        return list(extra()) if callable(extra) else []

    # -- weights -------------------------------------------------------------------------------
    def push_weights(self, version: int, targets: list[PushTarget], *, flush: bool = True,
                     exact: bool = False) -> dict[str, Any]:
        """Sends the current weights to ``targets`` as ``version`` (``sync.method`` ``tensor`` or
        ``distributed``; every rank calls it, rank 0 sends): the push report as a dict. ``exact``: only
        when the weights still are the version last pushed as ``version`` (a restarted engine catching
        up); otherwise nothing is sent and the report says ``moved``."""
        if exact and self._pushed != (version, self.backend.step):
            return {"moved": True, "errors": {}}
        lora = self._lora()
        if lora is not None:  # LoRA: the adapter alone, from tensors (rank 0; the ranks hold the same one)
            if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
                return {"errors": {}}
            adapter = lora.adapter
            assert adapter is not None
            tensors = lora.adapter_tensors()
            report = asyncio.run(push_adapter(tensors, adapter.engine_config(), adapter_name(version), targets))
            self._pushed = (version, self.backend.step)
            return report.to_dict()
        if self._pusher is None:
            if self.push_method not in PUSH_METHODS:
                raise ValueError(f"push_weights: sync.method={self.push_method!r} does not push; expected one of "
                                 f"{', '.join(PUSH_METHODS)}")
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            self._pusher = WeightPusher(self.backend.named_weights, method=self.push_method, dtype=self._export_dtype(),
                                        bucket_bytes=self.push_bucket_bytes, device=self.backend.device, rank=rank)
        report = self._pusher.push(version, targets, flush=flush)
        self._pushed = (version, self.backend.step)
        return report.to_dict()

    def _export_dtype(self) -> torch.dtype | None:
        name = self.model_section.dtype if self.model_section is not None else "auto"
        return None if name == "auto" else getattr(torch, name)

    def export(self, folder: str | Path) -> str:
        """Writes the current weights as a Hugging Face folder (with the tokenizer); a LoRA run's
        adapter as a peft folder."""
        lora = self._lora()
        if lora is not None:
            return str(lora.export_adapter(folder))
        return str(self.backend.export_hf(folder))

    def _lora(self) -> TorchTrainBackend | None:
        """The backend when it trains a LoRA adapter."""
        backend = self.backend
        return backend if isinstance(backend, TorchTrainBackend) and backend.adapter is not None else None

    def export_merged(self, folder: str | Path) -> str:
        """The Hugging Face folder an engine serves without adapters (a LoRA run's adapter merged in)."""
        return str(self.backend.export_hf(folder))

    def probe_adapter(self, folder: str | Path, sequences: list[list[int]], seed: int) -> dict[str, Any]:
        """LoRA: the start-up check's two sides. A probe adapter of fixed random weights (B ≠ 0) is
        written to ``folder`` (peft format) and the sequences scored with it (``"adapter"``) and with
        the adapter disabled (``"base"``); the trained adapter is then put back bit for bit."""
        lora = self._lora()
        if lora is None or lora.adapter is None:
            raise ValueError("probe_adapter: this trainer has no LoRA adapter (train.lora is not set)")
        with lora.adapter.probe_weights(seed):
            lora.export_adapter(folder)
            with_adapter = self.score(sequences)
        base = self.score(sequences, reference=True)
        return {"adapter": with_adapter, "base": base}

    def score(self, sequences: list[list[int]], *, reference: bool = False) -> list[list[float]]:
        """Per sequence, the logprob of each token given the ones before (entry 0 is 0.0); ``reference``:
        under the reference model (a LoRA run's: the base, adapter disabled)."""
        fake = [TrainSequence(tokens=list(s), loss_mask=[0] * len(s), rollout_logprobs=[0.0] * len(s),
                              advantages=[0.0] * len(s), rollout_id=f"probe-{i}", group_id="probe", reward=0.0,
                              denominator=1.0) for i, s in enumerate(sequences)]
        return self.backend.compute_logprobs(TrainingBatch.from_sequences(fake), reference=reference)

    def score_teacher(self, sequences: list[list[int]]) -> list[list[float]]:
        """The teacher's logprob of every token of each sequence given the ones before (entry 0: 0.0), at
        temperature 1 (:class:`~agentrl.train.TeacherModel`); every rank calls it with the same sequences."""
        if self.teacher is None:
            raise ValueError("score_teacher: this trainer holds no teacher (teacher.kind is not 'model')")
        return self.teacher.score(sequences)

    def digest(self) -> str:
        """SHA-256 over every weight's bytes, in name order: equal iff the weights are bitwise equal
        (collective for megatron: every rank must call it)."""
        h = hashlib.sha256()
        for name, tensor in sorted(self.backend.named_weights(), key=lambda item: item[0]):
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, folder: str | Path) -> str:
        """The backend's checkpoint in ``folder``; a LoRA run's also holds its adapter as a peft folder
        (``adapter/``: what ``agentrl serve MODEL --adapter`` and peft load)."""
        extra = {"skipped_steps": self.skipped_steps}
        path = self.backend.save_checkpoint(folder)
        lora = self._lora()
        if lora is not None:
            lora.export_adapter(Path(path) / "adapter")
        (Path(path) / "service.json").write_bytes(orjson.dumps(extra))
        return str(path)

    def load(self, folder: str | Path) -> None:
        self.backend.load_checkpoint(folder)
        extra_file = Path(folder) / "service.json"
        if extra_file.is_file():
            self.skipped_steps = int(orjson.loads(extra_file.read_bytes()).get("skipped_steps", 0))

    @property
    def step(self) -> int:
        return self.backend.step


def _mismatch(sequences: list[TrainSequence], scored: list[list[float]] | None = None) -> dict[str, float]:
    engine: list[float] = []
    trainer: list[float] = []
    for i, seq in enumerate(sequences):
        mine = scored[i] if scored is not None else seq.old_logprobs
        if mine is None:
            continue
        for pos, m in enumerate(seq.loss_mask):
            if m:
                engine.append(seq.rollout_logprobs[pos])
                trainer.append(mine[pos])
    return logprob_mismatch(engine, trainer)
