"""Type stub: the public names of agentrl.train (imported lazily at runtime, see __init__.py)."""

from .base import (
    LogprobScorer,
    TrainBackend,
)
from .batching import (
    TrainingBatch,
    TrainSequence,
    build_training_batch,
)
from .config import (
    BatchingConfig,
    LoraSettings,
    LossConfig,
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
)
from .device import (
    device_module,
    distributed_backend,
    resolve_device,
)
from .distributed import (
    DistInfo,
    all_reduce_gradients,
    all_reduce_sum,
    init_process_group,
)
from .objective import (
    StepCounts,
    micro_batch_objective,
    sft_objective,
)
from .packing import (
    MicroBatch,
    collate,
    pack_indices,
    partition_for_ranks,
    plan_micro_batches,
)
from .prefix import (
    PrefixLayout,
    common_prefix_length,
    plan_shared_prefix_micro_batches,
    shared_prefix_layout,
)
from .teacher import (
    TeacherModel,
)
from .torch_backend import (
    NonFiniteLossError,
    TorchTrainBackend,
)

__all__ = [
    "BatchingConfig",
    "DistInfo",
    "LogprobScorer",
    "LoraSettings",
    "LossConfig",
    "MicroBatch",
    "NonFiniteLossError",
    "OptimizerConfig",
    "PackingConfig",
    "PrefixLayout",
    "StepCounts",
    "TeacherModel",
    "TorchBackendConfig",
    "TorchTrainBackend",
    "TrainBackend",
    "TrainSequence",
    "TrainingBatch",
    "all_reduce_gradients",
    "all_reduce_sum",
    "build_training_batch",
    "collate",
    "common_prefix_length",
    "device_module",
    "distributed_backend",
    "init_process_group",
    "micro_batch_objective",
    "pack_indices",
    "partition_for_ranks",
    "plan_micro_batches",
    "plan_shared_prefix_micro_batches",
    "resolve_device",
    "sft_objective",
    "shared_prefix_layout",
]
