"""The training run: its typed config (:class:`RunConfig`) and, later, the loops that execute it.

:class:`RunConfig` is one frozen pydantic model with a section per component (``model``, ``data``,
``environment``, ``rollout``, ``algorithm``, ``train``, ``cluster``, ``logging``, ``checkpoint``);
each section converts to the runtime object its component takes. :data:`ESTIMATOR_LOSSES` is the
table of policy losses each advantage estimator trains with.
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
from agentrl.runner.checks import LoopMode, run_checks
from agentrl.runner.cluster import RayRuntime, TrainGroup, TrainGroupError, spawn
from agentrl.runner.config import HASH_EXCLUDED, RunConfig
from agentrl.runner.placement import ActorPlacement, BundleGroup, PlacedGroups, PlacementError, PlacementPlan

__all__ = [
    "ESTIMATOR_LOSSES",
    "HASH_EXCLUDED",
    "LOSS_CLIP_DEFAULTS",
    "ActorPlacement",
    "AgentSection",
    "AlgorithmSection",
    "BundleGroup",
    "CheckpointSection",
    "ClusterSection",
    "DataSection",
    "DatasetSection",
    "EnginesSection",
    "EnvironmentSection",
    "EvalDatasetSection",
    "LoggingSection",
    "LoopMode",
    "ModelSection",
    "OptimizerSection",
    "PlacedGroups",
    "PlacementError",
    "PlacementPlan",
    "RayRuntime",
    "RolloutSection",
    "RouterSection",
    "RunConfig",
    "SamplingSection",
    "SchedulerSection",
    "TrainGroup",
    "TrainGroupError",
    "TrainSection",
    "run_checks",
    "spawn",
]
