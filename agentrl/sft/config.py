"""The typed config of a supervised fine-tuning run: :class:`SftConfig`.

Sections (frozen pydantic models that refuse unknown keys, like the run config's):

- ``model``: the Hugging Face folder to start from, its chat template (and template variables),
  a tokenizer folder (``None``: the model's);
- ``data``: a JSONL file of conversations, one ``{"messages": [...], "tools": [...]}`` per line,
  shuffled with ``seed`` each epoch; sequences over ``max_sequence_length`` are refused by line;
- ``train``: epochs or steps, conversations per step, the optimiser and its schedule
  (:class:`~agentrl.train.OptimizerConfig`), packing, device, dtype, threads, and ``lora`` (train a
  LoRA adapter instead of the whole model, as the RL run's ``train.lora``);
- ``output``: the folder the fine-tuned model is written to (a Hugging Face folder with its
  tokenizer, which engines and ``agentrl train`` load; with ``lora`` the adapter merged into the
  base, the adapter itself in ``adapter/`` as a peft folder), with the run's metrics beside the weights.

Only ``model.path``, ``data.path`` and ``output`` are required.

Example::

    config = SftConfig.from_dict({"model": {"path": "models/tiny"}, "data": {"path": "chats.jsonl"},
                                  "output": "models/tiny-sft", "train": {"steps": 50, "batch_size": 16,
                                  "optimizer": {"lr": 3e-3, "schedule": "cosine", "warmup_steps": 5}}})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, JsonValue, model_validator

from agentrl._config import RunFields, Section, TemplateName
from agentrl.train.config import LoraSettings, OptimizerConfig, PackingConfig, TorchBackendConfig

__all__ = ["SftConfig", "SftDataSection", "SftModelSection", "SftTrainSection"]


class SftModelSection(Section):
    """The model to fine-tune: a local Hugging Face folder, the template that lays out its tokens,
    template variables (``enable_thinking``...) and a tokenizer folder (``None``: ``path``)."""

    path: str = Field(min_length=1)
    template: TemplateName = "qwen3"
    template_kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    tokenizer_path: str | None = Field(default=None, min_length=1)

    @property
    def tokenizer(self) -> str:
        return self.tokenizer_path if self.tokenizer_path is not None else self.path


class SftDataSection(Section):
    """The conversations: a JSONL file, shuffled per epoch from ``seed`` (when ``shuffle``)."""

    path: str = Field(min_length=1)
    shuffle: bool = True
    seed: int = 0
    max_sequence_length: int | None = Field(default=None, ge=2)


def _sft_optimizer() -> OptimizerConfig:
    return OptimizerConfig(lr=1e-4, weight_decay=0.0)


class SftTrainSection(Section):
    """How long and how: ``steps`` (``None``: ``epochs`` passes over the data) optimiser steps of
    ``batch_size`` conversations each; ``steps`` larger than one pass runs further epochs.
    ``threads``: torch intra-op threads (``None``: torch's default; 1 is fastest on a small CPU
    shared with an engine). ``log_every``: print and record metrics every that many steps.
    ``shared_prefix``/``shared_prefix_min_tokens``: as in the RL run config's ``train`` section (a
    system prompt shared by the conversations of a micro-batch runs once; exact). ``lora``: train
    only a LoRA adapter (rank, alpha, dropout, target modules; the default learning rate 1e-4 is in
    LoRA's usual range)."""

    epochs: int = Field(default=1, ge=1)
    steps: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=16, ge=1)
    optimizer: Annotated[OptimizerConfig, RunFields(OptimizerConfig)] = Field(default_factory=_sft_optimizer)
    max_tokens_per_micro_batch: int = Field(default=8192, ge=1)
    packing: Literal["first_fit_decreasing", "best_fit_decreasing"] = "best_fit_decreasing"
    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?|npu(:\d+)?)$")
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = "float32"
    autocast: Literal["none", "bfloat16", "float16"] = "none"
    threads: int | None = Field(default=None, ge=1)
    shared_prefix: bool = True
    shared_prefix_min_tokens: int = Field(default=32, ge=1)
    seed: int = 0
    log_every: int = Field(default=1, ge=1)
    lora: LoraSettings | None = None


class SftConfig(Section):
    """One supervised fine-tuning run; frozen. Build with :meth:`from_dict`."""

    model: SftModelSection
    data: SftDataSection
    train: SftTrainSection = Field(default_factory=SftTrainSection)
    output: str = Field(min_length=1)
    overwrite: bool = False

    @model_validator(mode="after")
    def _cross_checks(self) -> SftConfig:
        length = self.data.max_sequence_length
        if length is not None and length - 1 > self.train.max_tokens_per_micro_batch:
            raise ValueError(f"data.max_sequence_length={length} does not fit train.max_tokens_per_micro_batch="
                             f"{self.train.max_tokens_per_micro_batch} (sequences are never split); expected "
                             f"max_tokens_per_micro_batch >= {length - 1}")
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SftConfig:
        """Validate a plain mapping (parsed TOML/YAML/JSON); raises pydantic's ``ValidationError``."""
        return cls.model_validate(data)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def backend_config(self) -> TorchBackendConfig:
        """The torch backend's config (the policy loss is unused; its temperature stays 1.0)."""
        t = self.train
        return TorchBackendConfig(device=t.device, dtype=t.dtype, autocast=t.autocast,
                                  packing=PackingConfig(max_tokens=t.max_tokens_per_micro_batch, algorithm=t.packing),
                                  optimizer=t.optimizer, shared_prefix=t.shared_prefix,
                                  shared_prefix_min_tokens=t.shared_prefix_min_tokens, seed=t.seed, lora=t.lora)
