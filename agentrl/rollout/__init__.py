"""Rollout side of agentrl: the inference client, SGLang engines, sglang-router and their health.

- :class:`InferenceClient` / :class:`ClientConfig`: async SGLang ``/generate`` client (token ids in,
  ids + logprobs out), retries only on transport errors and 5xx, per-request deadline, abort.
- :class:`SamplingParams`, :class:`GenerateResult`, :class:`FinishReason`: immutable request/result types;
  :func:`continuation_budget` computes a resumed turn's ``max_new_tokens``.
- :class:`SGLangEngine` / :class:`EngineConfig`: launch (GPU or CPU) or attach, pause, flush, weight updates;
  :func:`check_model_folder` / :func:`model_vocab_size`: the up-front model-folder check and the model's vocabulary.
- :class:`Router` / :class:`RouterConfig`: the sglang-router subprocess and its worker API.
- :class:`EngineGroup` / :class:`HealthConfig`: router + engines + the monitor that restarts dead engines.
- :func:`run_episode` / :class:`AgentConfig` / :class:`Episode`: the multi-turn agent loop that owns the
  token boundary between an environment and an engine; :class:`EpisodeRunner` is the same loop as a
  resumable object (partial rollouts); :class:`OpeningCache` renders a group's shared opening once.
- :class:`Scheduler` / :class:`SchedulerConfig`: one training step's batch of complete prompt groups
  (:class:`StepBatch` of :class:`RolloutGroup`), dynamic sampling (:class:`FilterResult`,
  :func:`drop_uniform_rewards`), abort, partial rollouts, staleness; :class:`StepReport` accounts for
  every prompt. :func:`evaluate` / :class:`EvalConfig` / :class:`EvalReport`: eval rollouts;
  :class:`ChatEndpoint` / :func:`evaluate_endpoint`: message-level episodes against an OpenAI-compatible server.
"""

from agentrl.model_folder import ModelFolderError, check_model_folder, model_vocab_size
from agentrl.rollout.agent import AgentConfig, Episode, EpisodeRunner, GenerateClient, run_episode
from agentrl.rollout.client import ClientConfig, InferenceClient, parse_generate_response
from agentrl.rollout.endpoint import ChatEndpoint, EndpointError, evaluate_endpoint, run_message_episode
from agentrl.rollout.engine import EngineConfig, EngineError, SGLangEngine, default_shim_dir, detect_device
from agentrl.rollout.eval import EvalConfig, EvalReport, evaluate, pass_at_k
from agentrl.rollout.groups import FilterResult, GroupFilter, RolloutGroup, drop_uniform_rewards
from agentrl.rollout.health import EngineGroup, HealthConfig, HealthEvent
from agentrl.rollout.opening import OpeningCache
from agentrl.rollout.pacing import Pacer, tune_gc
from agentrl.rollout.report import AccountingError, StepReport
from agentrl.rollout.restore import RestoreError
from agentrl.rollout.router import Router, RouterConfig, RouterError, RouterPolicy
from agentrl.rollout.scheduler import RolloutProgress, Scheduler, SchedulerConfig, SchedulerError, StepBatch
from agentrl.rollout.types import (
    AbortCause,
    FinishKind,
    FinishReason,
    GenerateResult,
    InferenceError,
    PromptTooLongError,
    ProtocolError,
    RequestRejectedError,
    SamplingParams,
    continuation_budget,
)

__all__ = [
    "AbortCause",
    "AccountingError",
    "AgentConfig",
    "ChatEndpoint",
    "ClientConfig",
    "EndpointError",
    "EngineConfig",
    "EngineError",
    "EngineGroup",
    "Episode",
    "EpisodeRunner",
    "EvalConfig",
    "EvalReport",
    "FilterResult",
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
    "RequestRejectedError",
    "RestoreError",
    "RolloutGroup",
    "RolloutProgress",
    "Router",
    "RouterConfig",
    "RouterError",
    "RouterPolicy",
    "SGLangEngine",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "StepBatch",
    "StepReport",
    "check_model_folder",
    "continuation_budget",
    "default_shim_dir",
    "detect_device",
    "drop_uniform_rewards",
    "evaluate",
    "evaluate_endpoint",
    "model_vocab_size",
    "parse_generate_response",
    "pass_at_k",
    "run_episode",
    "run_message_episode",
    "tune_gc",
]
