"""``agentrl.run(config, environment=..., reward=..., callbacks=...)``: a training run from Python.

Usable from a script or a notebook, without the CLI (``agentrl train``); user objects are passed
directly::

    import agentrl
    from agentrl.runner import RunConfig

    config = RunConfig.from_dict({"model": {"path": "models/tiny"}, "data": {"train": {"path": "train.jsonl"}},
                                  "environment": {"name": "toy_arithmetic"}, "train": {"steps": 3}})
    summary = agentrl.run(config)                            # built-in environment by name
    summary = agentrl.run(config, environment=MyEnv, reward=my_reward, group_filter=my_filter)

``environment``: an :class:`~agentrl.environments.Environment` subclass (or any callable
``row -> environment``), built with ``config.environment.options`` as keyword arguments; ``None``:
the built-in named by ``config.environment.name``. ``reward(trajectory, task)``: replaces the
environment's own reward. ``use_ray`` (default on): the rollout side runs in a Ray actor and the
trainer in one actor per data-parallel rank, on a local Ray started for the run (its own temp dir
and namespace) or ``cluster.ray_address``; ``use_ray=False`` runs both sides in this process.

In a notebook (an event loop already running) ``await agentrl.run_async(...)`` instead. SIGINT/SIGTERM
end the run cleanly: the engines, router, sandboxes and Ray processes the run started are stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from agentrl._deprecated import moved_names
from agentrl.runner._run_plan import RunPlan, plan_run
from agentrl.runner._warmup_watch import warmup_watchers, watch_warmup
from agentrl.runner.config import RunConfig
from agentrl.runner.envs import BUILTIN_ENVIRONMENTS, EnvironmentClass, RewardOverride, environment_factory
from agentrl.runner.loop import RunCallback, Runner, RunSummary
from agentrl.runner.rundir import RunDirectory
from agentrl.runner.sides import LocalTrainer

if TYPE_CHECKING:
    from agentrl.rollout.groups import GroupFilter

__all__ = ["BUILTIN_ENVIRONMENTS", "environment_factory", "run", "run_async"]

# ``train`` was the run function's name, which agentrl.train (the package of train backends) also had
__getattr__ = moved_names(__name__, {"train": f"{__name__}:run", "train_async": f"{__name__}:run_async"})


def run(config: RunConfig, *, environment: EnvironmentClass | None = None, reward: RewardOverride | None = None,
        group_filter: GroupFilter | None = None, callbacks: Sequence[RunCallback] = (), use_ray: bool = True,
        resume: str | None = None, rollout_only: bool = False) -> RunSummary:
    """Runs ``config`` to its end and returns the summary (see the module doc)."""
    return asyncio.run(run_async(config, environment=environment, reward=reward, group_filter=group_filter,
                                 callbacks=callbacks, use_ray=use_ray, resume=resume, rollout_only=rollout_only))


async def run_async(config: RunConfig, *, environment: EnvironmentClass | None = None,
                    reward: RewardOverride | None = None, group_filter: GroupFilter | None = None,
                    callbacks: Sequence[RunCallback] = (), use_ray: bool = True, resume: str | None = None,
                    rollout_only: bool = False) -> RunSummary:
    """:func:`run` for a running event loop. The metric sinks ``config.logging`` asks for
    (TensorBoard, W&B) are added to ``callbacks`` and closed when the run ends, however it ends."""
    from agentrl.runner.logging_sinks import sinks_from_config
    from agentrl.runner.teacher_check import TeacherMismatch, teacher_problem

    problem = teacher_problem(config)  # before anything starts
    if problem is not None:
        raise TeacherMismatch(problem)
    factory = environment_factory(config, environment, reward)
    run_dir = RunDirectory(config.run_dir(), config_hash=config.hash())
    run_dir.write_config(config.to_dict())
    sinks = sinks_from_config(config)
    try:
        plan = plan_run(config, factory, run_dir, group_filter=group_filter, callbacks=[*callbacks, *sinks],
                        resume=resume, rollout_only=rollout_only,
                        probe_sequences=[] if rollout_only else _probes(config))
        return await _run(plan, use_ray=use_ray)
    finally:
        for sink in sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                close()


async def _run(plan: RunPlan, *, use_ray: bool) -> RunSummary:
    # the warm-up runs on the trainer while the engines boot (a resumed run's checkpoint holds it)
    watching: asyncio.Future[None] | None = None
    if plan.warmup_dir is not None:
        for cb in plan.callbacks:
            cb.on_phase("warmup", 0)
        watchers = warmup_watchers(plan.callbacks)
        if watchers and plan.config.warmup is not None:
            watching = asyncio.ensure_future(watch_warmup(plan.warmup_dir, plan.config.warmup.steps, watchers))
    try:
        return await _run_sides(plan, use_ray=use_ray)
    finally:
        if watching is not None:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)


async def _run_sides(plan: RunPlan, *, use_ray: bool) -> RunSummary:
    from agentrl.runner.rollout_service import RolloutService
    from agentrl.runner.trainer import TrainService

    if use_ray:
        from agentrl.runner.ray_run import run_on_ray

        return await run_on_ray(plan)
    config, cpu = plan.config, plan.cpu

    async def trainer_side() -> tuple[LocalTrainer, dict[str, Any]]:
        service = await asyncio.to_thread(TrainService.from_config, config,
                                          threads=cpu.trainer_threads if cpu is not None else None)
        side = LocalTrainer(service)
        return side, (await side.warmup(plan.warmup_dir) if plan.warmup_dir is not None else {})

    with _signals_cancel_current_task():  # from here on a signal cancels: every finally below runs
        booting = asyncio.ensure_future(RolloutService.launch(config, plan.env_factory, group_filter=plan.group_filter,
                                                              cpu=cpu))
        try:
            trainer, warm = (None, {}) if plan.rollout_only else await trainer_side()
            rollout = await booting
        except BaseException:
            booting.cancel()
            service = (await asyncio.gather(booting, return_exceptions=True))[0]
            if isinstance(service, RolloutService):
                await service.shutdown()
            raise
        try:
            if trainer is not None and plan.settings.sync_method != "disk":
                rollout.set_pusher(trainer)  # the trainer sends its weights to the engines itself
            runner = Runner(rollout, trainer, plan.settings, run_dir=plan.run_dir, checkpointer=plan.checkpointer,
                            callbacks=plan.callbacks, resume=plan.resume, warmup=warm)
            return await runner.run()
        finally:
            await rollout.shutdown()


def _probes(config: RunConfig) -> list[list[int]]:
    """The post-sync probe's fixed sequences, drawn (seeded) from the model's tokenizer."""
    if config.sync.probe_sequences == 0:
        return []
    from transformers import AutoTokenizer

    from agentrl.runner.probe import probe_sequences

    tokenizer = AutoTokenizer.from_pretrained(config.model.tokenizer, local_files_only=True)
    return probe_sequences(tokenizer, config.sync.probe_sequences, config.sync.probe_length, config.sync.probe_seed)


@contextlib.contextmanager
def _signals_cancel_current_task() -> Iterator[None]:
    """SIGTERM (and SIGINT) cancel the run's task, so every ``finally`` stops what the run started."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            if task is not None:
                loop.add_signal_handler(sig, task.cancel)
                installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
