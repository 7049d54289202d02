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
    LoadedCheckpoint,
    RunCheckpointer,
)
from .checks import (
    LoopMode,
    run_checks,
)
from .cluster import (
    RayRuntime,
    TrainGroup,
    TrainGroupError,
    spawn,
)
from .config import (
    HASH_EXCLUDED,
    RunConfig,
)
from .cpu import (
    CpuPlan,
    plan_cpu,
)
from .debug import (
    train_from_trajectories,
)
from .ledger import (
    LedgerError,
    LedgerStep,
    PromptLedger,
)
from .logging_sinks import (
    SinkUnavailableError,
    TensorBoardSink,
    WandbSink,
    sinks_from_config,
)
from .loop import (
    LoopSettings,
    RunCallback,
    Runner,
    RunnerError,
    RunSummary,
    StalenessError,
)
from .placement import (
    ActorPlacement,
    BundleGroup,
    PlacedGroups,
    PlacementError,
    PlacementPlan,
)
from .probe import (
    LogprobProbe,
    ProbeError,
    ProbeReport,
    backend_scorer,
    logprob_mismatch,
    probe_sequences,
)
from .rollout_service import (
    RolloutService,
    WeightLoader,
)
from .rundir import (
    RunDirectory,
    RunDirError,
)
from .weights import (
    DiskWeightSync,
    SyncReport,
    WeightSyncConfig,
    WeightSyncError,
)

__all__ = [
    "ESTIMATOR_LOSSES",
    "HASH_EXCLUDED",
    "LOSS_CLIP_DEFAULTS",
    "ActorPlacement",
    "AgentSection",
    "AlgorithmSection",
    "BundleGroup",
    "CheckpointError",
    "CheckpointSection",
    "CheckpointWriteError",
    "ClusterSection",
    "CpuPlan",
    "DataSection",
    "DiskWeightSync",
    "EnginesSection",
    "EnvironmentSection",
    "EvalDatasetSection",
    "LedgerError",
    "LedgerStep",
    "LoadedCheckpoint",
    "LoggingSection",
    "LogprobProbe",
    "LoopMode",
    "LoopSettings",
    "ModelSection",
    "PlacedGroups",
    "PlacementError",
    "PlacementPlan",
    "ProbeError",
    "ProbeReport",
    "PromptLedger",
    "RayRuntime",
    "RolloutSection",
    "RolloutService",
    "RunCallback",
    "RunCheckpointer",
    "RunConfig",
    "RunDirError",
    "RunDirectory",
    "RunSummary",
    "Runner",
    "RunnerError",
    "SinkUnavailableError",
    "StalenessError",
    "SyncReport",
    "TensorBoardSink",
    "TrainGroup",
    "TrainGroupError",
    "TrainSection",
    "WandbSink",
    "WeightLoader",
    "WeightSyncConfig",
    "WeightSyncError",
    "backend_scorer",
    "logprob_mismatch",
    "plan_cpu",
    "probe_sequences",
    "run_checks",
    "sinks_from_config",
    "spawn",
    "train_from_trajectories",
]
