"""Run-config sections of the rollout side: engines, router, sampling, scheduler, agent loop.

Each section mirrors the runtime object it converts to (:class:`~agentrl.rollout.EngineConfig`,
:class:`~agentrl.rollout.RouterConfig`, :class:`~agentrl.rollout.SamplingParams`,
:class:`~agentrl.rollout.SchedulerConfig`, :class:`~agentrl.rollout.AgentConfig`), with the fields a
run sets; what the runner decides itself (ports, log folders, weight versions) is left out. Every
section converts on validation, so a config that validates always builds its runtime objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, JsonValue, model_validator

from agentrl.rollout.agent import AgentConfig
from agentrl.rollout.engine import EngineConfig, EngineLora
from agentrl.rollout.router import RouterConfig, RouterPolicy
from agentrl.rollout.scheduler import SchedulerConfig
from agentrl.rollout.types import SamplingParams
from agentrl.runner._base import Section

if TYPE_CHECKING:
    from agentrl.rollout.health import HealthConfig

__all__ = ["AgentSection", "EnginesSection", "HealthSection", "RolloutSection", "RouterSection", "SamplingSection",
           "SchedulerSection"]

EngineDevice = Literal["auto", "cpu", "cuda", "npu"]


class EnginesSection(Section):
    """The SGLang engines: how many, and how each is started (one :class:`EngineConfig` each).

    ``tp_size × dp_size`` accelerators per engine on a GPU machine. ``enable_memory_saver``
    ``None``: on exactly when the engines must release accelerator memory around training
    (colocated placement on an accelerator). ``context_length`` ``None``: the model's own.
    ``boot_path``: a folder the engines serve at start-up instead of ``model.path`` (a model of the
    same shape, e.g. random weights, while the real one is still being prepared); the runner then
    loads the trainer's weights into them before the first rollout. ``urls``: engines already running
    (e.g. started by hand, or shared by several runs) to use instead of starting ``count`` of them:
    the run starts only a router over them, loads its own weights into them before the first
    rollout, and leaves them running at the end; ``count`` must equal their number.
    """

    count: int = Field(default=1, ge=1)
    tp_size: int = Field(default=1, ge=1)
    dp_size: int = Field(default=1, ge=1)
    context_length: int | None = Field(default=None, ge=2)
    max_total_tokens: int | None = Field(default=None, ge=1)
    mem_fraction_static: float | None = Field(default=None, gt=0.0, le=1.0)
    attention_backend: str | None = None
    random_seed: int | None = None
    enable_memory_saver: bool | None = None
    log_level: str = "warning"
    startup_timeout_s: float = Field(default=600.0, gt=0.0)
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    boot_path: str | None = Field(default=None, min_length=1)
    urls: tuple[str, ...] = ()

    def to_config(self, model_path: str, *, dtype: str = "bfloat16", device: EngineDevice = "auto",
                  release_memory: bool = False, lora: EngineLora | None = None) -> EngineConfig:
        """One engine's :class:`EngineConfig`; ``release_memory`` is the default of ``enable_memory_saver``;
        ``lora``: LoRA serving (the run derives it from ``train.lora``)."""
        saver = self.enable_memory_saver if self.enable_memory_saver is not None else release_memory
        return EngineConfig(
            model_path=model_path, device=device, dtype=dtype, tp_size=self.tp_size, dp_size=self.dp_size,
            context_length=self.context_length, max_total_tokens=self.max_total_tokens,
            mem_fraction_static=self.mem_fraction_static, attention_backend=self.attention_backend,
            random_seed=self.random_seed, enable_memory_saver=saver, log_level=self.log_level,
            startup_timeout_s=self.startup_timeout_s, env=dict(self.env), extra_args=self.extra_args, lora=lora,
        )

    @property
    def accelerators_per_engine(self) -> int:
        return self.tp_size * self.dp_size

    @model_validator(mode="after")
    def _converts(self) -> EnginesSection:
        self.to_config("model")
        if self.urls and len(self.urls) != self.count:
            raise ValueError(f"urls: {len(self.urls)} engine URLs with count={self.count}; expected count = "
                             f"{len(self.urls)}, the number of URLs")
        bad = [u for u in self.urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"urls: {bad[0]!r} is not an http(s) URL; expected e.g. 'http://127.0.0.1:30000'")
        return self


class HealthSection(Section):
    """The engines' health monitor in a run (:class:`~agentrl.rollout.HealthConfig`): every
    ``check_interval_s`` it checks each engine's process, and its ``/health`` (``http_generate``:
    ``/health_generate``, a one-token generation whenever the engine is idle, which shows in its
    load); an engine that fails ``failure_threshold`` checks of ``http_timeout_s`` in a row counts as
    hung. A dead
    or hung engine is taken out of the router's rotation, restarted (``restart``, at most
    ``max_restarts`` times), given the current weight version, and put back. ``unavailable_wait_s``:
    how long a request keeps retrying while no engine can take it (``None``: the engines'
    ``startup_timeout_s`` plus a minute, so a restart of the only engine loses no episode)."""

    check_interval_s: float = Field(default=2.0, gt=0.0)
    http_checks: bool = True
    http_generate: bool = False
    http_timeout_s: float = Field(default=60.0, gt=0.0)
    failure_threshold: int = Field(default=3, ge=1)
    restart: bool = True
    max_restarts: int = Field(default=3, ge=0)
    unavailable_wait_s: float | None = Field(default=None, ge=0.0)

    def to_config(self) -> HealthConfig:
        from agentrl.rollout.health import (
            HealthConfig,  # here: it pulls in the HTTP client, which checks need not
        )

        return HealthConfig(check_interval_s=self.check_interval_s, http_checks=self.http_checks,
                            http_generate=self.http_generate,
                            http_timeout_s=self.http_timeout_s, failure_threshold=self.failure_threshold,
                            restart=self.restart, max_restarts=self.max_restarts)


class RouterSection(Section):
    """The sglang-router in front of the engines (:class:`RouterConfig`; ports are picked by the runner)."""

    policy: RouterPolicy = RouterPolicy.CONSISTENT_HASHING
    health_check_interval_s: int = Field(default=60, ge=1)
    health_failure_threshold: int = Field(default=3, ge=1)
    health_success_threshold: int = Field(default=2, ge=1)
    health_check_timeout_s: int = Field(default=5, ge=1)
    disable_health_check: bool = False
    request_timeout_s: int = Field(default=3600, ge=1)
    log_level: str = "warn"
    startup_timeout_s: float = Field(default=60.0, gt=0.0)

    def to_config(self) -> RouterConfig:
        return RouterConfig(
            policy=self.policy, health_check_interval_s=self.health_check_interval_s,
            health_failure_threshold=self.health_failure_threshold,
            health_success_threshold=self.health_success_threshold,
            health_check_timeout_s=self.health_check_timeout_s, disable_health_check=self.disable_health_check,
            request_timeout_s=self.request_timeout_s, log_level=self.log_level,
            startup_timeout_s=self.startup_timeout_s,
        )


class SamplingSection(Section):
    """Every :class:`SamplingParams` field, with its default, except ``max_new_tokens``: 1024 (the
    per-turn cap of :class:`AgentConfig`), not 128. ``None`` leaves the engine's default."""

    max_new_tokens: int = Field(default=1024, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_new_tokens: int | None = Field(default=None, ge=0)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    sampling_seed: int | None = None
    skip_special_tokens: bool = False
    no_stop_trim: bool = True
    spaces_between_special_tokens: bool = False
    regex: str | None = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: str | None = None
    logit_bias: dict[int, float] | None = None

    def to_params(self) -> SamplingParams:
        return SamplingParams(**self.model_dump())

    @model_validator(mode="after")
    def _converts(self) -> SamplingSection:
        self.to_params()
        return self


class SchedulerSection(Section):
    """Every :class:`SchedulerConfig` field, with the same default (see ``docs/rollout.md``)."""

    groups_per_step: int = Field(default=8, ge=1)
    group_size: int = Field(default=8, ge=1)
    over_sampling: float = Field(default=0.0, ge=0.0, le=16.0)
    max_inflight_groups: int | None = Field(default=None, ge=1)
    max_requests_per_engine: int = Field(default=256, ge=1)
    max_tool_concurrency: int = Field(default=64, ge=1)
    member_retries: int = Field(default=2, ge=0)
    min_group_size: int = Field(default=2, ge=1)
    max_rejected_groups: int | None = Field(default=None, ge=1)
    partial_rollout: bool = False
    mask_offpolicy: bool = False
    max_staleness: int | None = Field(default=None, ge=0)
    abort_timeout_s: float = Field(default=5.0, gt=0.0)

    def to_config(self) -> SchedulerConfig:
        return SchedulerConfig(**self.model_dump())

    @property
    def samples_per_step(self) -> int:
        """``groups_per_step × group_size``: the episodes one training step trains on."""
        return self.groups_per_step * self.group_size

    @model_validator(mode="after")
    def _converts(self) -> SchedulerSection:
        if self.min_group_size > self.group_size:
            raise ValueError(f"min_group_size={self.min_group_size}: expected at most group_size={self.group_size}")
        self.to_config()
        return self


class AgentSection(Section):
    """The agent loop (:class:`AgentConfig`) minus its sampling, which is the rollout's ``sampling``.
    ``reward_timeout_s``, ``reward_pool`` and ``reward_failure``: how a reward runs, its deadline, and
    what a failed one means; ``env_timeout_s``: the environment hooks' soft deadline (see :class:`AgentConfig`).

    ``context_length`` ``None``: the engines' ``context_length`` (or only the environment's budget
    when that is unset too).
    """

    context_length: int | None = Field(default=None, ge=2)
    one_call_per_turn: bool = False
    strict_parsing: bool = False
    max_calls_per_turn: int | None = Field(default=None, ge=1)
    template_kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    routing: Literal["episode", "group"] = "episode"
    reward_timeout_s: float | None = Field(default=300.0, gt=0.0)
    env_timeout_s: float | None = Field(default=600.0, gt=0.0)
    reward_pool: bool = True
    reward_failure: Literal["zero", "drop_group"] = "zero"
    audit: bool = False

    def to_config(self, sampling: SamplingParams, *, context_length: int | None = None) -> AgentConfig:
        """The :class:`AgentConfig` with ``sampling``; ``context_length`` fills an unset one."""
        return AgentConfig(
            sampling=sampling, context_length=self.context_length if self.context_length is not None
            else context_length, one_call_per_turn=self.one_call_per_turn, strict_parsing=self.strict_parsing,
            max_calls_per_turn=self.max_calls_per_turn, template_kwargs=dict(self.template_kwargs),
            routing=self.routing, reward_timeout_s=self.reward_timeout_s, env_timeout_s=self.env_timeout_s,
            reward_pool=self.reward_pool,
            reward_failure=self.reward_failure, audit=self.audit,
        )


class RolloutSection(Section):
    """Everything that produces trajectories: engines (and their health monitor), router, sampling,
    scheduler, agent loop."""

    engines: EnginesSection = Field(default_factory=EnginesSection)
    health: HealthSection = Field(default_factory=HealthSection)
    router: RouterSection = Field(default_factory=RouterSection)
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    agent: AgentSection = Field(default_factory=AgentSection)

    @property
    def context_length(self) -> int | None:
        """The context window episodes run in: the agent's, else the engines'."""
        return self.agent.context_length if self.agent.context_length is not None else self.engines.context_length

    def to_agent_config(self) -> AgentConfig:
        """:class:`AgentConfig` with this section's sampling and context length."""
        return self.agent.to_config(self.sampling.to_params(), context_length=self.engines.context_length)

    @model_validator(mode="after")
    def _fits_context(self) -> RolloutSection:
        engine_ctx, agent_ctx = self.engines.context_length, self.agent.context_length
        if engine_ctx is not None and agent_ctx is not None and agent_ctx > engine_ctx:
            raise ValueError(f"agent.context_length={agent_ctx} exceeds engines.context_length={engine_ctx}: "
                             "expected at most the engines' window")
        ctx = self.context_length
        if ctx is not None and self.sampling.max_new_tokens >= ctx:
            raise ValueError(f"sampling.max_new_tokens={self.sampling.max_new_tokens} leaves no room for a prompt "
                             f"in a context of {ctx} tokens: expected fewer than the context length")
        return self
