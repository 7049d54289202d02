"""Training: trajectories → packed micro-batches → optimiser steps on a train backend.

- :func:`build_training_batch` turns trajectories into :class:`TrainSequence` objects with
  per-token advantages and per-rollout denominators (fan-out aware);
- :func:`plan_micro_batches` / :func:`collate` pack them into token-budgeted micro-batches,
  balanced across data-parallel ranks;
- :class:`TorchTrainBackend` runs the step on any Hugging Face causal LM (CPU, CUDA, Ascend NPU),
  with data parallelism over ``torch.distributed``, checkpoints and Hugging Face export.
"""

from agentrl.train.batching import TrainingBatch, TrainSequence, build_training_batch
from agentrl.train.config import (
    BatchingConfig,
    LossConfig,
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
)
from agentrl.train.device import device_module, distributed_backend, resolve_device
from agentrl.train.distributed import DistInfo, all_reduce_gradients, all_reduce_sum, init_process_group
from agentrl.train.objective import StepCounts, micro_batch_objective, sft_objective
from agentrl.train.packing import MicroBatch, collate, pack_indices, partition_for_ranks, plan_micro_batches
from agentrl.train.torch_backend import NonFiniteLossError, TorchTrainBackend

__all__ = [
    "BatchingConfig",
    "DistInfo",
    "LossConfig",
    "MicroBatch",
    "NonFiniteLossError",
    "OptimizerConfig",
    "PackingConfig",
    "StepCounts",
    "TorchBackendConfig",
    "TorchTrainBackend",
    "TrainSequence",
    "TrainingBatch",
    "all_reduce_gradients",
    "all_reduce_sum",
    "build_training_batch",
    "collate",
    "device_module",
    "distributed_backend",
    "init_process_group",
    "micro_batch_objective",
    "pack_indices",
    "partition_for_ranks",
    "plan_micro_batches",
    "resolve_device",
    "sft_objective",
]
