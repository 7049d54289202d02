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
  token boundary between an environment and an engine.
"""

from agentrl.model_folder import ModelFolderError, check_model_folder, model_vocab_size
from agentrl.rollout.agent import AgentConfig, Episode, GenerateClient, run_episode
from agentrl.rollout.client import ClientConfig, InferenceClient, parse_generate_response
from agentrl.rollout.engine import EngineConfig, EngineError, SGLangEngine, default_shim_dir, detect_device
from agentrl.rollout.health import EngineGroup, HealthConfig, HealthEvent
from agentrl.rollout.router import Router, RouterConfig, RouterError, RouterPolicy
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
    "AgentConfig",
    "ClientConfig",
    "EngineConfig",
    "EngineError",
    "EngineGroup",
    "Episode",
    "FinishKind",
    "FinishReason",
    "GenerateClient",
    "GenerateResult",
    "HealthConfig",
    "HealthEvent",
    "InferenceClient",
    "InferenceError",
    "ModelFolderError",
    "PromptTooLongError",
    "ProtocolError",
    "RequestRejectedError",
    "Router",
    "RouterConfig",
    "RouterError",
    "RouterPolicy",
    "SGLangEngine",
    "SamplingParams",
    "check_model_folder",
    "continuation_budget",
    "default_shim_dir",
    "detect_device",
    "model_vocab_size",
    "parse_generate_response",
    "run_episode",
]
