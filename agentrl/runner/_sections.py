"""Run-config sections: model, data, environment, train, cluster, logging, checkpoint.

A component is given its section (or the runtime object it converts to), never the root
:class:`~agentrl.runner.RunConfig`. Where a run sets a runtime object's fields as they are, the
section is that object (:class:`~agentrl._config.RunFields`): ``data.train`` is a
:class:`~agentrl.data.DataConfig`, ``train.optimizer`` an :class:`~agentrl.train.OptimizerConfig`
(AdamW and the learning-rate schedule). The others convert (``to_config()``...), the runner filling
in what the file does not say.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, model_validator

from agentrl._config import RunFields, Section, TemplateName
from agentrl.algorithms import DEFAULT_CHUNK_SIZE
from agentrl.data.source import BadRowPolicy, DataConfig, DataFormat
from agentrl.rollout.eval import EvalConfig
from agentrl.rollout.types import SamplingParams
from agentrl.runner._rollout_sections import RUN_SAMPLING
from agentrl.train.config import (
    DEFAULT_LORA_LR,
    LoraSettings,
    LossConfig,
    OptimizerConfig,
    PackingConfig,
    TorchBackendConfig,
)
from agentrl.train.megatron.config import MegatronBackendConfig

__all__ = ["RUN_DATASET", "RUN_OPTIMIZER", "CheckpointSection", "ClusterSection", "DataSection", "EnvironmentSection",
           "EvalDatasetSection", "LoggingSection", "ModelSection", "TrainSection"]

RUN_DATASET = RunFields(DataConfig, keys=("path", "format", "fields", "split", "bad_rows", "shuffle", "seed", "epochs"))
"""The training prompts: file, field mapping, seeded order, epochs (every :class:`DataConfig` field)."""

RUN_OPTIMIZER = RunFields(OptimizerConfig)
"""AdamW and the learning-rate schedule (every :class:`OptimizerConfig` field, with its default)."""

Accelerator = Literal["cpu", "gpu", "npu"]
Placement = Literal["colocated", "disaggregated"]
TrainBackendName = Literal["torch", "megatron"]
ExportDtype = Literal["auto", "bfloat16", "float16", "float32"]
TORCH_ATTENTION = ("auto", "flash_attn", "varlen", "per_document", "model")
MEGATRON_ATTENTION = ("auto", "te", "per_document", "dense")


class ModelSection(Section):
    """The policy: a Hugging Face folder, the dtype engines serve it in (and weight sync exports),
    the chat template that owns its token boundary, and a tokenizer folder (``None``: ``path``)."""

    path: str = Field(min_length=1)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    template: TemplateName = "qwen3"
    tokenizer_path: str | None = Field(default=None, min_length=1)

    @property
    def tokenizer(self) -> str:
        """Where the tokenizer is read from."""
        return self.tokenizer_path if self.tokenizer_path is not None else self.path


class EvalDatasetSection(Section):
    """One evaluation set, read in file order once per evaluation, with its own sampling.

    ``path``, ``format``, ``fields``, ``split``, ``bad_rows``: as for the training prompts
    (:class:`DataConfig`). ``sampling`` ``None``: greedy with the rollout's per-turn budget.
    ``every_steps``: evaluate after every that many training steps (and at the end of the run);
    ``at_start``: also before the first step (after a warm-up: the warmed-up model's figures).
    """

    path: str = Field(min_length=1)
    format: DataFormat = DataFormat.AUTO
    fields: dict[str, str] = Field(default_factory=dict)
    split: str | None = None
    bad_rows: BadRowPolicy = BadRowPolicy.SKIP
    name: str = Field(default="eval", min_length=1)
    samples_per_prompt: int = Field(default=1, ge=1)
    pass_k: tuple[int, ...] = (1,)
    sampling: Annotated[SamplingParams, RUN_SAMPLING] | None = None
    correct_at: float = 1.0
    max_concurrency: int = Field(default=256, ge=1)
    every_steps: int = Field(default=10, ge=1)
    at_start: bool = False

    def to_config(self) -> DataConfig:
        return DataConfig(path=self.path, format=self.format, fields=dict(self.fields), shuffle=False, epochs=1,
                          bad_rows=self.bad_rows, split=self.split)

    def to_eval_config(self) -> EvalConfig:
        return EvalConfig(name=self.name, samples_per_prompt=self.samples_per_prompt,
                          sampling=self.sampling,
                          pass_k=self.pass_k, correct_at=self.correct_at, max_concurrency=self.max_concurrency)

    @model_validator(mode="after")
    def _consistent(self) -> EvalDatasetSection:
        bad = [k for k in self.pass_k if not 1 <= k <= self.samples_per_prompt]
        if bad or not self.pass_k:
            raise ValueError(f"pass_k={list(self.pass_k)}: each k must be in [1, samples_per_prompt="
                             f"{self.samples_per_prompt}] and at least one given (out of range: {bad})")
        if self.sampling is not None and self.sampling.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens={self.sampling.max_new_tokens}: expected an int >= 1 (0 only "
                             "scores a prompt)")
        greedy = self.sampling is None or self.sampling.temperature == 0
        if greedy and self.samples_per_prompt > 1:
            raise ValueError(f"samples_per_prompt={self.samples_per_prompt} with greedy sampling draws the same "
                             "answer each time: expected samples_per_prompt=1, or sampling.temperature > 0")
        self.to_config()
        self.to_eval_config()
        return self


class DataSection(Section):
    """``train``: the training prompts; ``eval``: evaluation sets, each under a distinct ``name``."""

    train: Annotated[DataConfig, RUN_DATASET]
    eval: tuple[EvalDatasetSection, ...] = ()

    @model_validator(mode="after")
    def _distinct_names(self) -> DataSection:
        names = [e.name for e in self.eval]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"eval[*].name: {dupes} used more than once; expected a distinct name per eval set")
        return self


class EnvironmentSection(Section):
    """The environment by name (resolved by the runner or the CLI's registry) and its options.

    ``limits``: budgets that replace the environment's own (:class:`~agentrl.environments.EnvLimits`
    fields: ``max_turns``, ``max_tool_calls``, ``max_context_tokens`` (the context of one request),
    ``max_sampled_tokens`` (sampled tokens over the whole rollout); unset ones keep the environment's).
    ``context``: the context policy, ``policy`` (``none``, ``window``, ``elide_tool_output``,
    ``summarize``) and that policy's settings (``trigger``, ``target``, ``keep_turns``, ``instruction``,
    ``max_tokens``, ``prefix``, ``train_summary``: :mod:`agentrl.rollout.context`); empty: the
    environment's own (none unless its class sets one).
    """

    name: str = Field(min_length=1)
    options: dict[str, JsonValue] = Field(default_factory=dict)
    limits: dict[str, int | None] = Field(default_factory=dict)
    context: dict[str, JsonValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _budgets(self) -> EnvironmentSection:
        import dataclasses

        from agentrl.environments.policy import EnvLimits

        known = [f.name for f in dataclasses.fields(EnvLimits)]
        unknown = sorted(set(self.limits) - set(known))
        if unknown:
            raise ValueError(f"limits: unknown key(s) {', '.join(unknown)}; expected some of {', '.join(known)}")
        try:
            EnvLimits(**self.limits)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ValueError(f"limits: {exc}") from None
        self.context_policy()
        return self

    def context_policy(self) -> Any:
        """The :class:`~agentrl.rollout.context.ContextPolicy` that ``context`` names (``None``: ``none``,
        or no ``context`` given: check :attr:`context` to tell them apart)."""
        from agentrl.rollout.context import context_policy

        if not self.context:
            return None
        settings = dict(self.context)
        name = settings.pop("policy", None)
        if not isinstance(name, str):
            raise ValueError(f"context.policy: got {name!r}; expected one of 'none', 'window', 'elide_tool_output', "
                             "'summarize'")
        try:
            return context_policy(name, **settings)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"context: {exc}") from None


class TrainSection(Section):
    """The trainer: backend, steps, optimiser, packing, parallelism, numerics.

    ``steps`` ``None``: until the training data runs out. ``data_parallel_size`` ranks each train on
    an even share of the step's sequences; ``tensor_parallel_size``/``pipeline_parallel_size`` are
    the megatron backend's, as is ``expert_parallel_size`` (a mixture-of-experts model: that many
    data-parallel ranks share each layer's experts, so it divides ``data_parallel_size``). ``dtype``/``autocast``/... are those of :class:`TorchBackendConfig`.
    ``score_after_step``: score the batch again after the update and log the engine-vs-trainer
    mismatch after the step too (``mismatch_after/*``; one more forward pass per step).
    ``shared_prefix``: run a prompt shared by the sequences of a micro-batch (at least
    ``shared_prefix_min_tokens`` tokens) once and reuse its keys and values; exact (see
    :mod:`agentrl.train.prefix`).

    Fitting a step (docs/training.md, "Memory"): ``dtype="bfloat16"`` computes in bfloat16 with
    float32 master weights and optimizer state (``master_weights="float32"``; ``"none"`` trains the
    bfloat16 weights directly, with a warning). ``sharding``: the torch backend's data-parallel ranks
    shard parameters, gradients and optimizer state with FSDP2 (``"auto"``: with more than one rank);
    the megatron backend shards its optimizer with its distributed optimizer.
    ``optimizer_offload``: optimizer state and master weights in host memory (torch backend).
    ``activation_checkpointing``: ``"none"``, ``"full"`` or ``"selective"`` (both backends).
    ``attention``: packed attention without an ``[S, S]`` tensor (``"auto"``), a named kernel, or the
    dense path (``"model"`` on torch, ``"dense"`` on megatron; the pre-flight refuses it on an
    accelerator at lengths where the ``[S, S]`` scores are large). ``fused_lm_head``: score tokens
    without building the ``[tokens, vocab]`` logits (``None``: on where the model allows it).

    ``lora`` (``[train.lora]``: ``rank``, ``alpha``, ``dropout``, ``target_modules``; see
    :class:`~agentrl.train.config.LoraSettings`): train a LoRA adapter on the frozen model (torch
    backend). The engines then serve adapters (their LoRA flags come from this section), each sync
    sends only the adapter, and ``optimizer.lr`` defaults to ``DEFAULT_LORA_LR`` (1e-5) instead of 1e-6.
    """

    backend: TrainBackendName = "torch"
    steps: int | None = Field(default=None, ge=1)
    optimizer: Annotated[OptimizerConfig, RUN_OPTIMIZER] = Field(default_factory=RUN_OPTIMIZER.default)
    max_tokens_per_micro_batch: int = Field(default=8192, ge=1)
    packing: Literal["first_fit_decreasing", "best_fit_decreasing"] = "best_fit_decreasing"
    max_sequence_length: int | None = Field(default=None, ge=2)
    data_parallel_size: int = Field(default=1, ge=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    expert_parallel_size: int = Field(default=1, ge=1)
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = "float32"
    autocast: Literal["none", "bfloat16", "float16"] = "none"
    master_weights: Literal["float32", "none"] = "float32"
    sharding: Literal["auto", "none", "fsdp"] = "auto"
    optimizer_offload: bool = False
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    attention: Literal["auto", "flash_attn", "varlen", "per_document", "model", "te", "dense"] = "auto"
    fused_lm_head: bool | None = None
    logprob_chunk_size: int = Field(default=DEFAULT_CHUNK_SIZE, ge=1)
    verify_packing: bool = True
    shared_prefix: bool = True
    shared_prefix_min_tokens: int = Field(default=32, ge=1)
    seed: int = 0
    score_after_step: bool = False
    lora: LoraSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _lora_learning_rate(cls, data: Any) -> Any:
        """A LoRA run's learning rate defaults to LoRA's (about ten times full fine-tuning's)."""
        if not isinstance(data, dict) or data.get("lora") is None:
            return data
        opt = data.get("optimizer")
        if opt is None:
            return {**data, "optimizer": {"lr": DEFAULT_LORA_LR}}
        if isinstance(opt, dict) and "lr" not in opt:
            return {**data, "optimizer": {**opt, "lr": DEFAULT_LORA_LR}}
        return data  # an OptimizerConfig object sets its learning rate itself

    @property
    def world_size(self) -> int:
        """Trainer ranks: ``dp × tp × pp``."""
        return self.data_parallel_size * self.tensor_parallel_size * self.pipeline_parallel_size

    def to_packing_config(self) -> PackingConfig:
        return PackingConfig(max_tokens=self.max_tokens_per_micro_batch, algorithm=self.packing)

    def to_torch_config(self, loss: LossConfig, *, device: str = "auto",
                        export_dtype: ExportDtype = "auto") -> TorchBackendConfig:
        """The torch backend's config with the objective ``loss`` (see :meth:`AlgorithmSection.to_loss_config`);
        ``export_dtype``: the dtype weights are exported in (the run passes ``model.dtype``)."""
        return TorchBackendConfig(device=device, dtype=self.dtype, autocast=self.autocast,
                                  packing=self.to_packing_config(), loss=loss, optimizer=self.optimizer,
                                  logprob_chunk_size=self.logprob_chunk_size, fused_lm_head=self.fused_lm_head,
                                  verify_packing=self.verify_packing, shared_prefix=self.shared_prefix,
                                  shared_prefix_min_tokens=self.shared_prefix_min_tokens, seed=self.seed,
                                  master_weights=self.master_weights, sharding=self.sharding,
                                  optimizer_offload=self.optimizer_offload,
                                  activation_checkpointing=self.activation_checkpointing,
                                  attention=self.attention,  # type: ignore[arg-type]  # checked by _consistent
                                  export_dtype=export_dtype, lora=self.lora)

    def to_megatron_config(self, loss: LossConfig, *, device: str = "auto",
                           export_dtype: ExportDtype = "auto") -> MegatronBackendConfig:
        """The megatron backend's config with the objective ``loss``."""
        if self.dtype == "float64":
            raise ValueError("dtype='float64' with backend='megatron': megatron-core trains in float32, "
                             "bfloat16 or float16")
        return MegatronBackendConfig(tensor_parallel_size=self.tensor_parallel_size,
                                     pipeline_parallel_size=self.pipeline_parallel_size, device=device,
                                     dtype=self.dtype, packing=self.to_packing_config(), loss=loss,
                                     optimizer=self.optimizer, logprob_chunk_size=self.logprob_chunk_size,
                                     seed=self.seed, activation_checkpointing=self.activation_checkpointing,
                                     attention=self.attention,  # type: ignore[arg-type]  # checked by _consistent
                                     fused_lm_head=self.fused_lm_head is not False, export_dtype=export_dtype,
                                     expert_parallel_size=self.expert_parallel_size)

    @model_validator(mode="after")
    def _consistent(self) -> TrainSection:
        if self.backend == "megatron" and self.dtype == "float64":
            raise ValueError("dtype='float64' with backend='megatron': expected 'float32', 'bfloat16' or 'float16'")
        attention = TORCH_ATTENTION if self.backend == "torch" else MEGATRON_ATTENTION
        if self.attention not in attention:
            raise ValueError(f"attention={self.attention!r} with backend={self.backend!r}: expected one of "
                             f"{list(attention)}")
        if self.backend == "megatron":
            for name, value, ok in (("master_weights", self.master_weights, "float32"),
                                    ("sharding", self.sharding, "auto"), ("optimizer_offload", self.optimizer_offload, False)):
                if value != ok:
                    raise ValueError(f"{name}={value!r} with backend='megatron': megatron-core keeps float32 main "
                                     "weights and shards them with its distributed optimizer; expected "
                                     f"{name}={ok!r} (or backend='torch')")
        if self.autocast != "none" and self.dtype in ("bfloat16", "float16"):
            raise ValueError(f"autocast={self.autocast!r} with dtype={self.dtype!r}: the model already computes in "
                             f"{self.dtype}; expected autocast='none' (master weights keep the optimizer in float32)")
        if self.lora is not None and self.backend == "megatron":
            raise ValueError("lora with backend='megatron': the megatron-core this project pins has no LoRA layers "
                             "(its PEFT lives in Megatron-Bridge, not installed); expected backend='torch' for LoRA "
                             "(a LoRA run's frozen base fits replicated: 2 bytes per parameter in bfloat16)")
        if self.lora is not None and self.sharding == "fsdp":
            raise ValueError("sharding='fsdp' with lora: the frozen base is replicated on every rank and only the "
                             "adapter's gradients are summed; expected sharding='auto' or 'none'")
        if self.expert_parallel_size > 1 and self.backend != "megatron":
            raise ValueError(f"expert_parallel_size={self.expert_parallel_size} with backend={self.backend!r}: expert "
                             "parallelism is the megatron backend's; expected 1, or backend='megatron'")
        if (self.data_parallel_size * self.tensor_parallel_size) % self.expert_parallel_size:
            raise ValueError(f"expert_parallel_size={self.expert_parallel_size}: expert-parallel ranks are data-parallel "
                             f"ranks, so it must divide data_parallel_size={self.data_parallel_size} (times "
                             f"tensor_parallel_size={self.tensor_parallel_size})")
        if self.backend == "torch" and (self.tensor_parallel_size > 1 or self.pipeline_parallel_size > 1):
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size}, pipeline_parallel_size="
                             f"{self.pipeline_parallel_size} with backend='torch': the torch backend is data-"
                             "parallel only; expected 1 and 1, or backend='megatron'")
        self.to_packing_config()
        return self


class ClusterSection(Section):
    """Where the run's processes go.

    ``ray_address`` ``None``: a local Ray started for the run. ``placement``: engines and trainer on
    the same accelerators (``colocated``: engines release memory while the trainer runs) or on their
    own (``disaggregated``). On ``gpu``/``npu``: ``num_accelerators`` (``None``: counted when the run
    starts), ``accelerators_per_engine`` (``None``: the engines' ``tp_size × dp_size``) and
    ``trainer_accelerators`` (``None``: one per trainer rank). They mean nothing on ``cpu``.
    ``accelerators_per_node``: how many accelerators each node has, for the dry run's device map
    (``None``: what the cluster reports, or all on one node). ``accelerator_memory_gib``: the memory
    of one accelerator where it cannot be read from the device (a dry run on a laptop; ``None``: read
    at launch); it sizes the colocated shares and the memory plan.
    """

    ray_address: str | None = None
    placement: Placement = "colocated"
    accelerator: Accelerator = "cpu"
    num_accelerators: int | None = Field(default=None, ge=1)
    accelerators_per_engine: int | None = Field(default=None, ge=1)
    trainer_accelerators: int | None = Field(default=None, ge=1)
    accelerators_per_node: int | None = Field(default=None, ge=1)
    accelerator_memory_gib: float | None = Field(default=None, gt=0)

    @property
    def train_device(self) -> str:
        """The torch device kind of the trainer: ``cpu``, ``cuda`` or ``npu``."""
        return {"cpu": "cpu", "gpu": "cuda", "npu": "npu"}[self.accelerator]

    @model_validator(mode="after")
    def _counts_need_accelerators(self) -> ClusterSection:
        if self.accelerator == "cpu":
            given = {n: getattr(self, n) for n in ("num_accelerators", "accelerators_per_engine", "trainer_accelerators",
                                                   "accelerators_per_node", "accelerator_memory_gib")
                     if getattr(self, n) is not None}
            if given:
                raise ValueError(f"{', '.join(f'{k}={v}' for k, v in given.items())} with accelerator='cpu': "
                                 "accelerator counts apply to 'gpu' or 'npu' only; expected None")
        return self


class LoggingSection(Section):
    """``run_dir`` ``None``: ``runs/<first 12 hex digits of the config hash>``; metrics every ``log_every`` steps."""

    run_dir: str | None = Field(default=None, min_length=1)
    log_every: int = Field(default=1, ge=1)
    save_trajectories: bool = True
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str | None = None

    @model_validator(mode="after")
    def _wandb(self) -> LoggingSection:
        if self.wandb_project is not None and not self.wandb:
            raise ValueError(f"wandb_project={self.wandb_project!r} with wandb=False: expected wandb=True "
                             "or no project")
        return self


class CheckpointSection(Section):
    """Checkpoints every ``every_steps`` steps (``None``: only at the end when ``save_final``), the
    last ``keep_last`` kept; ``resume``: a checkpoint folder (or run folder) to continue from."""

    every_steps: int | None = Field(default=None, ge=1)
    keep_last: int = Field(default=2, ge=1)
    save_final: bool = True
    resume: str | None = Field(default=None, min_length=1)
