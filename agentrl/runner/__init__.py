"""The training run: its typed config (:class:`RunConfig`) and the loop that executes it.

The public surface is what a run is written against: :class:`RunConfig` and its sections (``model``,
``data``, ``environment``, ``rollout``, ``algorithm``, ``train``, ``cluster``, ``logging``,
``checkpoint``, ``sync``), the tables :data:`ESTIMATOR_LOSSES` and :data:`LOSS_CLIP_DEFAULTS`, the
:class:`Runner` with its :class:`RunCallback` and :class:`RunSummary`, the errors a run can end with,
and :func:`train_from_trajectories` (a debug mode). ``agentrl.run(config, ...)`` runs a config.

The submodules (``cluster``, ``placement``, ``weights``, ``probe``, ``ledger``, ``rundir``...) are the
machinery behind it: importable, but not part of this package's surface. Names they used to
re-export here keep a deprecated alias for one release.
"""

import lazy_loader

from agentrl._deprecated import moved_names

# The names are listed in __init__.pyi; each submodule is imported on first use, so importing a
# config module does not pull in torch or Ray.
_lazy_getattr, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)

# names that left this package's surface (deprecated aliases for one release): the sections that are now the
# runtime objects themselves, and the machinery that lives in the submodules
_MACHINERY = {
    "checkpoint": ("LoadedCheckpoint", "RunCheckpointer"),
    "checks": ("LoopMode", "run_checks"),
    "cluster": ("RayRuntime", "TrainGroup", "TrainGroupError", "spawn"),
    "config": ("HASH_EXCLUDED",),
    "cpu": ("CpuPlan", "plan_cpu"),
    "ledger": ("LedgerError", "LedgerStep", "PromptLedger"),
    "logging_sinks": ("TensorBoardSink", "WandbSink", "sinks_from_config"),
    "loop": ("LoopSettings",),
    "placement": ("ActorPlacement", "BundleGroup", "PlacedGroups", "PlacementError", "PlacementPlan"),
    "probe": ("LogprobProbe", "ProbeReport", "backend_scorer", "logprob_mismatch", "probe_sequences"),
    "rollout_service": ("RolloutService", "WeightLoader"),
    "rundir": ("RunDirError", "RunDirectory"),
    "weights": ("DiskWeightSync", "SyncReport"),
}
__getattr__ = moved_names(__name__, {
    "DatasetSection": "agentrl.data:DataConfig",
    "OptimizerSection": "agentrl.train:OptimizerConfig",
    "RouterSection": "agentrl.rollout:RouterConfig",
    "SamplingSection": "agentrl.rollout:SamplingParams",
    "SchedulerSection": "agentrl.rollout:SchedulerConfig",
    **{name: f"agentrl.runner.{module}" for module, names in _MACHINERY.items() for name in names},
}, fallback=_lazy_getattr)
