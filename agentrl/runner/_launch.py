"""Building a :class:`~agentrl.runner.RolloutService` from a run config: the sandbox fleet (with
``sandbox.executor = "ray"``, started first), router, engines, client,
data source, scheduler and the disk weight loader. Everything started is stopped if a later part
fails."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.chat.template import ChatTemplate
from agentrl.data.source import DataSource, read_rows
from agentrl.rewards.pool import shared_pool
from agentrl.rollout.health import EngineGroup
from agentrl.rollout.pacing import tune_gc
from agentrl.rollout.scheduler import Scheduler, SchedulerConfig
from agentrl.runner.engine_weights import EngineWeights
from agentrl.runner.weights import WeightSync
from agentrl.tools.fleet.config import FleetConfig

if TYPE_CHECKING:
    from agentrl.rollout.engine import EngineStarter
    from agentrl.rollout.eval import EvalConfig
    from agentrl.rollout.groups import GroupFilter
    from agentrl.runner.config import RunConfig
    from agentrl.runner.cpu import CpuPlan
    from agentrl.runner.envs import RowFactory
    from agentrl.runner.rollout_service import RolloutService
    from agentrl.tools.fleet import Fleet

__all__ = ["EngineWeights", "launch_rollout", "row_validator", "scheduler_config", "start_fleet", "stop_fleet"]


def scheduler_config(config: RunConfig) -> SchedulerConfig:
    """The run's :class:`SchedulerConfig`; in ``bounded_staleness`` mode its bound is one version
    tighter than the run's: a collected batch can wait one version in the runner's queue."""
    sched_cfg = config.rollout.scheduler
    if config.mode == "bounded_staleness" and sched_cfg.max_staleness is not None:
        sched_cfg = dataclasses.replace(sched_cfg, max_staleness=max(sched_cfg.max_staleness - 1, 0))
    return sched_cfg


def row_validator(env_factory: object) -> Callable[[dict[str, Any]], object] | None:
    """The environment's row check (its ``task_type``), so bad rows are reported when the data loads."""
    task_type = getattr(env_factory, "task_type", None)
    return task_type.model_validate if task_type is not None else None


async def launch_rollout(cls: type[RolloutService], config: RunConfig, env_factory: RowFactory,
                         *, group_filter: GroupFilter | None = None, cpu: CpuPlan | None = None,
                         starters: Sequence[EngineStarter] | None = None,
                         engine_fraction: float | None = None,
                         teacher_starters: Sequence[EngineStarter] | None = None) -> RolloutService:
    # the sandbox fleet first: a cluster without sandbox nodes fails here, before the engines boot
    fleet = await start_fleet(config.sandbox)
    try:
        service = await _launch_rollout(cls, config, env_factory, group_filter=group_filter, cpu=cpu,
                                        starters=starters, engine_fraction=engine_fraction,
                                        teacher_starters=teacher_starters)
    except BaseException:
        await stop_fleet(fleet)
        raise
    if fleet is not None:
        service.fleet = fleet
        service.also_stop(lambda: stop_fleet(fleet))
    return service


async def start_fleet(section: FleetConfig) -> Fleet | None:
    """With ``sandbox.executor = "ray"``: the run's sandbox fleet, started and installed for this
    process's tools (:func:`agentrl.tools.fleet.use_fleet`); ``None`` otherwise."""
    if section.executor != "ray":
        return None
    from agentrl.tools.fleet import Fleet, install

    fleet = Fleet(section)
    try:
        await fleet.start()
    except BaseException:
        await fleet.close()
        raise
    install(fleet)
    return fleet


async def stop_fleet(fleet: Fleet | None) -> None:
    """Uninstalls and closes what :func:`start_fleet` started (nothing for ``None``)."""
    if fleet is None:
        return
    from agentrl.tools.fleet import uninstall

    uninstall(fleet)
    await fleet.close()


async def _launch_rollout(cls: type[RolloutService], config: RunConfig, env_factory: RowFactory,
                          *, group_filter: GroupFilter | None, cpu: CpuPlan | None,
                          starters: Sequence[EngineStarter] | None, engine_fraction: float | None,
                          teacher_starters: Sequence[EngineStarter] | None) -> RolloutService:
    run_dir = config.run_dir()
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # version 0 from the start: without a warm-up or a stand-in, step 1's tokens come from the engines'
    # boot weights, which are the trainer's version 0 (SGLang would say "default")
    base = dataclasses.replace(config.engine_config(), weight_version="0")
    if engine_fraction is not None:  # colocated: the share of the device the device map gives the engine
        base = dataclasses.replace(base, mem_fraction_static=engine_fraction)
    if config.rollout.engines.boot_path is not None:  # serve a stand-in while the real model is prepared
        base = dataclasses.replace(base, model_path=config.rollout.engines.boot_path)
    engine_cfgs = [dataclasses.replace(base, log_dir=logs,
                                       env={**(cpu.engine_env(i) if cpu is not None else {}), **base.env})
                   for i in range(config.rollout.engines.count)]
    router_cfg = dataclasses.replace(config.rollout.router, log_dir=logs)
    urls = config.rollout.engines.urls
    health = config.rollout.health
    # the reward pool's workers start (and import sympy) while the engines boot
    warming = asyncio.ensure_future(asyncio.to_thread(shared_pool().warm)) if config.rollout.agent.reward_pool else None
    try:
        group = await (EngineGroup.attach(urls, router_cfg, health) if urls
                       else EngineGroup.launch(engine_cfgs, router_cfg, health, starters=starters))
    finally:
        if warming is not None:
            await asyncio.gather(warming, return_exceptions=True)
    try:
        if cpu is not None and not urls and starters is None:  # SGLang binds threads itself only on AMX/arm64
            # (a host actor pins the engine it starts)
            for i, engine in enumerate(group.engines):
                if engine.process is not None:
                    cpu.pin(i, engine.process.pid)
        service = _assemble(cls, config, env_factory, group, group_filter)
    except BaseException:
        await group.shutdown()
        raise
    if config.teacher is not None and not config.teacher.on_trainer:
        try:
            await _attach_teacher(service, config, teacher_starters, cpu)
        except BaseException:
            await service.shutdown()
            raise
    return service


