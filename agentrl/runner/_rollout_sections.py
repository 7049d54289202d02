"""Run-config sections of the rollout side: engines, health monitor, router, sampling, scheduler, agent loop.

Where a run sets a runtime object's fields as they are, the section *is* that object, validated by
pydantic from the object's own annotations (:class:`~agentrl._config.RunFields`): ``health`` is a
:class:`~agentrl.rollout.HealthConfig`, ``router`` a :class:`~agentrl.rollout.RouterConfig` (the
keys of :data:`ROUTER_KEYS`; the runner picks ports and log folders), ``sampling`` a
:class:`~agentrl.rollout.SamplingParams` and ``scheduler`` a :class:`~agentrl.rollout.SchedulerConfig`.
Sections remain where the runner fills in fields itself: :class:`EnginesSection` (model, device,
dtype, LoRA serving) and :class:`AgentSection` (sampling, context length).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue, model_validator

from agentrl._config import RunFields, Section
from agentrl.rollout._health_config import HealthConfig
from agentrl.rollout.agent import AgentConfig
from agentrl.rollout.engine import EngineConfig, EngineLora
from agentrl.rollout.router import RouterConfig
from agentrl.rollout.scheduler import SchedulerConfig
from agentrl.rollout.types import SamplingParams

__all__ = ["RUN_HEALTH", "RUN_ROUTER", "RUN_SAMPLING", "RUN_SCHEDULER", "AgentSection", "EnginesSection",
           "RolloutSection"]

RUN_HEALTH = RunFields(HealthConfig, check_interval_s=2.0, http_generate=False, http_timeout_s=60.0)
"""A run's health monitor: checks every 2 s through ``/health`` (``http_generate``: ``/health_generate``,
a one-token generation whenever the engine is idle, which shows in its load), an engine that fails
``failure_threshold`` checks of 60 s in a row counts as hung; ``unavailable_wait_s`` ``None``: the
engines' ``startup_timeout_s`` plus a minute (with ``restart``)."""

RUN_ROUTER = RunFields(RouterConfig, keys=(
    "policy", "health_check_interval_s", "health_failure_threshold", "health_success_threshold",
    "health_check_timeout_s", "disable_health_check", "request_timeout_s", "log_level", "startup_timeout_s"))
"""The router settings a run config sets (host, ports and log folder are the runner's)."""

RUN_SAMPLING = RunFields(SamplingParams, max_new_tokens=1024)
"""Every :class:`SamplingParams` field with its default, except ``max_new_tokens``: 1024 (the per-turn
cap of :class:`AgentConfig`), not 128. ``None`` leaves the engine's default."""

RUN_SCHEDULER = RunFields(SchedulerConfig)
"""Every :class:`SchedulerConfig` field with its default (see ``docs/rollout.md``)."""

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
                  release_memory: bool = False, lora: EngineLora | None = None,
                  routed_experts: bool = False) -> EngineConfig:
        """One engine's :class:`EngineConfig`; ``release_memory`` is the default of ``enable_memory_saver``;
        ``lora``: LoRA serving (the run derives it from ``train.lora``); ``routed_experts``: return the
        routing of a mixture-of-experts model (the run turns it on for one)."""
        saver = self.enable_memory_saver if self.enable_memory_saver is not None else release_memory
        return EngineConfig(
            model_path=model_path, device=device, dtype=dtype, tp_size=self.tp_size, dp_size=self.dp_size,
            context_length=self.context_length, max_total_tokens=self.max_total_tokens,
            mem_fraction_static=self.mem_fraction_static, attention_backend=self.attention_backend,
            random_seed=self.random_seed, enable_memory_saver=saver, log_level=self.log_level,
            startup_timeout_s=self.startup_timeout_s, env=dict(self.env), extra_args=self.extra_args, lora=lora,
            return_routed_experts=routed_experts,
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
    health: Annotated[HealthConfig, RUN_HEALTH] = Field(default_factory=RUN_HEALTH.default)
    router: Annotated[RouterConfig, RUN_ROUTER] = Field(default_factory=RUN_ROUTER.default)
    sampling: Annotated[SamplingParams, RUN_SAMPLING] = Field(default_factory=RUN_SAMPLING.default)
    scheduler: Annotated[SchedulerConfig, RUN_SCHEDULER] = Field(default_factory=RUN_SCHEDULER.default)
    agent: AgentSection = Field(default_factory=AgentSection)

    @property
    def context_length(self) -> int | None:
        """The context window episodes run in: the agent's, else the engines'."""
        return self.agent.context_length if self.agent.context_length is not None else self.engines.context_length

    def to_agent_config(self) -> AgentConfig:
        """:class:`AgentConfig` with this section's sampling and context length."""
        return self.agent.to_config(self.sampling, context_length=self.engines.context_length)

    @model_validator(mode="after")
    def _fits_context(self) -> RolloutSection:
        if self.sampling.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens={self.sampling.max_new_tokens}: expected an int >= 1 (0 "
                             "only scores a prompt)")
        engine_ctx, agent_ctx = self.engines.context_length, self.agent.context_length
        if engine_ctx is not None and agent_ctx is not None and agent_ctx > engine_ctx:
            raise ValueError(f"agent.context_length={agent_ctx} exceeds engines.context_length={engine_ctx}: "
                             "expected at most the engines' window")
        ctx = self.context_length
        if ctx is not None and self.sampling.max_new_tokens >= ctx:
            raise ValueError(f"sampling.max_new_tokens={self.sampling.max_new_tokens} leaves no room for a prompt "
                             f"in a context of {ctx} tokens: expected fewer than the context length")
        return self
