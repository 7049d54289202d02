"""The ``sync`` section of the run config: how weights reach the engines after each step, and the
post-sync logprob probe that checks they did."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentrl._config import Section
from agentrl.runner.weights import WeightSyncConfig

__all__ = ["SyncSection"]


class SyncSection(Section):
    """Weight sync (:class:`~agentrl.runner.weights.WeightSyncConfig`) and the probe.

    - ``method``: how the weights travel (docs/training.md "Weight sync"): ``disk`` (a safetensors
      folder → ``update_weights_from_disk``; needs a filesystem shared by trainer rank 0 and every
      engine), ``tensor`` (the trainer hands its buffers to engines on its host: shared memory on CPU,
      CUDA IPC on GPU), ``distributed`` (a broadcast from trainer rank 0 in one process group per
      engine: gloo on CPU, NCCL on GPU; every engine must reach rank 0's address), or ``auto``: tensor
      when colocated, distributed when disaggregated, disk for engines given by URL. ``bucket_mb``:
      the size of one transfer (buffers are reused across syncs).
    - With ``train.lora`` only the adapter travels, under a new name per version (``disk``: a peft
      folder → ``/load_lora_adapter``; ``tensor``: ``/load_lora_adapter_from_tensors``; no
      ``distributed``); the engines keep serving meanwhile (docs/training.md "LoRA").
    - ``pause_mode``: ``retract`` (default) re-queues running requests across the update so none is
      aborted; ``in_place`` keeps them running on the old KV cache; ``abort`` ends them (counted).
      ``abort_requests``: also abort every request (SGLang's update flag).
    - ``retries`` per engine; an engine that still fails is taken out of the rotation.
    - ``probe_sequences`` fixed random sequences of ``probe_length`` tokens are scored by an engine
      and by the trainer after every sync; a mean ``|Δ|`` above ``probe_bound`` stops the run
      (0 sequences: no probe). The default bound, 0.1, passes bf16 serving of an fp32 trainer
      (~1e-2) and fails a skipped sync (~0.9 on the tiny model); fp32 on both sides agrees to ~1e-6.
    """

    method: Literal["disk", "tensor", "distributed", "auto"] = "disk"
    bucket_mb: int = Field(default=512, ge=1)
    pause_mode: Literal["retract", "in_place", "abort"] = "retract"
    abort_requests: bool = False
    retries: int = Field(default=2, ge=0)
    export_s: float = Field(default=600.0, gt=0.0)
    pause_s: float = Field(default=60.0, gt=0.0)
    load_s: float = Field(default=600.0, gt=0.0)
    verify_s: float = Field(default=30.0, gt=0.0)
    resume_s: float = Field(default=60.0, gt=0.0)
    keep_folders: int = Field(default=1, ge=1)
    probe_sequences: int = Field(default=4, ge=0)
    probe_length: int = Field(default=32, ge=2)
    probe_bound: float = Field(default=0.1, gt=0.0)
    probe_seed: int = 0

    def resolved_method(self, placement: str, *, attached: bool, lora: bool = False) -> str:
        """``method`` with ``auto`` decided: ``tensor`` colocated, ``distributed`` disaggregated, ``disk``
        for engines the run did not start (``rollout.engines.urls``: their host is unknown). A LoRA
        run's adapter travels from tensors (colocated) or through a folder (SGLang loads adapters by
        no broadcast), so ``auto`` is ``disk`` instead of ``distributed`` for it."""
        if self.method != "auto":
            return self.method
        if attached:
            return "disk"
        if placement == "colocated":
            return "tensor"
        return "disk" if lora else "distributed"

    def to_config(self) -> WeightSyncConfig:
        return WeightSyncConfig(pause_mode=self.pause_mode, abort_requests=self.abort_requests, retries=self.retries,
                                export_s=self.export_s, pause_s=self.pause_s, load_s=self.load_s,
                                verify_s=self.verify_s, resume_s=self.resume_s, keep_folders=self.keep_folders)

    @model_validator(mode="after")
    def _converts(self) -> SyncSection:
        self.to_config()
        return self
