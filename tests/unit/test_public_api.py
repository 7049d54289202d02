"""The public surface is pinned: every subpackage declares ``__all__``, every name in it resolves,
and the names other code and external checks rely on are there."""

from __future__ import annotations

import importlib

import pytest

REQUIRED: dict[str, set[str]] = {
    "agentrl": {"Trajectory", "Segment", "SegmentKind", "Status", "StopReason", "TrajectoryError", "Episode",
                "save_episodes", "load_episodes", "iter_episodes", "EpisodeError", "ErrorKind", "status_for"},
    "agentrl.trajectory": {"EpisodeError", "ErrorKind", "status_for"},
    "agentrl.chat": {"ChatTemplate", "parse_tool_calls", "Message", "ToolCall", "ParsedReply", "ToolCallFailure",
                     "FailureKind", "BridgeResult", "BridgeOutcome", "validate_arguments"},
    "agentrl.rollout": {"InferenceClient", "SamplingParams", "GenerateResult", "SGLangEngine", "Router",
                        "continuation_budget", "run_episode", "AgentConfig", "EpisodeRunner", "Episode", "AbortCause", "Scheduler", "RestoreError",
                        "SchedulerConfig", "StepBatch", "StepReport", "RolloutGroup", "OpeningCache", "ChatEndpoint", "EndpointError",
                        "evaluate_endpoint", "run_message_episode", "ContextPolicy", "Window", "ElideToolOutput",
                        "Summarize"},
    "agentrl.data": {"DataSource", "DataConfig", "DataRow", "BadRow", "DataError", "DataExhausted"},
    "agentrl.algorithms": {"group_advantages", "kl", "ppo_clip_loss", "gspo_loss", "cispo_loss", "tis_weights",
                           "mis_weights", "reduce_loss", "logprobs_from_logits", "entropy_from_logits"},
    "agentrl.train": {"TorchTrainBackend", "TrainBackend", "LoraSettings", "build_training_batch", "plan_micro_batches", "sft_objective",
                      "plan_shared_prefix_micro_batches", "shared_prefix_layout", "PrefixLayout"},
    "agentrl.train.megatron": {"MegatronTrainBackend", "MegatronBackendConfig", "Qwen3Spec", "build_gpt_model",
                               "check_transformer_config", "transformer_config", "vocab_parallel_logprobs",
                               "load_hf_weights", "iter_hf_weights", "shard_for_rank", "merge_shards"},
    "agentrl.rewards": {"math_answer_reward", "drop_uniform_rewards", "FilterResult"},
    "agentrl.testing": {"build_tokenizer", "build_tiny_model", "build_tiny_moe_model"},
    "agentrl.testing.gguf": {"write_tiny_gguf", "TINY_LLAMA_CONFIG"},
    "agentrl.models": {"import_gguf", "read_gguf_info", "readable_architectures", "GgufImportError", "KNOWN_GGUFS",
                       "KnownGguf", "fetch_known", "FetchError", "imported_from"},
    "agentrl.cli.models": {"models_app"},
    "agentrl.tools": {"Tool", "ToolResult", "tool", "PythonTool", "calculator"},
    "agentrl.tools.sandbox": {"create_sandbox", "Sandbox", "ExecResult"},
    "agentrl.environments": {"Environment", "StepResult", "make_group", "check_environment", "ToyArithmeticEnv",
                             "RetoolMathEnv"},
    "agentrl.cli": {"app", "main"},
    "agentrl.inspect": {"trajectory_html", "episode_html", "write_viewer", "view", "View", "token_decoder",
                        "RunIndex", "EpisodeRow", "GroupView", "RunFolder", "InspectError", "read_episodes_file",
                        "write_run_report", "write_file_report", "PROVENANCE_COLOURS", "calls_by_message"},
    "agentrl.testing.chromium": {"HeadlessChromium", "PageLoad", "ChromiumError", "chromium_path"},
    "agentrl.sft": {"TranscriptBuilder", "TranscriptError", "episode_from_messages", "SftConfig", "run_sft",
                    "arithmetic_conversations"},
    "agentrl.cli.config_files": {"ConfigError", "ResolvedConfig", "load_config_file", "load_run_config",
                                 "apply_overrides", "parse_override"},
    "agentrl.environments.registry": {"resolve", "available", "RegistryError", "ENTRY_POINT_GROUPS"},
    "agentrl.runner": {"RunConfig", "ModelSection", "DataSection", "EvalDatasetSection",
                       "EnvironmentSection", "RolloutSection", "EnginesSection",
                       "AgentSection", "AlgorithmSection", "TrainSection",
                       "ClusterSection", "LoggingSection", "CheckpointSection", "ESTIMATOR_LOSSES",
                       "CheckpointError", "CheckpointWriteError", "Runner", "RunCallback", "RunnerError",
                       "WeightSyncConfig", "WeightSyncError", "ProbeError", "SinkUnavailableError"},
    # the runner's machinery, out of the package's surface: its modules
    "agentrl.runner.checks": {"run_checks"},
    "agentrl.runner.rundir": {"RunDirectory", "RunDirError"},
    "agentrl.runner.ledger": {"PromptLedger", "LedgerError", "LedgerStep"},
    "agentrl.runner.checkpoint": {"RunCheckpointer", "LoadedCheckpoint"},
    "agentrl.runner.rollout_service": {"RolloutService"},
    "agentrl.runner.cluster": {"RayRuntime", "spawn", "TrainGroup", "TrainGroupError"},
    "agentrl.runner.placement": {"PlacementPlan", "PlacedGroups", "ActorPlacement", "BundleGroup", "PlacementError"},
    "agentrl.runner.weights": {"DiskWeightSync", "SyncReport"},
    "agentrl.runner.probe": {"LogprobProbe", "ProbeReport", "logprob_mismatch", "probe_sequences", "backend_scorer"},
    "agentrl.runner.cpu": {"CpuPlan", "plan_cpu"},
    "agentrl.runner.logging_sinks": {"TensorBoardSink", "WandbSink", "sinks_from_config"},
}

