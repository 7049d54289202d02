"""The ``sync`` section of the run config: how weights reach the engines after each step, and the
post-sync logprob probe that checks they did."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentrl.runner._base import Section
from agentrl.runner.weights import WeightSyncConfig

__all__ = ["SyncSection"]


class SyncSection(Section):
    """Weight sync (:class:`~agentrl.runner.weights.WeightSyncConfig`) and the probe.

    - ``method``: ``disk`` (safetensors folder → ``update_weights_from_disk``; every machine).
    - ``pause_mode``: ``retract`` (default) re-queues running requests across the update so none is
      aborted; ``in_place`` keeps them running on the old KV cache; ``abort`` ends them (counted).
      ``abort_requests``: also abort every request (SGLang's update flag).
    - ``retries`` per engine; an engine that still fails is taken out of the rotation.
    - ``probe_sequences`` fixed random sequences of ``probe_length`` tokens are scored by an engine
      and by the trainer after every sync; a mean ``|Δ|`` above ``probe_bound`` stops the run
      (0 sequences: no probe). The default bound, 0.1, passes bf16 serving of an fp32 trainer
      (~1e-2) and fails a skipped sync (~0.9 on the tiny model); fp32 on both sides agrees to ~1e-6.
    """

    method: Literal["disk"] = "disk"
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

    def to_config(self) -> WeightSyncConfig:
        return WeightSyncConfig(pause_mode=self.pause_mode, abort_requests=self.abort_requests, retries=self.retries,
                                export_s=self.export_s, pause_s=self.pause_s, load_s=self.load_s,
                                verify_s=self.verify_s, resume_s=self.resume_s, keep_folders=self.keep_folders)

    @model_validator(mode="after")
    def _converts(self) -> SyncSection:
        self.to_config()
        return self