async def _attach_teacher(service: RolloutService, config: RunConfig, starters: Sequence[EngineStarter] | None,
                          cpu: CpuPlan | None) -> None:
    """The rollout side's distillation teacher: its own engines (started here, stopped with the service),
    an endpoint's servers, or the run's own engines (self-distillation)."""
    from agentrl.rollout.client import ClientConfig, InferenceClient
    from agentrl.rollout.engine import SGLangEngine
    from agentrl.rollout.teacher import EngineTeacher, RolloutTeacher

    teacher = config.teacher
    assert teacher is not None
    if teacher.kind == "self":
        assert service.scoring is not None
        template = service.scheduler.template
        service.teacher = RolloutTeacher(EngineTeacher([service.scoring]), template=template,
                                         privileged=teacher.privileged, role=teacher.privileged_role)
        return
    engines: list[SGLangEngine] = []
    clients: list[InferenceClient] = []

    async def stop() -> None:
        try:
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        finally:
            for engine in engines:
                await asyncio.to_thread(engine.stop)

    service.also_stop(stop)  # before the first start: a start that fails stops the ones before it
    urls = list(teacher.urls)
    if teacher.kind == "engines":
        assert teacher.path is not None
        base = teacher.engines.to_config(teacher.path, dtype=config.model.dtype,
                                         device=config.engine_config().device)
        first = config.rollout.engines.count  # CPU cores: the teacher's engines after the rollout's
        for i in range(teacher.engines.count):
            env = {**(cpu.engine_env(first + i) if cpu is not None else {}), **base.env}
            engine_cfg = dataclasses.replace(base, log_dir=config.run_dir() / "logs" / f"teacher-{i}", env=env)
            starter = starters[i] if starters is not None else None
            engines.append(await SGLangEngine.launch(engine_cfg, starter))
            if cpu is not None and starter is None and engines[-1].process is not None:
                cpu.pin(first + i, engines[-1].process.pid)
        urls = [e.url for e in engines]
    clients.extend(InferenceClient(ClientConfig(base_url=url, unavailable_wait_s=60.0)) for url in urls)
    service.teacher = RolloutTeacher(EngineTeacher(clients))


def _assemble(cls: type[RolloutService], config: RunConfig, env_factory: RowFactory,
              group: EngineGroup, group_filter: GroupFilter | None) -> RolloutService:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model.tokenizer, local_files_only=True)
    template = ChatTemplate.from_name(config.model.template, tokenizer=tokenizer)
    health = config.rollout.health
    wait = health.unavailable_wait_s
    if wait is None:
        wait = config.rollout.engines.startup_timeout_s + 60.0 if health.restart else 0.0
    client = group.client(unavailable_wait_s=wait)
    data = DataSource(config.data.train, validate=row_validator(env_factory))
    sched_cfg = scheduler_config(config)
    scheduler = Scheduler(env_factory, template, client, data, sched_cfg, agent=config.agent_config(),
                          group_filter=group_filter, load_probe=group.active_requests,
                          engines=len(group.engines))
    weights = EngineWeights(WeightSync(group.engines, config.run_dir() / "weights", config.sync,
                                       on_remove=group.take_out, eligible=group.syncable),
                            group, wait_s=wait, method=config.sync_method(),
                            bucket_bytes=config.sync.bucket_mb << 20,
                            adapter_switch=client.set_adapter if config.train.lora is not None else None)
    group.before_readmit = weights.resync
    evals: dict[str, tuple[list[dict[str, Any]], EvalConfig, int, bool]] = {}
    for section in config.data.eval:
        good, _bad = read_rows(section.to_config(), validate=row_validator(env_factory))
        evals[section.name] = ([row for _, row in good], section.to_eval_config(), section.every_steps,
                                 section.at_start)

    async def stop() -> None:
        try:
            await client.close()
        finally:
            await group.shutdown()

    service = cls(scheduler, weights, scoring=client, eval_sets=evals, on_shutdown=stop)
    service.group = group
    group.start_monitor()  # dead or hung engines: out of rotation, restarted, re-synced, back
    # this process drives the rollouts: freeze what was built (tokenizer, template, data) and collect the
    # young generation less often; with CPython's defaults the collector took ~0.35 ms per episode
    tune_gc()
    return service
