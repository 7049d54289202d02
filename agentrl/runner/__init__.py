"""The training run: its typed config (:class:`RunConfig`) and, later, the loops that execute it.

:class:`RunConfig` is one frozen pydantic model with a section per component (``model``, ``data``,
``environment``, ``rollout``, ``algorithm``, ``train``, ``cluster``, ``logging``, ``checkpoint``);
each section converts to the runtime object its component takes. :data:`ESTIMATOR_LOSSES` is the
table of policy losses each advantage estimator trains with.

Pieces of the loop: :class:`DiskWeightSync` (export, pause, load, verify, continue), the post-sync
:class:`LogprobProbe` with :func:`logprob_mismatch`, and :func:`plan_cpu` (thread placement on a
CPU-only machine).
"""

import lazy_loader

from agentrl._deprecated import moved_names

# The names are listed in __init__.pyi; each submodule is imported on first use, so importing a
# config module does not pull in torch or Ray.
_lazy_getattr, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)

# sections that are now the runtime objects themselves (deprecated aliases for one release)
__getattr__ = moved_names(__name__, {
    "DatasetSection": "agentrl.data:DataConfig",
    "OptimizerSection": "agentrl.train:OptimizerConfig",
    "RouterSection": "agentrl.rollout:RouterConfig",
    "SamplingSection": "agentrl.rollout:SamplingParams",
    "SchedulerSection": "agentrl.rollout:SchedulerConfig",
}, fallback=_lazy_getattr)
