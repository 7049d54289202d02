"""RunConfig: defaults, conversions to the runtime configs, round trip, frozen, unknown keys, hash,
and every cross-field check with its message."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from agentrl.algorithms import (
    AdvantageEstimator,
    LossAggregation,
    PolicyLossKind,
    RoutingReplay,
    policy_loss_for,
)
from agentrl.data import DataConfig
from agentrl.rollout import EvalConfig, SamplingParams, SchedulerConfig
from agentrl.runner import ESTIMATOR_LOSSES, LOSS_CLIP_DEFAULTS, RunConfig
from agentrl.train import BatchingConfig, OptimizerConfig

MINIMAL: dict[str, Any] = {"model": {"path": "models/tiny"}, "data": {"train": {"path": "train.jsonl"}},
                           "environment": {"name": "toy_arithmetic"}}


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) and value else value
    return out


def make(**changes: Any) -> RunConfig:
    return RunConfig.from_dict(merged(MINIMAL, changes))


def error_of(**changes: Any) -> str:
    with pytest.raises(ValidationError) as info:
        make(**changes)
    return str(info.value)


FULL: dict[str, Any] = {
    "model": {"path": "models/qwen", "dtype": "float16", "template": "qwen3_coder", "tokenizer_path": "tok"},
    "data": {"train": {"path": "train.parquet", "format": "parquet", "fields": {"question": "problem"},
                       "shuffle": False, "seed": 7, "epochs": 3, "bad_rows": "fail"},
             "eval": [{"name": "aime", "path": "aime.jsonl", "samples_per_prompt": 4, "pass_k": [1, 4],
                       "sampling": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 512}, "every_steps": 5},
                      {"name": "gsm", "path": "gsm.jsonl"}]},
    "environment": {"name": "retool_math", "options": {"timeout_s": 5, "tools": ["python"], "nested": {"a": None}}},
    "rollout": {"engines": {"count": 2, "tp_size": 2, "context_length": 4096, "extra_args": ["--x"],
                            "env": {"A": "1"}},
                "router": {"policy": "cache_aware", "health_check_interval_s": 1},
                "sampling": {"temperature": 0.8, "top_k": 20, "stop": ["</answer>"], "max_new_tokens": 1024},
                "scheduler": {"groups_per_step": 4, "group_size": 6, "partial_rollout": True, "mask_offpolicy": True,
                              "max_staleness": 2, "over_sampling": 0.5},
                "agent": {"one_call_per_turn": True, "template_kwargs": {"enable_thinking": False}}},
    "algorithm": {"estimator": "reinforce_pp", "policy_loss": "cispo", "kl_coef": 0.01, "kl_kind": "k3",
                  "correction": "tis", "tis_clip": 3.0, "routing_replay": "rollout"},
    "train": {"backend": "megatron", "steps": 100, "data_parallel_size": 2, "tensor_parallel_size": 2,
              "optimizer": {"lr": 2e-6, "schedule": "cosine", "warmup_steps": 10, "min_lr_ratio": 0.1}},
    "cluster": {"ray_address": "ray://head:10001", "placement": "disaggregated", "accelerator": "gpu",
                "num_accelerators": 8, "trainer_accelerators": 4},
    "logging": {"run_dir": "runs/x", "wandb": True, "wandb_project": "p"},
    "checkpoint": {"every_steps": 10, "keep_last": 3, "resume": "runs/x/ckpt/step_10"},
    "mode": "bounded_staleness",
}


# -- defaults and conversions --------------------------------------------------------------------
def test_minimal_config_validates_with_the_runtime_defaults() -> None:
    cfg = make()
    assert cfg.rollout.scheduler == SchedulerConfig()
    assert cfg.data.train == DataConfig(path="train.jsonl")
    assert cfg.algorithm.to_batching_config() == BatchingConfig()
    assert cfg.train.optimizer == OptimizerConfig()
    assert cfg.rollout.sampling == SamplingParams(max_new_tokens=1024)
    assert cfg.agent_config().sampling.max_new_tokens == 1024
    assert cfg.mode == "sync" and cfg.train.backend == "torch" and cfg.cluster.accelerator == "cpu"
    assert cfg.engine_config().device == "cpu" and not cfg.engine_config().enable_memory_saver
    assert cfg.torch_backend_config().device == "cpu"
    assert cfg.run_dir().parts == ("runs", cfg.hash()[:12])


@pytest.mark.parametrize("section, runtime, changed", [
    ("scheduler", SchedulerConfig, {"max_new_tokens"}),
    ("sampling", SamplingParams, {"max_new_tokens"}),
])
def test_sections_mirror_every_field_of_their_runtime_object(section: str, runtime: type, changed: set[str]) -> None:
    value = getattr(make().rollout, section)  # the section is the runtime object itself
    runtime_defaults = {f.name: f.default for f in dataclasses.fields(runtime)}
    section_defaults = {name: getattr(value, name) for name in runtime_defaults}
    assert type(value) is runtime and set(make().to_dict()["rollout"][section]) == set(runtime_defaults)
    differ = {n for n in runtime_defaults if section_defaults[n] != runtime_defaults[n]}
    assert differ <= changed


def test_full_config_converts_to_each_runtime_object() -> None:
    cfg = RunConfig.from_dict(FULL)
    assert cfg.data.train.fields == {"question": "problem"}
    ev = cfg.data.eval[0].to_eval_config()
    assert isinstance(ev, EvalConfig) and ev.pass_k == (1, 4) and ev.sampling is not None
    assert ev.sampling.temperature == 0.6
    assert cfg.data.eval[1].to_eval_config().sampling is None
    assert cfg.data.eval[0].to_config().shuffle is False
    engine = cfg.engine_config()
    assert (engine.model_path, engine.dtype, engine.device, engine.tp_size) == ("models/qwen", "float16", "cuda", 2)
    assert engine.extra_args == ("--x",) and engine.context_length == 4096
    assert not engine.enable_memory_saver  # disaggregated: the engines keep their memory
    assert cfg.rollout.router.policy.value == "cache_aware"
    agent = cfg.agent_config()
    assert agent.context_length == 4096 and agent.one_call_per_turn and agent.sampling.stop == ("</answer>",)
    loss = cfg.loss_config()
    assert loss.policy_loss is PolicyLossKind.CISPO and loss.temperature == 0.8
    assert (loss.eps_clip, loss.eps_clip_high) == LOSS_CLIP_DEFAULTS[PolicyLossKind.CISPO]
    assert loss.kl_loss_type == "k3" and loss.correction == "tis" and loss.tis_clip == 3.0
    assert loss.routing_replay is RoutingReplay.ROLLOUT and make().loss_config().routing_replay is RoutingReplay.OFF
    with pytest.raises(ValueError, match="backend='megatron'"):
        cfg.torch_backend_config()


def test_colocated_gpu_engines_release_memory_and_the_trainer_gets_cuda() -> None:
    cfg = make(cluster={"accelerator": "gpu"})
    assert cfg.engine_config().enable_memory_saver
    backend = cfg.torch_backend_config()
    assert backend.device == "cuda"
    assert make(rollout={"sampling": {"temperature": 0.7}}).torch_backend_config().loss.temperature == 0.7


def test_the_train_section_carries_precision_sharding_checkpointing_attention_and_export_dtype() -> None:
    cfg = make(model={"dtype": "bfloat16"}, train={"dtype": "bfloat16", "activation_checkpointing": "full",
                                                   "sharding": "fsdp", "optimizer_offload": True, "attention": "varlen",
                                                   "fused_lm_head": False}, cluster={"accelerator": "gpu"})
    torch_cfg = cfg.torch_backend_config()
    assert (torch_cfg.master_weights, torch_cfg.sharding, torch_cfg.optimizer_offload) == ("float32", "fsdp", True)
    assert (torch_cfg.activation_checkpointing, torch_cfg.attention, torch_cfg.fused_lm_head) == ("full", "varlen", False)
    assert torch_cfg.uses_master_weights and torch_cfg.export_dtype == "bfloat16"
    assert make(model={"dtype": "float32"}).torch_backend_config().export_dtype == "float32"
    megatron = make(model={"dtype": "float16"}, train={"backend": "megatron", "dtype": "bfloat16",
                                                       "activation_checkpointing": "selective", "attention": "dense"})
    mcfg = megatron.megatron_backend_config()
    assert (mcfg.activation_checkpointing, mcfg.attention, mcfg.fused_lm_head, mcfg.export_dtype) == (
        "selective", "dense", True, "float16")


@pytest.mark.parametrize(("train", "message"), [
    ({"attention": "dense"}, "attention='dense' with backend='torch': expected one of"),
    ({"backend": "megatron", "attention": "model"}, "attention='model' with backend='megatron'"),
    ({"backend": "megatron", "master_weights": "none"}, "master_weights='none' with backend='megatron'"),
    ({"backend": "megatron", "sharding": "fsdp"}, "sharding='fsdp' with backend='megatron'"),
    ({"dtype": "bfloat16", "autocast": "bfloat16"}, "autocast='bfloat16' with dtype='bfloat16'"),
    ({"activation_checkpointing": "layers"}, "activation_checkpointing"),
])
def test_train_settings_that_cannot_run_are_named(train: dict[str, Any], message: str) -> None:
    assert message in error_of(train=train)


def test_cuda_kernels_and_optimizer_offload_need_an_accelerator() -> None:
    assert "train.attention='varlen' with cluster.accelerator='cpu'" in error_of(train={"attention": "varlen"})
    assert "train.optimizer_offload=True with cluster.accelerator='cpu'" in error_of(train={"optimizer_offload": True})
    gpu = make(train={"attention": "varlen", "optimizer_offload": True}, cluster={"accelerator": "gpu"})
    assert gpu.torch_backend_config().attention == "varlen"


@pytest.mark.parametrize("loss", list(PolicyLossKind))
def test_clip_ranges_default_to_the_chosen_loss(loss: PolicyLossKind) -> None:
    estimator = {"ppo": "grpo", "gspo": "gspo", "cispo": "cispo"}[loss.value]
    cfg = make(algorithm={"estimator": estimator})
    assert cfg.loss_config().policy_loss is loss
    assert (cfg.loss_config().eps_clip, cfg.loss_config().eps_clip_high) == LOSS_CLIP_DEFAULTS[loss]
    own = make(algorithm={"estimator": estimator, "eps_clip": 0.1, "eps_clip_high": 0.3}).loss_config()
    assert (own.eps_clip, own.eps_clip_high) == (0.1, 0.3)


def test_the_estimator_table_defaults_agree_with_the_algorithms_package() -> None:
    assert set(ESTIMATOR_LOSSES) == set(AdvantageEstimator)
    for estimator, losses in ESTIMATOR_LOSSES.items():
        if losses:
            assert losses[0] is policy_loss_for(estimator)
            cfg = make(algorithm={"estimator": estimator.value,
                                  "constant_normalizer": 1024.0 if estimator is AdvantageEstimator.DR_GRPO else None})
            assert cfg.loss_config().policy_loss is losses[0]
    assert make(algorithm={"estimator": "dr_grpo", "constant_normalizer": 512}).loss_config().aggregation \
        is LossAggregation.SEQ_MEAN_TOKEN_SUM_NORM


def test_learning_rate_schedule_warms_up_then_follows_the_cosine() -> None:
    opt = OptimizerConfig(lr=1e-5, schedule="cosine", warmup_steps=4, decay_steps=14, min_lr_ratio=0.1)
    ramp = [opt.lr_at(s) for s in range(4)]
    assert ramp == sorted(ramp) and ramp[0] == pytest.approx(1e-5 / 5) and ramp[-1] < 1e-5
    assert opt.lr_at(4) == pytest.approx(1e-5)
    assert opt.lr_at(9) == pytest.approx(1e-6 + 9e-6 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert opt.lr_at(14) == pytest.approx(1e-6) and opt.lr_at(100) == pytest.approx(1e-6)
    constant = OptimizerConfig(lr=3e-6)
    assert [constant.lr_at(s) for s in (0, 10, 1000)] == [3e-6] * 3
    no_end = OptimizerConfig(schedule="cosine")
    assert no_end.lr_at(5, total_steps=10) == pytest.approx(1e-6 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    with pytest.raises(ValueError, match="decay_steps or total_steps"):
        no_end.lr_at(5)


# -- round trip, frozen, unknown keys ------------------------------------------------------------
@pytest.mark.parametrize("data", [MINIMAL, FULL], ids=["minimal", "full"])
def test_to_dict_from_dict_round_trip_through_json(data: dict[str, Any]) -> None:
    cfg = RunConfig.from_dict(data)
    dumped = cfg.to_dict()
    again = RunConfig.from_dict(json.loads(json.dumps(dumped)))
    assert again == cfg and again.to_dict() == dumped and again.hash() == cfg.hash()


def test_config_and_its_sections_are_frozen() -> None:
    cfg = make()
    with pytest.raises(ValidationError, match="frozen"):
        cfg.mode = "one_step_off"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):  # a section that is a runtime dataclass
        cfg.rollout.scheduler.group_size = 4  # type: ignore[misc]


@pytest.mark.parametrize("changes, loc", [
    ({"modle": {"path": "x"}}, "modle"),
    ({"rollout": {"scheduler": {"group_sise": 4}}}, "rollout.scheduler.group_sise"),
    ({"train": {"optimizer": {"learning_rate": 1e-5}}}, "train.optimizer.learning_rate"),
    ({"data": {"eval": [{"path": "e.jsonl", "pass_at": [1]}]}}, "data.eval.0.pass_at"),
])
def test_unknown_keys_are_errors_that_name_the_key(changes: dict[str, Any], loc: str) -> None:
    message = error_of(**changes)
    assert loc in message and "Extra inputs are not permitted" in message


def test_missing_required_fields_and_bad_values_are_named() -> None:
    with pytest.raises(ValidationError) as info:
        RunConfig.from_dict({"model": {"path": "m"}, "data": {"train": {"path": "t"}}})
    assert "environment" in str(info.value) and "Field required" in str(info.value)
    assert "rollout.scheduler.group_size" in error_of(rollout={"scheduler": {"group_size": 0}})
    assert "model.template" in error_of(model={"template": "llama"})
    assert "'qwen3_coder'" in error_of(model={"template": "llama"})
    assert "algorithm.routing_replay" in error_of(algorithm={"routing_replay": "on"})
    assert "'rollout'" in error_of(algorithm={"routing_replay": "on"})
    # checks of the runtime objects still apply through the section (SamplingParams.top_k)
    assert "top_k" in error_of(rollout={"sampling": {"top_k": 0}})


# -- hash ----------------------------------------------------------------------------------------
def test_hash_ignores_key_order_and_written_out_defaults() -> None:
    cfg = RunConfig.from_dict(FULL)
    reordered = RunConfig.from_dict(dict(reversed(list(FULL.items()))))
    assert reordered.hash() == cfg.hash()
    explicit = make(rollout={"scheduler": {"group_size": 8, "groups_per_step": 8}}, mode="sync")
    assert explicit.hash() == make().hash()
    assert len(cfg.hash()) == 64 and int(cfg.hash(), 16) >= 0


def test_hash_changes_with_what_is_trained_but_not_with_resume_cluster_address_or_logging() -> None:
    base = make()
    assert make(rollout={"scheduler": {"group_size": 4}}).hash() != base.hash()
    assert make(algorithm={"kl_coef": 0.001}).hash() != base.hash()
    assert make(environment={"options": {"k": 1}}).hash() != base.hash()
    assert make(checkpoint={"resume": "runs/a/ckpt/step_3"}).hash() == base.hash()
    assert make(cluster={"ray_address": "ray://h:1"}).hash() == base.hash()
    assert make(sandbox={"executor": "ray", "executors_per_node": 4}).hash() == base.hash()  # where tools run
    assert make(logging={"run_dir": "elsewhere", "log_every": 5, "tensorboard": True}).hash() == base.hash()


def test_hash_is_the_same_in_a_fresh_interpreter() -> None:
    cfg = RunConfig.from_dict(FULL)
    code = ("import json, sys; from agentrl.runner import RunConfig; "
            "print(RunConfig.from_dict(json.loads(sys.stdin.read())).hash())")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(FULL), capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == cfg.hash()


# -- cross-field checks ---------------------------------------------------------------------------
def test_gspo_advantages_with_the_ppo_token_loss_are_refused() -> None:
    message = error_of(algorithm={"estimator": "gspo", "policy_loss": "ppo"})
    assert "policy_loss='ppo' does not fit estimator='gspo': expected 'gspo'" in message


def test_grpo_with_the_gspo_loss_points_at_the_gspo_estimator() -> None:
    message = error_of(algorithm={"estimator": "grpo", "policy_loss": "gspo"})
    assert "expected 'ppo'" in message and "use estimator='gspo'" in message


def test_token_level_estimators_accept_the_cispo_loss_but_not_gspo() -> None:
    assert make(algorithm={"estimator": "reinforce_pp_baseline", "policy_loss": "cispo"}).loss_config().policy_loss \
        is PolicyLossKind.CISPO
    assert "expected 'ppo' or 'cispo'" in error_of(algorithm={"estimator": "reinforce_pp", "policy_loss": "gspo"})


def test_ppo_estimator_is_refused_until_a_backend_has_a_critic() -> None:
    assert "GAE needs a critic" in error_of(algorithm={"estimator": "ppo"})


@pytest.mark.parametrize("algorithm, expected", [
    ({"estimator": "dr_grpo"}, "constant_normalizer=None with aggregation 'seq_mean_token_sum_norm'"),
    ({"estimator": "gspo", "dual_clip_c": 3.0}, "dual_clip_c=3.0 applies to the 'ppo' loss only"),
    ({"estimator": "gspo", "std_normalize": False}, "std_normalize=False with estimator='gspo'"),
    ({"tis_clip": 1.0, "tis_clip_low": 1.5}, "tis_clip_low=1.5 > tis_clip=1.0"),
    ({"mis_low": 3.0, "mis_high": 2.0}, "mis_low=3.0 > mis_high=2.0"),
    ({"correction": "mis", "old_logprobs": "rollout"}, "correction='mis' with old_logprobs='rollout'"),
])
def test_algorithm_checks(algorithm: dict[str, Any], expected: str) -> None:
    assert expected in error_of(algorithm=algorithm)


def test_batch_not_divisible_by_data_parallel_size() -> None:
    message = error_of(rollout={"scheduler": {"groups_per_step": 3, "group_size": 5}}, train={"data_parallel_size": 2})
    assert "groups_per_step × group_size = 3 × 5 = 15" in message
    assert "not divisible by train.data_parallel_size=2" in message
    assert make(rollout={"scheduler": {"groups_per_step": 3, "group_size": 4}}, train={"data_parallel_size": 4})


def test_more_engines_than_accelerators_when_disaggregated() -> None:
    gpu = {"accelerator": "gpu", "num_accelerators": 4}
    message = error_of(rollout={"engines": {"count": 4}}, cluster={**gpu, "placement": "disaggregated"})
    assert "rollout.engines.count=4 engines × 1 + 1 for the trainer need 5 accelerators" in message
    assert "cluster.num_accelerators=4" in message
    # colocated engines share the trainer's accelerators: 4 engines fit on 4
    assert make(rollout={"engines": {"count": 4}}, cluster={**gpu, "placement": "colocated"})
    assert "need 8 accelerators" in error_of(rollout={"engines": {"count": 4, "tp_size": 2}},
                                             cluster={**gpu, "placement": "colocated"})


def test_megatron_ranks_must_match_the_trainer_accelerators() -> None:
    message = error_of(train={"backend": "megatron", "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
                       cluster={"accelerator": "gpu", "trainer_accelerators": 2})
    assert "cluster.trainer_accelerators=2" in message
    assert "tensor_parallel_size × pipeline_parallel_size × data_parallel_size = 2 × 2 × 1 = 4" in message
    assert make(train={"backend": "megatron", "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
                cluster={"accelerator": "gpu", "trainer_accelerators": 4, "placement": "disaggregated"})


def test_torch_backend_is_data_parallel_only() -> None:
    assert "the torch backend is data-parallel only" in error_of(train={"tensor_parallel_size": 2})


def test_engine_accelerators_must_match_tensor_and_data_parallel_size() -> None:
    message = error_of(rollout={"engines": {"tp_size": 2}}, cluster={"accelerator": "gpu", "accelerators_per_engine": 1})
    assert "cluster.accelerators_per_engine=1 but rollout.engines.tp_size × dp_size = 2 × 1 = 2" in message


def test_accelerator_counts_are_refused_on_cpu_and_npu_runs_are_accepted() -> None:
    assert "num_accelerators=2 with accelerator='cpu'" in error_of(cluster={"num_accelerators": 2})
    config = RunConfig.from_dict({**MINIMAL, "cluster": {"accelerator": "npu", "num_accelerators": 2}})
    assert config.engine_config().device == "npu" and config.cluster.train_device == "npu"


def test_colocated_engines_must_release_memory_on_an_accelerator() -> None:
    message = error_of(rollout={"engines": {"enable_memory_saver": False}}, cluster={"accelerator": "gpu"})
    assert "rollout.engines.enable_memory_saver=False with placement='colocated'" in message


def test_mask_offpolicy_without_partial_rollout_is_an_error_where_it_masks_nothing() -> None:
    for mode in ("sync", "one_step_off"):
        message = error_of(rollout={"scheduler": {"mask_offpolicy": True}}, mode=mode)
        assert f"rollout.scheduler.mask_offpolicy=True with mode={mode!r} and partial_rollout=False" in message
    assert make(rollout={"scheduler": {"mask_offpolicy": True, "partial_rollout": True}})
    assert make(rollout={"scheduler": {"mask_offpolicy": True, "max_staleness": 1}}, mode="bounded_staleness")


def test_max_staleness_against_the_loop_mode() -> None:
    assert "max_staleness=2 with mode='sync' and partial_rollout=False has no effect" in error_of(
        rollout={"scheduler": {"max_staleness": 2}})
    assert make(rollout={"scheduler": {"max_staleness": 1, "partial_rollout": True}}).mode == "sync"
    assert "max_staleness=None with mode='bounded_staleness': expected an int >= 1" in error_of(mode="bounded_staleness")
    assert "max_staleness=0 with mode='bounded_staleness'" in error_of(
        mode="bounded_staleness", rollout={"scheduler": {"max_staleness": 0}})
    assert "max_staleness=0 with mode='one_step_off'" in error_of(
        mode="one_step_off", rollout={"scheduler": {"max_staleness": 0}})
    assert make(mode="one_step_off").mode == "one_step_off"


def test_async_modes_cannot_colocate_on_an_accelerator() -> None:
    message = error_of(mode="one_step_off", cluster={"accelerator": "gpu"})
    assert "mode='one_step_off' with cluster.placement='colocated' on 'gpu'" in message
    assert make(mode="one_step_off", cluster={"accelerator": "gpu", "placement": "disaggregated"})
    assert make(mode="one_step_off")  # on CPU both share the machine's cores


def test_eval_checks() -> None:
    def evals(*sets: dict[str, Any]) -> str:
        return error_of(data={"eval": list(sets)})

    sampled = {"temperature": 0.7}
    message = evals({"path": "e.jsonl", "samples_per_prompt": 2, "pass_k": [1, 4], "sampling": sampled})
    assert "pass_k=[1, 4]: each k must be in [1, samples_per_prompt=2]" in message and "data.eval.0" in message
    assert "samples_per_prompt=4 with greedy sampling" in evals({"path": "e.jsonl", "samples_per_prompt": 4})
    assert "['a'] used more than once" in evals({"name": "a", "path": "x"}, {"name": "a", "path": "y"})
    assert "data.eval[0].sampling.max_new_tokens=4096 leaves no room" in error_of(
        data={"eval": [{"path": "e", "sampling": {"max_new_tokens": 4096}}]},
        rollout={"engines": {"context_length": 4096}, "sampling": {"max_new_tokens": 512}})


@pytest.mark.parametrize("changes, expected", [
    ({"rollout": {"sampling": {"temperature": 0}}}, "rollout.sampling.temperature=0 (greedy)"),
    ({"data": {"train": {"epochs": None}}}, "train.steps=None with data.train.epochs=None"),
    ({"train": {"optimizer": {"schedule": "cosine"}}}, "schedule='cosine' with decay_steps=None and train.steps=None"),
    ({"train": {"steps": 5, "optimizer": {"warmup_steps": 5}}}, "warmup_steps=5 >= train.steps=5"),
    ({"rollout": {"engines": {"context_length": 1024}}}, "sampling.max_new_tokens=1024 leaves no room"),
    ({"rollout": {"engines": {"context_length": 1024}, "agent": {"context_length": 2048}}},
     "agent.context_length=2048 exceeds engines.context_length=1024"),
    ({"rollout": {"scheduler": {"group_size": 1}}}, "min_group_size=2: expected at most group_size=1"),
    ({"logging": {"wandb_project": "p"}}, "wandb_project='p' with wandb=False"),
])
def test_other_checks(changes: dict[str, Any], expected: str) -> None:
    assert expected in error_of(**changes)


def test_all_cross_section_problems_are_reported_together() -> None:
    message = error_of(mode="bounded_staleness", rollout={"sampling": {"temperature": 0}},
                       train={"data_parallel_size": 3})
    assert "3 problems:" in message
    for part in ("mode='bounded_staleness'", "temperature=0", "data_parallel_size=3"):
        assert part in message


def test_engine_urls_must_match_the_count_and_be_urls() -> None:
    from pydantic import ValidationError

    from agentrl.runner import EnginesSection

    assert EnginesSection(count=2, urls=("http://127.0.0.1:1", "http://127.0.0.1:2")).urls[1] == "http://127.0.0.1:2"
    with pytest.raises(ValidationError, match=r"urls: 2 engine URLs with count=1; expected count = 2"):
        EnginesSection(urls=("http://127.0.0.1:1", "http://127.0.0.1:2"))
    with pytest.raises(ValidationError, match=r"urls: '127.0.0.1:1' is not an http\(s\) URL"):
        EnginesSection(urls=("127.0.0.1:1",))


def test_megatron_backend_config_from_the_run_config() -> None:
    config = make(train={"backend": "megatron", "tensor_parallel_size": 2, "data_parallel_size": 1,
                         "dtype": "bfloat16", "max_tokens_per_micro_batch": 512},
                  cluster={"accelerator": "gpu", "trainer_accelerators": 2, "placement": "disaggregated"})
    mc = config.megatron_backend_config()
    assert (mc.tensor_parallel_size, mc.pipeline_parallel_size, mc.dtype, mc.packing.max_tokens) == (2, 1, "bfloat16", 512)
    assert mc.loss == config.loss_config() and mc.device == config.cluster.train_device
    assert "dtype='float64' with backend='megatron'" in error_of(train={"backend": "megatron", "dtype": "float64"})
    with pytest.raises(ValueError, match="is for backend 'megatron'"):
        make().megatron_backend_config()


def test_a_mixture_of_experts_model_gets_engines_that_return_routing_and_episodes_that_store_it() -> None:
    from agentrl.rollout import RoutingShape
    from agentrl.testing import build_tiny_model, build_tiny_moe_model

    moe = make(model={"path": str(build_tiny_moe_model())})
    assert moe.model_routing() == RoutingShape(layers=2, top_k=2, experts=8)
    assert moe.engine_config().return_routed_experts
    assert "--enable-return-routed-experts" in moe.engine_config().command(30000, "cpu")
    assert moe.agent_config().routed_experts == RoutingShape(layers=2, top_k=2, experts=8)
    dense = make(model={"path": str(build_tiny_model())})
    assert dense.model_routing() is None and not dense.engine_config().return_routed_experts
    assert dense.agent_config().routed_experts is None
    assert make().model_routing() is None  # a folder this machine does not have: nothing asked
