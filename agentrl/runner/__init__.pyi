"""Type stub: the public names of agentrl.runner (imported lazily at runtime, see __init__.py)."""

from ._algorithm import (
    ESTIMATOR_LOSSES,
    LOSS_CLIP_DEFAULTS,
    AlgorithmSection,
)
from ._rollout_sections import (
    AgentSection,
    EnginesSection,
    RolloutSection,
)
from ._sections import (
    CheckpointSection,
    ClusterSection,
    DataSection,
    EnvironmentSection,
    EvalDatasetSection,
    LoggingSection,
    ModelSection,
    TrainSection,
)
from .checkpoint import (
    CheckpointError,
    CheckpointWriteError,
)
from .config import (
    RunConfig,
)
from .debug import (
    train_from_trajectories,
)
from .logging_sinks import (
    SinkUnavailableError,
)
from .loop import (
    RunCallback,
    Runner,
    RunnerError,
    RunSummary,
    StalenessError,
)
from .probe import (
    ProbeError,
)
from .weights import (
    WeightSyncConfig,
    WeightSyncError,
)

__all__ = [
    "ESTIMATOR_LOSSES",
    "LOSS_CLIP_DEFAULTS",
    "AgentSection",
    "AlgorithmSection",
    "CheckpointError",
    "CheckpointSection",
    "CheckpointWriteError",
    "ClusterSection",
    "DataSection",
    "EnginesSection",
    "EnvironmentSection",
    "EvalDatasetSection",
    "LoggingSection",
    "ModelSection",
    "ProbeError",
    "RolloutSection",
    "RunCallback",
    "RunConfig",
    "RunSummary",
    "Runner",
    "RunnerError",
    "SinkUnavailableError",
    "StalenessError",
    "TrainSection",
    "WeightSyncConfig",
    "WeightSyncError",
    "train_from_trajectories",
]
