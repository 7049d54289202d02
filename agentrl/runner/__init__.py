"""The training run: its typed config (:class:`RunConfig`) and, later, the loops that execute it.

:class:`RunConfig` is one frozen pydantic model with a section per component (``model``, ``data``,
``environment``, ``rollout``, ``algorithm``, ``train``, ``cluster``, ``logging``, ``checkpoint``);
each section converts to the runtime object its component takes. :data:`ESTIMATOR_LOSSES` is the
table of policy losses each advantage estimator trains with.

Pieces of the loop: :class:`DiskWeightSync` (export, pause, load, verify, continue), the post-sync
:class:`LogprobProbe` with :func:`logprob_mismatch`, and :func:`plan_cpu` (thread placement on a
CPU-only machine).
"""

from agentrl.runner._algorithm import ESTIMATOR_LOSSES, LOSS_CLIP_DEFAULTS, AlgorithmSection
from agentrl.runner._rollout_sections import (
    AgentSection,
    EnginesSection,
    RolloutSection,
    RouterSection,
    SamplingSection,
    SchedulerSection,
)
from agentrl.runner._sections import (
    CheckpointSection,
    ClusterSection,
    DataSection,
    DatasetSection,
    EnvironmentSection,
    EvalDatasetSection,
    LoggingSection,
    ModelSection,
    OptimizerSection,
    TrainSection,
)
from agentrl.runner.checkpoint import CheckpointError, LoadedCheckpoint, RunCheckpointer
from agentrl.runner.checks import LoopMode, run_checks
from agentrl.runner.cluster import RayRuntime, TrainGroup, TrainGroupError, spawn
from agentrl.runner.config import HASH_EXCLUDED, RunConfig
from agentrl.runner.cpu import CpuPlan, plan_cpu
from agentrl.runner.debug import train_from_trajectories
from agentrl.runner.ledger import LedgerError, LedgerStep, PromptLedger
from agentrl.runner.logging_sinks import SinkUnavailableError, TensorBoardSink, WandbSink, sinks_from_config
from agentrl.runner.loop import LoopSettings, RunCallback, Runner, RunnerError, RunSummary, StalenessError
from agentrl.runner.placement import ActorPlacement, BundleGroup, PlacedGroups, PlacementError, PlacementPlan
from agentrl.runner.probe import (
    LogprobProbe,
    ProbeError,
    ProbeReport,
    backend_scorer,
    logprob_mismatch,
    probe_sequences,
)
from agentrl.runner.rollout_service import RolloutService, WeightLoader
from agentrl.runner.rundir import RunDirectory, RunDirError
from agentrl.runner.weights import DiskWeightSync, SyncReport, WeightSyncConfig, WeightSyncError

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
    "ClusterSection",
    "CpuPlan",
    "DataSection",
    "DatasetSection",
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
    "OptimizerSection",
    "PlacedGroups",
    "PlacementError",
    "PlacementPlan",
    "ProbeError",
    "ProbeReport",
    "PromptLedger",
    "RayRuntime",
    "RolloutSection",
    "RolloutService",
    "RouterSection",
    "RunCallback",
    "RunCheckpointer",
    "RunConfig",
    "RunDirError",
    "RunDirectory",
    "RunSummary",
    "Runner",
    "RunnerError",
    "SamplingSection",
    "SchedulerSection",
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
