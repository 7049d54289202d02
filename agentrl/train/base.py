"""The train backends' contract: :class:`TrainBackend`, which :class:`~agentrl.train.TorchTrainBackend`
and :class:`~agentrl.train.megatron.MegatronTrainBackend` both satisfy, and through which the runner's
train service, the warm-up, the post-sync probe and SFT drive either of them.

A structural protocol (nothing to inherit): a backend of one's own plugs in by having these members.
What only one backend does (the torch backend's LoRA adapter: ``adapter``, ``export_adapter``,
``adapter_tensors``; its float32 master weights, ``offloadable``) is not part of the contract; callers
ask for it with an ``isinstance`` or attribute check.

This module imports neither torch nor a backend (only under ``TYPE_CHECKING``), so a config-time
module may annotate with it.

Example::

    def lr_to(backend: TrainBackend, lr: float) -> None:
        for group in backend.optimizer.param_groups:
            group["lr"] = lr
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from agentrl.train.batching import TrainingBatch
    from agentrl.train.config import LossConfig

__all__ = ["BackendConfig", "LogprobScorer", "TrainBackend", "TrainOptimizer"]


class BackendConfig(Protocol):
    """What the loops read of a backend's config (``TorchBackendConfig``, ``MegatronBackendConfig``)."""

    @property
    def loss(self) -> LossConfig: ...


class TrainOptimizer(Protocol):
    """What the loops touch of a backend's optimiser: the learning rate of each parameter group, and
    the state the warm-up clears (a ``torch.optim.Optimizer``, or Megatron's wrapper of several)."""

    @property
    def param_groups(self) -> list[dict[str, Any]]: ...

    @property
    def state(self) -> MutableMapping[Any, Any]: ...


class LogprobScorer(Protocol):
    """Scores a batch: per sequence, the logprob of each token given the ones before (entry 0 is 0.0);
    ``reference``: under the reference model (a LoRA run's: the base, adapter disabled)."""

    def compute_logprobs(self, batch: TrainingBatch, *, reference: bool = False) -> list[list[float]]: ...


class TrainBackend(LogprobScorer, Protocol):
    """One rank of a train backend (see the module doc). ``step`` counts optimiser steps (the warm-up
    resets it); every method is collective where the backend is sharded: every rank calls it."""

    step: int

    @property
    def config(self) -> BackendConfig: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def optimizer(self) -> TrainOptimizer: ...

    def fill_old_logprobs(self, batch: TrainingBatch) -> None:
        """Stores the current policy's logprobs as every sequence's ``old_logprobs``."""

    def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One optimiser step of the policy objective; the step's metrics."""
        ...

    def sft_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One optimiser step of the supervised objective (mean NLL of the trained tokens)."""
        ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights under their Hugging Face names (a sharded backend gathers them)."""
        ...

    def export_hf(self, directory: str | Path, *, tokenizer: Any | None = None) -> Path:
        """Writes a Hugging Face folder (config, safetensors, the tokenizer); returns it."""
        ...

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Writes what a resumed run needs (weights, optimiser, RNG); returns the folder."""
        ...

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restores what :meth:`save_checkpoint` wrote."""
