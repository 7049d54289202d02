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
  (:class:`StepBatch` of :class:`RolloutGroup`), dynamic sampling (a :data:`GroupFilter`; the verdict
  type and the built-in filter are :class:`agentrl.rewards.FilterResult` and
  :func:`agentrl.rewards.drop_uniform_rewards`, whose names here are deprecated aliases), abort,
  partial rollouts, staleness; :class:`StepReport` accounts for
  every prompt. :func:`evaluate` / :class:`EvalConfig` / :class:`EvalReport`: eval rollouts;
  :class:`ChatEndpoint` / :func:`evaluate_endpoint`: message-level episodes against an OpenAI-compatible server.
- :class:`Window`, :class:`ElideToolOutput`, :class:`Summarize` (:class:`ContextPolicy` for your own): what an
  episode does when its next request would not fit (:mod:`agentrl.rollout.context`).
"""

import lazy_loader

from agentrl._deprecated import moved_names

# The names are listed in __init__.pyi; each submodule is imported on first use, so importing a
# config module (the run config's engine, router and scheduler sections) does not pull in the
# HTTP clients. The names that moved out are served, with a DeprecationWarning, for one release.
_MOVED = {"FilterResult": "agentrl.rewards", "drop_uniform_rewards": "agentrl.rewards"}
_lazy_getattr, _, _names = lazy_loader.attach_stub(__name__, __file__)
__all__ = [name for name in _names if name not in _MOVED]
__getattr__ = moved_names(__name__, _MOVED, fallback=_lazy_getattr)


def __dir__() -> list[str]:
    return list(__all__)