# public names that moved: (old module, name) -> the module they live in now ("module:NewName" when renamed
# as it moved); the old name is a deprecated alias for one release
MOVED: dict[tuple[str, str], str] = {
    ("agentrl.rollout", "FilterResult"): "agentrl.rewards",
    ("agentrl.rollout", "drop_uniform_rewards"): "agentrl.rewards",
    ("agentrl.rollout.groups", "FilterResult"): "agentrl.rewards",
    ("agentrl.rollout.groups", "drop_uniform_rewards"): "agentrl.rewards",
    **{("agentrl.rollout.process", name): "agentrl._reaper" for name in (
        "reap_with_this_process", "unreap", "reap_path_with_this_process", "unreap_path",
        "reap_container_with_this_process", "unreap_container")},
    # run-config sections that are now the runtime objects they used to copy
    ("agentrl.runner", "DatasetSection"): "agentrl.data:DataConfig",
    ("agentrl.runner", "OptimizerSection"): "agentrl.train:OptimizerConfig",
    ("agentrl.runner", "RouterSection"): "agentrl.rollout:RouterConfig",
    ("agentrl.runner", "SamplingSection"): "agentrl.rollout:SamplingParams",
    ("agentrl.runner", "SchedulerSection"): "agentrl.rollout:SchedulerConfig",
    # the run function is agentrl.run (agentrl.train is the package of train backends)
    ("agentrl", "train_async"): "agentrl.runner.api:run_async",
    ("agentrl.runner.api", "train"): "agentrl.runner.api:run",
    ("agentrl.runner.api", "train_async"): "agentrl.runner.api:run_async",
    # the runner's machinery: importable from its modules, no longer re-exported by the package
    **{("agentrl.runner", name): f"agentrl.runner.{module}" for module, names in {
        "checkpoint": ("LoadedCheckpoint", "RunCheckpointer"), "checks": ("LoopMode", "run_checks"),
        "cluster": ("RayRuntime", "TrainGroup", "TrainGroupError", "spawn"), "config": ("HASH_EXCLUDED",),
        "cpu": ("CpuPlan", "plan_cpu"), "ledger": ("LedgerError", "LedgerStep", "PromptLedger"),
        "logging_sinks": ("TensorBoardSink", "WandbSink", "sinks_from_config"), "loop": ("LoopSettings",),
        "placement": ("ActorPlacement", "BundleGroup", "PlacedGroups", "PlacementError", "PlacementPlan"),
        "probe": ("LogprobProbe", "ProbeReport", "backend_scorer", "logprob_mismatch", "probe_sequences"),
        "rollout_service": ("RolloutService", "WeightLoader"), "rundir": ("RunDirError", "RunDirectory"),
        "weights": ("DiskWeightSync", "SyncReport")}.items() for name in names},
}


@pytest.mark.parametrize("module_name", sorted(REQUIRED))
def test_all_is_declared_resolves_and_contains_the_contract(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list), f"{module_name} has no __all__ list"
    assert len(exported) == len(set(exported)), f"{module_name}.__all__ has duplicates"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ names that do not resolve: {missing}"
    assert REQUIRED[module_name] <= set(exported), f"{module_name} lacks {REQUIRED[module_name] - set(exported)}"


def test_agentrl_run_is_the_run_function_and_agentrl_train_only_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """``agentrl.run`` is the documented run function; ``agentrl.train`` is the package of train backends,
    before and after building a run config imports it (no module that is also a function)."""
    import types

    import agentrl
    import agentrl.runner.api as api
    from agentrl.runner import RunConfig  # noqa: F401  (imports agentrl.train.config)

    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []
    monkeypatch.setattr(api, "run", lambda *args, **kwargs: calls.append((args, kwargs)) or "summary")
    assert agentrl.run("config", environment="Env", use_ray=False) == "summary"
    assert calls == [(("config",), {"environment": "Env", "use_ray": False})]
    assert agentrl.train is importlib.import_module("agentrl.train") and type(agentrl.train) is types.ModuleType
    assert "TorchTrainBackend" in agentrl.train.__all__ and not callable(agentrl.train)
    from agentrl import run_async

    assert run_async is api.run_async and {"run", "run_async"} <= set(agentrl.__all__)


@pytest.mark.parametrize(("old", "name"), sorted(MOVED))
def test_moved_names_keep_a_deprecated_alias(old: str, name: str) -> None:
    target, _, new_name = MOVED[old, name].partition(":")
    module, new, new_name = importlib.import_module(old), importlib.import_module(target), new_name or name
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {new.__name__}\.{new_name}") as record:
        alias = getattr(module, name)
    assert alias is getattr(new, new_name)
    assert record[0].filename == __file__  # the warning points at the line that used the old name
    assert name not in module.__all__ and new_name in new.__all__
