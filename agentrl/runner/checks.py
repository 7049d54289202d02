"""Cross-section checks of a :class:`~agentrl.runner.RunConfig`.

Checks inside one section live on the section; these read several. Each returns the problems it
finds as sentences naming the fields (dotted from the root), their values and what is accepted;
:func:`run_checks` gathers them all so a config is fixed in one pass, not one error at a time.

Decisions recorded here:

- ``mask_offpolicy`` without ``partial_rollout`` is an **error** in ``sync`` and ``one_step_off``
  modes: there the weights never change while a batch is collected and no group outlives its step,
  so every token is on-policy at hand-over and the flag could never mask one.
- ``max_staleness`` in ``sync`` mode without ``partial_rollout`` is an error for the same reason
  (staleness is always 0); ``bounded_staleness`` mode needs it (>= 1: 0 is ``sync``);
  ``one_step_off`` trains on data one version old by construction, so a bound of 0 is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from agentrl.runner.config import RunConfig

__all__ = ["LoopMode", "run_checks"]

LoopMode = Literal["sync", "one_step_off", "bounded_staleness"]


def _loop_mode(cfg: RunConfig) -> list[str]:
    sched, mode = cfg.rollout.scheduler, cfg.mode
    out: list[str] = []
    moving = sched.partial_rollout or mode == "bounded_staleness"
    if sched.mask_offpolicy and not moving:
        out.append(f"rollout.scheduler.mask_offpolicy=True with mode={mode!r} and partial_rollout=False masks "
                   "nothing (weights never change while a batch is collected and no group outlives its step): "
                   "expected mask_offpolicy=False, or partial_rollout=True, or mode='bounded_staleness'")
    bound = sched.max_staleness
    if mode == "sync" and bound is not None and not sched.partial_rollout:
        out.append(f"rollout.scheduler.max_staleness={bound} with mode='sync' and partial_rollout=False has no "
                   "effect (staleness is always 0): expected None, or partial_rollout=True, or "
                   "mode='bounded_staleness'")
    if mode == "bounded_staleness" and (bound is None or bound < 1):
        out.append(f"rollout.scheduler.max_staleness={bound} with mode='bounded_staleness': expected an int >= 1 "
                   "(the bound this mode enforces; 0 is mode='sync')")
    if mode == "one_step_off" and bound == 0:
        out.append("rollout.scheduler.max_staleness=0 with mode='one_step_off', which trains on data one weight "
                   "version old: expected None or an int >= 1")
    if mode != "sync" and cfg.cluster.placement == "colocated" and cfg.cluster.accelerator != "cpu":
        out.append(f"mode={mode!r} with cluster.placement='colocated' on {cfg.cluster.accelerator!r}: colocated "
                   "engines release the accelerators while the trainer runs, so generation cannot overlap "
                   "training; expected mode='sync' or placement='disaggregated'")
    return out


def _batch(cfg: RunConfig) -> list[str]:
    sched, train = cfg.rollout.scheduler, cfg.train
    out: list[str] = []
    if sched.samples_per_step % train.data_parallel_size:
        out.append(f"rollout.scheduler.groups_per_step × group_size = {sched.groups_per_step} × {sched.group_size}"
                   f" = {sched.samples_per_step} episodes per step is not divisible by train.data_parallel_size="
                   f"{train.data_parallel_size}: expected a multiple of it, for an even share per rank")
    if cfg.rollout.sampling.temperature == 0:
        out.append("rollout.sampling.temperature=0 (greedy): training needs sampled rollouts and logprobs at a "
                   "positive temperature; expected > 0 (greedy sampling is for data.eval[*].sampling)")
    if train.steps is None and cfg.data.train.epochs is None:
        out.append("train.steps=None with data.train.epochs=None: the run would never end; expected a number of "
                   "steps or of epochs")
    opt = train.optimizer
    if opt.schedule == "cosine" and opt.decay_steps is None and train.steps is None:
        out.append("train.optimizer.schedule='cosine' with decay_steps=None and train.steps=None: expected "
                   "decay_steps or train.steps (the cosine needs an end)")
    if train.steps is not None and opt.warmup_steps >= train.steps:
        out.append(f"train.optimizer.warmup_steps={opt.warmup_steps} >= train.steps={train.steps}: the run would "
                   "never reach its learning rate; expected fewer warm-up steps")
    return out


def _devices(cfg: RunConfig) -> list[str]:
    cluster, engines, train = cfg.cluster, cfg.rollout.engines, cfg.train
    if cluster.accelerator == "cpu":
        return []
    out: list[str] = []
    kind = cluster.accelerator
    per_engine = cluster.accelerators_per_engine or engines.accelerators_per_engine
    if per_engine != engines.accelerators_per_engine:
        out.append(f"cluster.accelerators_per_engine={per_engine} but rollout.engines.tp_size × dp_size = "
                   f"{engines.tp_size} × {engines.dp_size} = {engines.accelerators_per_engine}: expected them equal")
    ranks = train.world_size
    trainer = cluster.trainer_accelerators or ranks
    if trainer != ranks:
        what = ("tensor_parallel_size × pipeline_parallel_size × data_parallel_size = "
                f"{train.tensor_parallel_size} × {train.pipeline_parallel_size} × {train.data_parallel_size}"
                if train.backend == "megatron" else "data_parallel_size")
        out.append(f"cluster.trainer_accelerators={trainer} but train.{what} = {ranks} ranks of backend "
                   f"{train.backend!r}, one accelerator each: expected them equal")
    engine_total = engines.count * per_engine
    if cluster.num_accelerators is not None:
        need = engine_total + trainer if cluster.placement == "disaggregated" else max(engine_total, trainer)
        if need > cluster.num_accelerators:
            how = "+" if cluster.placement == "disaggregated" else "and, sharing them,"
            out.append(f"rollout.engines.count={engines.count} engines × {per_engine} {how} {trainer} for the "
                       f"trainer need {need} accelerators with placement={cluster.placement!r}, but "
                       f"cluster.num_accelerators={cluster.num_accelerators}: expected at most that many")
    if cluster.placement == "colocated" and engines.enable_memory_saver is False:
        out.append(f"rollout.engines.enable_memory_saver=False with placement='colocated' on {kind!r}: colocated "
                   "engines must release accelerator memory while the trainer runs; expected None or True")
    return out


def _train_numerics(cfg: RunConfig) -> list[str]:
    """Settings that need an accelerator: the CUDA attention kernels, and offloading the optimizer
    from a device the CPU trainer does not have."""
    train, accel = cfg.train, cfg.cluster.accelerator
    out: list[str] = []
    if train.attention in ("flash_attn", "varlen", "te") and accel != "gpu":
        out.append(f"train.attention={train.attention!r} with cluster.accelerator={accel!r}: that kernel runs on "
                   "CUDA GPUs only; expected train.attention='auto' (it picks what the device has)")
    if train.optimizer_offload and accel == "cpu":
        out.append("train.optimizer_offload=True with cluster.accelerator='cpu': a CPU trainer keeps its optimizer "
                   "state in host memory already; expected train.optimizer_offload=False")
    return out


def _lora(cfg: RunConfig) -> list[str]:
    """A LoRA run: its adapter reaches the engines from tensors or a folder, never by a broadcast;
    engines given by URL must have been started with LoRA serving."""
    if cfg.train.lora is None:
        return []
    out: list[str] = []
    if cfg.sync.method == "distributed":
        out.append("sync.method='distributed' with train.lora: SGLang loads an adapter from tensors on its host or "
                   "from a folder, not from a broadcast; expected 'tensor' (engines on the trainer's host), 'disk' "
                   "(a folder both sides see) or 'auto'")
    lora_args = [a for a in cfg.rollout.engines.extra_args if a.startswith("--lora") or a.startswith("--max-lora")
                 or a == "--enable-lora"]
    if lora_args:
        out.append(f"rollout.engines.extra_args={lora_args}: the engines' LoRA flags come from train.lora (rank, "
                   "target_modules); expected them out of extra_args")
    return out


def _eval(cfg: RunConfig) -> list[str]:
    out: list[str] = []
    ctx = cfg.rollout.context_length
    for i, ev in enumerate(cfg.data.eval):
        if ev.sampling is not None and ctx is not None and ev.sampling.max_new_tokens >= ctx:
            out.append(f"data.eval[{i}].sampling.max_new_tokens={ev.sampling.max_new_tokens} leaves no room for a "
                       f"prompt in the rollout's context of {ctx} tokens: expected fewer")
    return out


def _teacher(cfg: RunConfig) -> list[str]:
    teacher = cfg.teacher
    if teacher is None:
        return []
    out: list[str] = []
    if teacher.template is not None and teacher.template != cfg.model.template:
        out.append(f"teacher.template={teacher.template!r} differs from model.template={cfg.model.template!r}: the "
                   "teacher must read the conversation as the student renders it; expected the same template")
    if teacher.kind == "model" and cfg.train.backend != "torch":
        out.append(f"teacher.kind='model' with train.backend={cfg.train.backend!r}: the trainer-side teacher runs on "
                   "the torch backend; expected kind='engines' (its own SGLang engines) or train.backend='torch'")
    if teacher.kind == "self" and cfg.train.lora is not None:
        out.append("teacher.kind='self' with train.lora: the engines serve the adapter by name per request, which the "
                   "teacher's scoring requests do not carry; expected no LoRA")
    return out


_CHECKS: tuple[Callable[[RunConfig], list[str]], ...] = (
    _loop_mode, _batch, _devices, _train_numerics, _lora, _eval, _teacher)


def run_checks(cfg: RunConfig) -> list[str]:
    """Every cross-section problem of ``cfg`` (empty when it is consistent)."""
    return [problem for check in _CHECKS for problem in check(cfg)]
