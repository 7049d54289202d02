"""The typed run config: one frozen, validated :class:`RunConfig` for a training run.

Sections (each a frozen pydantic model that refuses unknown keys):

- ``model``: Hugging Face folder, serving dtype, chat template, tokenizer folder;
- ``data``: ``train`` prompts and ``eval`` sets; ``environment``: name and options;
- ``rollout``: ``engines``, ``router``, ``sampling``, ``scheduler``, ``agent``;
- ``algorithm``: estimator, policy loss, clipping, KL, entropy, TIS/MIS;
- ``train``: backend, steps, optimiser and schedule, packing, parallelism;
- ``cluster``: Ray address, placement, accelerators; ``logging``; ``checkpoint``;
- ``sync``: weight sync to the engines and the post-sync logprob probe;
- ``teacher``: on-policy distillation's teacher (``None``: none);
- ``sandbox``: where tools execute (:class:`~agentrl.tools.fleet.FleetConfig`: ``local``, or a fleet
  of executors on the Ray cluster's nodes that carry a resource);
- ``mode``: ``sync``, ``one_step_off`` or ``bounded_staleness``.

Only ``model.path``, ``data.train.path`` and ``environment.name`` are required. Each component
gets its own section (or the runtime object it converts to), never the root. Where a run sets a
runtime object's fields as they are, the section is that object (``rollout.sampling`` is a
:class:`~agentrl.rollout.SamplingParams`, ``rollout.scheduler`` a
:class:`~agentrl.rollout.SchedulerConfig`, also ``rollout.health``, ``rollout.router``,
``data.train``, ``train.optimizer`` and ``sync``): each field is defined once, in the runtime
class. The cross-section checks are in :mod:`agentrl.runner.checks`; all problems are reported
together.

Example::

    config = RunConfig.from_dict({"model": {"path": "models/qwen3-0.6b"},
                                  "data": {"train": {"path": "train.jsonl"}},
                                  "environment": {"name": "retool_math"},
                                  "rollout": {"scheduler": {"groups_per_step": 16, "group_size": 8}}})
    config.rollout.scheduler                 # a SchedulerConfig
    config.torch_backend_config()            # TorchBackendConfig (loss at the sampling temperature)
    config.hash()                            # stored in checkpoints and trajectory files
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import orjson
from pydantic import Field, model_validator

from agentrl._config import RunFields, Section
from agentrl.rollout.agent import AgentConfig
from agentrl.rollout.engine import EngineConfig, EngineLora
from agentrl.rollout.types import RoutingShape
from agentrl.runner._algorithm import AlgorithmSection
from agentrl.runner._rollout_sections import EngineDevice, RolloutSection
from agentrl.runner._sections import (
    CheckpointSection,
    ClusterSection,
    DataSection,
    EnvironmentSection,
    LoggingSection,
    ModelSection,
    TrainSection,
)
from agentrl.runner._sync_section import RUN_SYNC
from agentrl.runner._teacher_section import TeacherSection
from agentrl.runner._warmup_section import WarmupSection
from agentrl.runner.checks import LoopMode, run_checks
from agentrl.runner.weights import WeightSyncConfig
from agentrl.tools.fleet.config import FleetConfig
from agentrl.train.config import BatchingConfig, LossConfig, TorchBackendConfig
from agentrl.train.megatron.config import MegatronBackendConfig

__all__ = ["HASH_EXCLUDED", "HASH_OMITTED_WHEN_EMPTY", "RUN_SANDBOX", "RunConfig"]

RUN_SANDBOX = RunFields(FleetConfig)
"""Where tools execute (every :class:`~agentrl.tools.fleet.FleetConfig` field, with its default)."""

HASH_EXCLUDED: tuple[tuple[str, ...], ...] = (("checkpoint", "resume"), ("cluster", "ray_address"), ("logging",),
                                              ("sandbox",), ("train", "steps"))
"""Fields left out of :meth:`RunConfig.hash`: where a run resumes from, which Ray cluster it runs on,
where its tools execute, how it logs and how many steps it runs do not change what a step trains, and a resumed run must
match its checkpoint's hash (so ``--resume train.steps=N`` extends a run; with a cosine schedule and
no ``decay_steps``, the decay then stretches to the new end)."""


HASH_OMITTED_WHEN_EMPTY: tuple[tuple[str, ...], ...] = (("environment", "limits"), ("environment", "context"))
"""Fields added after runs were checkpointed, left out of :meth:`RunConfig.hash` while empty (their
default), so a config that does not use them keeps the hash its checkpoints were written with."""


class RunConfig(Section):
    """One training run. Frozen; build with :meth:`from_dict` (or the constructor) and derive
    variants with :meth:`from_dict` of an edited :meth:`to_dict` (``model_copy`` skips validation)."""

    model: ModelSection
    data: DataSection
    environment: EnvironmentSection
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    train: TrainSection = Field(default_factory=TrainSection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    sync: Annotated[WeightSyncConfig, RUN_SYNC] = Field(default_factory=RUN_SYNC.default)
    sandbox: Annotated[FleetConfig, RUN_SANDBOX] = Field(default_factory=RUN_SANDBOX.default)
    warmup: WarmupSection | None = None
    teacher: TeacherSection | None = None
    mode: LoopMode = "sync"

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        problems = run_checks(self)
        if problems:
            raise ValueError("; ".join(problems) if len(problems) == 1 else
                             f"{len(problems)} problems:\n" + "\n".join(f"- {p}" for p in problems))
        return self

    # -- serialisation -----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Validate a plain mapping (e.g. parsed YAML/JSON); raises pydantic's ``ValidationError``."""
        return cls.model_validate(data)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (enums as their values, tuples as lists); ``from_dict`` reads it back equal."""
        return self.model_dump(mode="json")

    def canonical_json(self) -> bytes:
        """Sorted-key, compact JSON of every field except :data:`HASH_EXCLUDED`."""
        data = self.to_dict()
        for path in HASH_EXCLUDED:
            node = data
            for key in path[:-1]:
                node = node[key]
            node.pop(path[-1], None)
        for path in HASH_OMITTED_WHEN_EMPTY:
            node = data
            for key in path[:-1]:
                node = node[key]
            if not node.get(path[-1]):
                node.pop(path[-1], None)
        return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)

    def hash(self) -> str:
        """SHA-256 (hex) of :meth:`canonical_json`: equal for equal configs, whatever the key order or
        which defaults were written out. Adding a field to a section changes every hash."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

    def run_dir(self) -> Path:
        """``logging.run_dir``, or ``runs/<first 12 hex digits of the hash>``."""
        return Path(self.logging.run_dir) if self.logging.run_dir is not None else Path("runs") / self.hash()[:12]

    def with_absolute_paths(self, base: Path | None = None) -> RunConfig:
        """This config with every path made absolute against ``base`` (default: the working directory)
        and the run folder written out: what the run's actors get, since each resolves a relative path
        in its own working directory, on its own node. (The hash of the copy differs: it stays the
        driver's business, which keeps the original.)"""
        root = (base or Path.cwd()).resolve()

        def absolute(value: str | None) -> str | None:
            return None if value is None else str(root / Path(value).expanduser())

        data = self.to_dict()
        data["logging"]["run_dir"] = absolute(str(self.run_dir()))
        model = data["model"]
        model["path"], model["tokenizer_path"] = absolute(model["path"]), absolute(model["tokenizer_path"])
        for dataset in (data["data"]["train"], *data["data"]["eval"]):
            dataset["path"] = absolute(dataset["path"])
        engines = data["rollout"]["engines"]
        engines["boot_path"] = absolute(engines["boot_path"])
        data["checkpoint"]["resume"] = absolute(data["checkpoint"]["resume"])
        if data.get("teacher") is not None and data["teacher"].get("path") is not None:
            data["teacher"]["path"] = absolute(data["teacher"]["path"])
        if data.get("warmup") is not None:
            data["warmup"]["data"] = absolute(data["warmup"]["data"])
            if data["warmup"].get("check") is not None:
                data["warmup"]["check"]["path"] = absolute(data["warmup"]["check"]["path"])
        return RunConfig.from_dict(data)

    # -- runtime objects that combine sections -------------------------------------------------
    def engine_config(self) -> EngineConfig:
        """The config of each engine: the model, its dtype, the cluster's device, memory release when
        colocated on an accelerator."""
        devices: dict[str, EngineDevice] = {"cpu": "cpu", "gpu": "cuda", "npu": "npu"}
        device = devices[self.cluster.accelerator]
        release = self.cluster.placement == "colocated" and self.cluster.accelerator != "cpu"
        return self.rollout.engines.to_config(self.model.path, dtype=self.model.dtype, device=device,
                                              release_memory=release, lora=self.engine_lora(),
                                              routed_experts=self.model_routing() is not None)

    def model_routing(self) -> RoutingShape | None:
        """The routing of a mixture-of-experts model (from its folder's ``config.json``; ``None`` for a
        dense model or a folder this machine cannot read): the engines return it and every episode
        stores it, whatever ``algorithm.routing_replay`` says, so the routing figures are measured
        with replay off too."""
        from agentrl.model_folder import model_routing_shape

        return model_routing_shape(self.model.path)

    @property
    def engines_launched(self) -> int:
        """The SGLang engines the run starts on its machines: the rollout's (at least one is planned even
        when attached to ``rollout.engines.urls``) and a distillation teacher's own (``teacher.kind = "engines"``)."""
        teacher = self.teacher
        own = teacher.engines.count if teacher is not None and teacher.kind == "engines" else 0
        return self.rollout.engines.count + own

    def sync_method(self) -> str:
        """How weights (or a LoRA run's adapter) reach the engines: ``sync.method`` with ``auto`` decided."""
        return self.sync.resolved_method(self.cluster.placement, attached=bool(self.rollout.engines.urls),
                                         lora=self.train.lora is not None)

    def engine_lora(self) -> EngineLora | None:
        """The engines' LoRA serving, from ``train.lora`` (``None`` without it): its rank and target
        modules; on a CPU cluster SGLang's ``torch_native`` kernels (the others need an accelerator)."""
        lora = self.train.lora
        if lora is None:
            return None
        return EngineLora(max_rank=lora.rank, target_modules=lora.target_modules,
                          backend="torch_native" if self.cluster.accelerator == "cpu" else None)

    def agent_config(self) -> AgentConfig:
        """The agent loop's settings; for a mixture-of-experts model it asks for routing."""
        return dataclasses.replace(self.rollout.to_agent_config(), routed_experts=self.model_routing())

    def batching_config(self) -> BatchingConfig:
        """The advantages: the algorithm's estimator, and the teacher's term when there is a ``teacher``."""
        batching = self.algorithm.to_batching_config(max_sequence_length=self.train.max_sequence_length)
        if self.teacher is None:
            return batching
        return dataclasses.replace(batching, teacher_coef=self.teacher.coef, task_reward=self.teacher.task_reward)

    def loss_config(self) -> LossConfig:
        """The objective at the rollout sampling temperature (engine logprobs are reported after it)."""
        return self.algorithm.to_loss_config(temperature=self.rollout.sampling.temperature)

    def torch_backend_config(self, device: str | None = None) -> TorchBackendConfig:
        """The torch backend's config; ``device`` ``None``: the cluster's accelerator kind."""
        if self.train.backend != "torch":
            raise ValueError(f"train.backend={self.train.backend!r}: torch_backend_config() is for backend 'torch'")
        return self.train.to_torch_config(self.loss_config(), device=device or self.cluster.train_device,
                                          export_dtype=self.model.dtype)

    def megatron_backend_config(self, device: str | None = None) -> MegatronBackendConfig:
        """The megatron backend's config (TP/PP sizes from the train section; the rest of the world is
        data parallel); ``device`` ``None``: the cluster's accelerator kind."""
        if self.train.backend != "megatron":
            raise ValueError(f"train.backend={self.train.backend!r}: megatron_backend_config() is for backend "
                             "'megatron'")
        return self.train.to_megatron_config(self.loss_config(), device=device or self.cluster.train_device,
                                             export_dtype=self.model.dtype)
