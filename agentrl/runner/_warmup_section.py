"""The ``warmup`` section of the run config: supervised fine-tuning on conversations before RL.

It trains the very model the run then trains with RL (no export and reload), while the engines
boot on ``model.path``; the runner then loads the warmed-up weights into the engines (version 0)
before the first rollout. With ``check``, the behaviour RL depends on is measured on held-out
conversations before RL starts, and the run stops with a clear error when it has not formed.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from agentrl._config import Section
from agentrl.runner._sections import RUN_OPTIMIZER
from agentrl.train.config import OptimizerConfig

__all__ = ["WarmupCheckSection", "WarmupSection"]


def _warmup_optimizer() -> OptimizerConfig:
    return OptimizerConfig(lr=1e-4, weight_decay=0.0)


class WarmupCheckSection(Section):
    """The check before RL: on the held-out conversations of ``path`` (at most ``max_conversations``),
    the share of trained tokens (assistant tokens) the model predicts with probability ≥ 0.5 — it
    then is the model's greedy choice — must reach ``min_token_accuracy``. Measured every
    ``every_steps`` warm-up steps; the warm-up ends early once the check passes (after
    ``min_steps`` of the warm-up), and a run whose check still fails after ``warmup.steps`` stops
    with :class:`~agentrl.runner.warmup.WarmupError`."""

    path: str = Field(min_length=1)
    min_token_accuracy: float = Field(default=0.9, gt=0.0, le=1.0)
    every_steps: int = Field(default=50, ge=1)
    max_conversations: int = Field(default=64, ge=1)


class WarmupSection(Section):
    """Supervised warm-up (see the module doc).

    ``data``: conversations JSONL (``{"messages": [...], "tools": [...]}`` per line, as for ``agentrl
    sft``), laid out exactly as the agent loop lays out an episode, only assistant tokens trained.
    ``steps`` optimiser steps of ``batch_size`` conversations (the learning-rate schedule's horizon);
    ``min_steps``: with a check, the fewest steps before the warm-up may end early.
    ``cooldown_steps``: with a check, once it passes, that many more steps with the learning rate
    falling linearly from its value there to zero, then the check again (it must still pass); 0
    ends the warm-up at the passing check. The optimiser state is reset when RL starts. Packing
    uses ``train.max_tokens_per_micro_batch``.
    """

    data: str = Field(min_length=1)
    shuffle: bool = True
    seed: int = 0
    steps: int = Field(ge=1)
    min_steps: int = Field(default=0, ge=0)
    cooldown_steps: int = Field(default=0, ge=0)
    batch_size: int = Field(default=16, ge=1)
    optimizer: Annotated[OptimizerConfig, RUN_OPTIMIZER] = Field(default_factory=_warmup_optimizer)
    check: WarmupCheckSection | None = None
    log_every: int = Field(default=10, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> WarmupSection:
        if self.min_steps > self.steps:
            raise ValueError(f"min_steps={self.min_steps} > steps={self.steps}: expected min_steps <= steps")
        if self.cooldown_steps and self.check is None:
            raise ValueError(f"cooldown_steps={self.cooldown_steps}: the cool-down starts when warmup.check passes; "
                             "expected a warmup.check section, or cooldown_steps = 0")
        return self
