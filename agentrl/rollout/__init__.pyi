"""Type stub: the public names of agentrl.rollout (imported lazily at runtime, see __init__.py)."""

from ._model_folder import (
    ModelFolderError,
    check_model_folder,
    model_vocab_size,
)
from .agent import (
    AgentConfig,
    Episode,
    EpisodeRunner,
    GenerateClient,
    run_episode,
)
from .client import (
    ClientConfig,
    InferenceClient,
    parse_generate_response,
)
from .context import (
    AskSummary,
    ContextPolicy,
    ContextView,
    ElideToolOutput,
    Rewrite,
    Summarize,
    Window,
    context_policy,
)
from .endpoint import (
    ChatEndpoint,
    EndpointError,
    evaluate_endpoint,
    run_message_episode,
)
from .engine import (
    EngineConfig,
    EngineError,
    EnginePortTaken,
    SGLangEngine,
    default_shim_dir,
    detect_device,
)
from .eval import (
    EvalConfig,
    EvalReport,
    evaluate,
    pass_at_k,
)

# deprecated aliases of names that moved to agentrl.rewards: not in __all__, a DeprecationWarning at runtime
from .groups import FilterResult as FilterResult
from .groups import (
    GroupFilter,
    RolloutGroup,
)
from .groups import drop_uniform_rewards as drop_uniform_rewards  # deprecated alias, as FilterResult
from .health import (
    EngineGroup,
    HealthConfig,
    HealthEvent,
)
from .opening import (
    OpeningCache,
)
from .pacing import (
    Pacer,
    tune_gc,
)
from .report import (
    AccountingError,
    StepReport,
)
from .restore import (
    RestoreError,
)
from .router import (
    Router,
    RouterConfig,
    RouterError,
    RouterPolicy,
    RouterPortTaken,
)
from .scheduler import (
    RepeatedFailureError,
    RolloutProgress,
    Scheduler,
    SchedulerConfig,
    SchedulerError,
    StepBatch,
)
from .types import (
    AbortCause,
    FinishKind,
    FinishReason,
    GenerateResult,
    InferenceError,
    PromptTooLongError,
    ProtocolError,
    RequestRejectedError,
    RoutingShape,
    SamplingParams,
    continuation_budget,
)

__all__ = [
    "AbortCause",
    "AccountingError",
    "AgentConfig",
    "AskSummary",
    "ChatEndpoint",
    "ClientConfig",
    "ContextPolicy",
    "ContextView",
    "ElideToolOutput",
    "EndpointError",
    "EngineConfig",
    "EngineError",
    "EngineGroup",
    "EnginePortTaken",
    "Episode",
    "EpisodeRunner",
    "EvalConfig",
    "EvalReport",
    "FinishKind",
    "FinishReason",
    "GenerateClient",
    "GenerateResult",
    "GroupFilter",
    "HealthConfig",
    "HealthEvent",
    "InferenceClient",
    "InferenceError",
    "ModelFolderError",
    "OpeningCache",
    "Pacer",
    "PromptTooLongError",
    "ProtocolError",
    "RepeatedFailureError",
    "RequestRejectedError",
    "RestoreError",
    "Rewrite",
    "RolloutGroup",
    "RolloutProgress",
    "Router",
    "RouterConfig",
    "RouterError",
    "RouterPolicy",
    "RouterPortTaken",
    "RoutingShape",
    "SGLangEngine",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "StepBatch",
    "StepReport",
    "Summarize",
    "Window",
    "check_model_folder",
    "context_policy",
    "continuation_budget",
    "default_shim_dir",
    "detect_device",
    "evaluate",
    "evaluate_endpoint",
    "model_vocab_size",
    "parse_generate_response",
    "pass_at_k",
    "run_episode",
    "run_message_episode",
    "tune_gc",
]
