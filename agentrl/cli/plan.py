"""The pre-flight of ``agentrl train``: everything that can be checked before Ray or an engine starts.

:func:`preflight` resolves the environment (registry, or ``module:attr``), the chat template, the
model folder's ``config.json`` (its heads must divide by the engines' tensor parallel size, and
the megatron backend must convert it at the train section's TP/PP sizes) and tokenizer files, the first rows of the training data
(validated against the environment's ``task_type``), and what the machine has against what the
config asks for; it returns a :class:`Plan` with the run's shape (placement, steps, prompts and
samples per step, objective, eval sets, token budget) and the problems found, split in two:

- ``problems``: the config cannot run anywhere as written (a missing model folder, a bad data
  row, an unknown environment) -- always an error;
- ``machine``: this machine lacks what the config asks for (CUDA for ``cluster.accelerator='gpu'``,
  enough cores for the CPU engines, the ``sglang`` and ``sglang_router`` packages that start the
  engines and the router, megatron-core for ``train.backend='megatron'``) -- an error for a real
  run, reported but not fatal under ``--dry-run`` (a GPU recipe can be dry-run on a laptop).

Engines given by ``rollout.engines.urls`` must answer ``GET /server_info`` within
:data:`URL_TIMEOUT_S` (a problem naming the URL otherwise). Packages are looked up, not imported.

Torch is imported only for the megatron backend (its layout check). On an accelerator the plan shows
the device map (:mod:`agentrl.runner.device_plan`): the nodes come from ``cluster.ray_address``, or
this machine's accelerators (``nvidia-smi``/``npu-smi``), or, where there are none, the config.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.runner.config import RunConfig

__all__ = ["HEAD_ROWS", "URL_TIMEOUT_S", "Plan", "preflight"]

HEAD_ROWS = 8
"""How many rows of the training data the pre-flight validates."""

URL_TIMEOUT_S = 2.0
"""How long the pre-flight waits for each engine of ``rollout.engines.urls`` to answer."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass
class Plan:
    """What a run would do, and why it cannot (see the module doc)."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    machine: list[str] = field(default_factory=list)
    environment: Any = None
    device_map: Any = None  # a DeviceMap on an accelerator
    device_source: str = ""
    memory: Any = None  # the memory planner's MemoryPlan on an accelerator

    def add(self, name: str, value: object) -> None:
        self.lines.append((name, str(value)))

    def format(self) -> str:
        width = max((len(n) for n, _ in self.lines), default=0)
        out = [f"{n:<{width}}  {v}" for n, v in self.lines]  # an empty name continues the line above
        out += [f"missing on this machine: {m}" for m in self.machine]
        return "\n".join(out)


def _model(cfg: RunConfig, plan: Plan) -> dict[str, Any]:
    folder = Path(cfg.model.path)
    conf = folder / "config.json"
    if not folder.is_dir():
        plan.problems.append(f"model.path={cfg.model.path!r}: no such folder; expected a Hugging Face model "
                             "folder (config.json, weights, tokenizer)")
        return {}
    try:
        meta = json.loads(conf.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        plan.problems.append(f"model.path={cfg.model.path!r}: cannot read {conf.name} ({type(exc).__name__}: "
                             f"{exc}); expected a Hugging Face model folder")
        return {}
    if not isinstance(meta, dict) or "model_type" not in meta:
        plan.problems.append(f"model.path={cfg.model.path!r}: {conf.name} has no 'model_type'; expected a "
                             "Hugging Face model config")
        return {}
    if cfg.train.backend == "torch":  # a mixture of experts the torch backend cannot route, or adapt
        from agentrl.train.moe_models import check_moe_lora, check_moe_model

        try:
            check_moe_model(meta, what=f"model.path={cfg.model.path!r}")
            check_moe_lora(meta, cfg.train.lora)
        except ValueError as exc:
            plan.problems.append(str(exc))
    tok = Path(cfg.model.tokenizer)
    if not any((tok / f).is_file() for f in _TOKENIZER_FILES):
        key = "model.tokenizer_path" if cfg.model.tokenizer_path is not None else "model.path"
        plan.problems.append(f"{key}={str(tok)!r}: no tokenizer files (expected one of {list(_TOKENIZER_FILES)})")
    return meta


def _template(cfg: RunConfig, plan: Plan) -> None:
    from agentrl.chat.template import ChatTemplate

    try:
        ChatTemplate.from_name(cfg.model.template)
    except (ValueError, OSError) as exc:
        plan.problems.append(f"model.template={cfg.model.template!r}: {exc}")


def _environment(cfg: RunConfig, plan: Plan, environment: Any) -> Any:
    from agentrl.environments.registry import RegistryError, resolve

    if environment is not None:
        return environment
    try:
        return resolve("environment", cfg.environment.name, allow_import=True)
    except RegistryError as exc:
        plan.problems.append(f"environment.name: {exc}")
        return None


def _data(cfg: RunConfig, plan: Plan, env: Any) -> int | None:
    from agentrl.data.source import DataError, first_rows

    task_type = getattr(env, "task_type", None)
    validate = task_type.model_validate if task_type is not None and hasattr(task_type, "model_validate") else None
    datasets = [("data.train", cfg.data.train)]
    datasets += [(f"data.eval.{i}", ev.to_config()) for i, ev in enumerate(cfg.data.eval)]
    total = None
    for key, dconf in datasets:
        try:
            good, bad = first_rows(dconf, HEAD_ROWS, validate)
        except DataError as exc:
            plan.problems.append(f"{key}.path={os.fspath(dconf.path)!r}: {exc}".replace(
                f"DataConfig.path={os.fspath(dconf.path)!r}: ", ""))
            continue
        what = f" against {task_type.__name__}" if task_type is not None else ""
        for row in bad:
            plan.problems.append(f"{key}: bad row {row}{what}; fix the row, or map its columns with {key}.fields")
        if not good and not bad:
            plan.problems.append(f"{key}.path={os.fspath(dconf.path)!r}: no rows")
        if key == "data.train" and not bad:
            total = _count_rows(Path(dconf.path))
    return total


def _conversations_file(key: str, path: str, plan: Plan) -> int:
    """The number of conversations in a warm-up JSONL; its first line must be one (``messages``)."""
    try:
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        plan.problems.append(f"{key}={path!r}: cannot read it ({exc}); expected a JSONL of conversations")
        return 0
    if not lines:
        plan.problems.append(f"{key}={path!r}: no conversations")
        return 0
    try:
        first = json.loads(lines[0])
    except ValueError as exc:
        plan.problems.append(f"{key}={path!r}: line 1 is not JSON ({exc})")
        return 0
    if not isinstance(first, dict) or not isinstance(first.get("messages"), list):
        plan.problems.append(f"{key}={path!r}: line 1 is not a conversation; expected "
                             '{"messages": [...], "tools": [...]}')
    return len(lines)


def _warmup(cfg: RunConfig, plan: Plan) -> None:
    warm = cfg.warmup
    if warm is None:
        return
    n = _conversations_file("warmup.data", warm.data, plan)
    text = f"{warm.steps} supervised steps x {warm.batch_size} of {n} conversations ({warm.data})"
    if warm.check is not None:
        _conversations_file("warmup.check.path", warm.check.path, plan)
        text += (f"; check every {warm.check.every_steps} steps: held-out token accuracy >= "
                 f"{warm.check.min_token_accuracy} ({warm.check.path})")
    plan.add("warm-up", text + "; while the engines boot")


def _count_rows(path: Path) -> int | None:
    if path.is_file() and path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    return None


def _machine(cfg: RunConfig, plan: Plan) -> None:
    cluster, engines = cfg.cluster, cfg.rollout.engines
    if cluster.accelerator == "cpu":
        cores = len(os.sched_getaffinity(0))
        launched = cfg.engines_launched  # a distillation teacher's own engines need cores too
        if launched + 1 > cores:
            what = (f"rollout.engines.count={engines.count} CPU engines" if launched == engines.count else
                    f"rollout.engines.count={engines.count} and teacher.engines.count={launched - engines.count}: "
                    f"{launched} CPU engines")
            plan.machine.append(f"{what} need a core each and the trainer one more ({launched + 1}), but this machine "
                                f"gives {cores} cores: expected rollout.engines.count"
                                f"{' + teacher.engines.count' if launched > engines.count else ''} <= {max(cores - 1, 1)}")
        return
    _device_map(cfg, plan)
    if cluster.placement == "colocated" and engines.enable_memory_saver is not False \
            and not _has_module("torch_memory_saver"):
        plan.machine.append(
            f"placement='colocated' on {cluster.accelerator!r}: the engines release their memory around each train "
            "step through SGLang's --enable-memory-saver, which needs the torch-memory-saver package (without it "
            "the engine refuses the flag); expected pip install torch-memory-saver==0.0.10 (scripts/setup.sh installs "
            "it on a GPU machine) or cluster.placement='disaggregated'")


def _device_map(cfg: RunConfig, plan: Plan) -> None:
    """Where every engine (TP rank) and trainer rank would go, and the colocated memory shares: on the
    nodes of ``cluster.ray_address``, else on this machine's accelerators; where those are missing,
    on the nodes the config implies (the map still shows, the machine problem is reported)."""
    from agentrl.runner.device_plan import cluster_nodes, planned_device_map
    from agentrl.runner.devices import PlacementMapError

    cluster = cfg.cluster
    what = {"gpu": "CUDA GPU", "npu": "Ascend NPU"}[cluster.accelerator]
    need = _accelerators_needed(cfg)
    try:
        nodes, source = cluster_nodes(cfg)
    except Exception as exc:  # an unreachable cluster address
        plan.machine.append(f"cluster.ray_address={cluster.ray_address!r}: cannot read the cluster's nodes "
                            f"({type(exc).__name__}: {exc}); expected a running Ray cluster there")
        nodes, source = cluster_nodes(cfg, from_config=True)
    have = sum(len(n.devices) for n in nodes) if source != "config" else 0
    if source == "config":
        plan.machine.append(f"cluster.accelerator={cluster.accelerator!r}: no {what} is visible here; expected "
                            f"{need} (or cluster.accelerator='cpu')")
    elif have < need:
        plan.machine.append(f"the placement needs {need} accelerators, the {source} has {have} {what}s")
    try:
        plan.device_map = planned_device_map(cfg, nodes)
        plan.device_source = f"{len(nodes)} node(s) from {source}"
    except (PlacementMapError, ValueError) as exc:
        (plan.problems if source == "config" else plan.machine).append(str(exc))
    _memory(cfg, plan, nodes)


def _memory(cfg: RunConfig, plan: Plan, nodes: list[Any]) -> None:
    """The memory planner's table per device (weights, gradients, master weights, optimizer state,
    activations with and without checkpointing, the logits working set; per engine rank its KV cache
    in tokens); a trainer rank or an engine over capacity, or dense [S, S] attention, is a problem."""
    from agentrl.runner.device_plan import memory_plan

    known = [n.memory_bytes for n in nodes if n.memory_bytes]
    capacity = min(known) if known and len(known) == len(nodes) else None
    shares = getattr(plan.device_map, "memory", None)
    plan.memory = memory_plan(cfg, capacity, engine_fraction=shares.engine_fraction if shares is not None else None)
    plan.problems.extend(plan.memory.problems)


def _sinks(cfg: RunConfig, plan: Plan) -> None:
    """The metric sinks asked for are installed (looked up, not imported: tensorboard pulls in torch)."""
    for key, module in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if getattr(cfg.logging, key) and not _has_module(module):
            plan.problems.append(f"logging.{key}=true: the {module} package is not installed; expected "
                                 f"pip install 'agentrl[logging]' (or pip install {module}), or logging.{key}=false")


def _has_module(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (a dotted name imports its parents)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _packages(cfg: RunConfig, plan: Plan) -> None:
    """The packages that start what the config asks for: SGLang for engines the run launches, the
    router (always started, also over ``rollout.engines.urls``), megatron-core for its backend."""
    urls = cfg.rollout.engines.urls
    needs = [] if urls else [("sglang", "sglang", f"rollout.engines.count={cfg.rollout.engines.count}: the run "
                                                  "starts its SGLang engines (python -m sglang.launch_server)")]
    needs.append(("sglang_router", "sglang-router", "the run starts sglang-router in front of its engines"))
    if cfg.train.backend == "megatron":
        needs.append(("megatron.core", "megatron-core", "train.backend='megatron' trains with megatron-core"))
    for module, dist, why in needs:
        if not _has_module(module):
            plan.machine.append(f"{why}, but the {dist} package is not installed here (no module {module!r}); "
                                f"expected it installed (scripts/setup.sh installs it; `agentrl doctor` checks it)")


def _probe(url: str) -> str | None:
    """Why ``GET url/server_info`` did not answer with a JSON object, or ``None`` when it did."""
    import urllib.error
    import urllib.request

    target = url.rstrip("/") + "/server_info"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as the rollout's client: no proxy
    try:
        with opener.open(target, timeout=URL_TIMEOUT_S) as resp:
            info = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return f"GET {target} -> HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, TimeoutError):
            return f"GET {target}: no answer within {URL_TIMEOUT_S:g} s"
        return f"GET {target} failed ({type(reason).__name__}: {reason})"
    return None if isinstance(info, dict) else f"GET {target} answered {info!r:.100}, not a JSON object"


def _engine_urls(cfg: RunConfig, plan: Plan) -> None:
    urls = cfg.rollout.engines.urls
    if not urls:
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        answers = list(pool.map(_probe, urls))
    for i, (url, why) in enumerate(zip(urls, answers, strict=True)):
        if why is not None:
            plan.problems.append(f"rollout.engines.urls[{i}]={url!r}: no SGLang engine answers there: {why}; "
                                 "expected a running engine (python -m sglang.launch_server) at that URL")


def _heads(cfg: RunConfig, plan: Plan, meta: dict[str, Any]) -> None:
    """Tensor parallelism splits attention heads: each engine rank needs whole heads. The megatron
    backend's own check (which architectures it converts, and the TP/PP split of heads, KV groups,
    MLP and layers) runs on the same ``config.json``; it imports torch, which that backend needs anyway."""
    if not meta:
        return
    nested = meta.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else meta
    heads, tp = text.get("num_attention_heads"), cfg.rollout.engines.tp_size
    if isinstance(heads, int) and heads > 0 and heads % tp:
        plan.problems.append(f"rollout.engines.tp_size={tp}: the model has num_attention_heads={heads} "
                             f"({cfg.model.path}/config.json), which tensor parallelism cannot split evenly; "
                             f"expected a divisor of {heads}")
    if cfg.train.backend == "megatron":
        from agentrl.train.megatron.qwen3 import Qwen3Spec

        try:
            Qwen3Spec.from_hf(meta).check_layout(cfg.megatron_backend_config())
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
            plan.problems.append(f"train.backend='megatron' with model.path={cfg.model.path!r}: {what}")


def _accelerators_needed(cfg: RunConfig) -> int:
    cluster, engines = cfg.cluster, cfg.rollout.engines
    per_engine = cluster.accelerators_per_engine or engines.accelerators_per_engine
    trainer = cluster.trainer_accelerators or cfg.train.world_size
    total = engines.count * per_engine
    teacher = cfg.teacher.engines if cfg.teacher is not None and cfg.teacher.kind == "engines" else None
    own = teacher.count * teacher.accelerators_per_engine if teacher is not None else 0  # never shared
    return own + (total + trainer if cluster.placement == "disaggregated" else max(total, trainer))


def _shape(cfg: RunConfig, plan: Plan, meta: dict[str, Any], rows: int | None) -> None:
    sched, eng, train = cfg.rollout.scheduler, cfg.rollout.engines, cfg.train
    cl = cfg.cluster
    plan.add("run folder", cfg.run_dir())
    plan.add("model", f"{cfg.model.path} ({meta.get('model_type', '?')}, {meta.get('num_hidden_layers', '?')} "
                      f"layers, serving {cfg.model.dtype}), template {cfg.model.template}")
    env = plan.environment
    env_name = getattr(env, "__name__", type(env).__name__) if env is not None else "?"
    plan.add("environment", f"{cfg.environment.name} -> {env_name}")
    _context_lines(plan, cfg)
    if cl.accelerator == "cpu":
        where = f"CPU, {eng.count} engine(s) and the trainer on {len(os.sched_getaffinity(0))} cores"
    else:
        where = (f"{cl.accelerator} x{_accelerators_needed(cfg)}: {eng.count} engine(s) x "
                 f"{cl.accelerators_per_engine or eng.accelerators_per_engine} (tp={eng.tp_size} dp={eng.dp_size}), "
                 f"trainer x {cl.trainer_accelerators or train.world_size}")
    plan.add("placement", f"{cl.placement}, {where}; mode {cfg.mode}")
    plan.add("sandboxes", cfg.sandbox.describe())
    if plan.device_map is not None:
        plan.add("devices", f"planned on {plan.device_source} (Ray names the actual ids at launch; the run "
                            "writes them to device_map.json)")
        for line in plan.device_map.format():
            plan.add("", line)
    if plan.memory is not None:
        plan.add("memory", "per device, planned (agentrl.train.memory_plan; bytes of one rank)")
        for line in plan.memory.format():
            plan.add("", line)
    lora = (f", LoRA rank {train.lora.rank} alpha {train.lora.alpha:g} on {', '.join(train.lora.target_modules)}"
            if train.lora is not None else "")
    ep = f" ep={train.expert_parallel_size}" if train.expert_parallel_size > 1 else ""
    plan.add("trainer", f"{train.backend}, dp={train.data_parallel_size} tp={train.tensor_parallel_size} "
                        f"pp={train.pipeline_parallel_size}{ep}, {train.dtype}{lora}")
    steps: object = train.steps
    if steps is None and rows is not None and cfg.data.train.epochs is not None:
        steps = f"~{rows * cfg.data.train.epochs // sched.groups_per_step} (data runs out)"
    plan.add("steps", steps if steps is not None else "until the data runs out")
    plan.add("per step", f"{sched.groups_per_step} prompts x {sched.group_size} samples = "
                         f"{sched.samples_per_step} episodes" + (f" (+{sched.over_sampling:.0%} over-sampled)"
                                                                  if sched.over_sampling else ""))
    plan.add("algorithm", _algorithm_line(cfg))
    for ev in cfg.data.eval:
        n = _count_rows(Path(ev.path))
        plan.add(f"eval {ev.name}", f"{'?' if n is None else n} prompts x {ev.samples_per_prompt} samples, "
                                    f"pass@{','.join(map(str, ev.pass_k))}, every {ev.every_steps} steps ({ev.path})")
    if rows is not None:
        plan.add("data", f"{rows} training rows ({cfg.data.train.path}), first {min(rows, HEAD_ROWS)} valid")
    ctx = cfg.rollout.context_length or meta.get("max_position_embeddings")
    budget = f"{cfg.rollout.sampling.max_new_tokens} new tokens per turn"
    if isinstance(ctx, int):
        budget += f", context {ctx}: at most {ctx * sched.samples_per_step:,} tokens per step"
    plan.add("token budget", budget + f"; micro-batches of {train.max_tokens_per_micro_batch} tokens")


def _context_lines(plan: Any, cfg: RunConfig) -> None:
    """The environment's budgets and context policy, as the config sets them."""
    env = cfg.environment
    if env.limits:
        plan.add("budgets", ", ".join(f"{k} {v if v is not None else 'none'}" for k, v in env.limits.items()))
    if not env.context:
        return
    policy = env.context_policy()
    if policy is None:
        plan.add("context", "policy none: an episode ends context_budget at the first request that does not fit")
        return
    ctx = cfg.rollout.context_length
    try:
        trigger, target = policy.thresholds(ctx)
        when = f"compacts when a request would pass {trigger} tokens"
        if policy.name == "summarize":
            trained = "trained" if getattr(policy, "train_summary", True) else "masked out of the loss"
            when += f" into a summary the model writes ({trained})"
        else:
            when += f" (to ~{target} tokens: hysteresis)"
    except ValueError as exc:
        when = f"problem: {exc}"
    plan.add("context", f"policy {policy.name}, {when}; each compaction starts a new sequence of the rollout")


def _algorithm_line(cfg: RunConfig) -> str:
    alg = cfg.algorithm
    low, high = alg.resolved_clip
    # no upper clip given means the loss clips symmetrically (eps_clip_high defaults to eps_clip)
    clip = f"±{low:g}" if high is None or high == low else f"{low:g}/{high:g}"
    out = f"{alg.estimator.value}, {alg.resolved_policy_loss.value} loss, clip {clip}"
    out += f", KL loss {alg.kl_kind} x {alg.kl_coef:g} to the reference model" if alg.kl_coef > 0 else ", no KL loss"
    out += "" if alg.correction == "none" else f", {alg.correction} correction"
    routing = cfg.model_routing()
    if routing is not None:  # a mixture of experts: its engines return routing either way
        replay = "replayed in every training forward" if alg.routing_replay.value == "rollout" else "compared, not replayed"
        out += (f", MoE routing {replay} ({routing.layers} layers x top-{routing.top_k} of {routing.experts}, "
                f"{routing.bytes_per_token} B/token)")
    return out


def preflight(cfg: RunConfig, *, environment: Any = None) -> Plan:
    """The plan of ``cfg`` and every problem found (see the module doc); starts nothing."""
    plan = Plan()
    meta = _model(cfg, plan)
    _heads(cfg, plan, meta)
    _template(cfg, plan)
    plan.environment = _environment(cfg, plan, environment)
    rows = _data(cfg, plan, plan.environment)
    _machine(cfg, plan)
    _packages(cfg, plan)
    _engine_urls(cfg, plan)
    _sinks(cfg, plan)
    _shape(cfg, plan, meta, rows)
    _warmup(cfg, plan)
    _teacher(cfg, plan)
    return plan


def _teacher(cfg: RunConfig, plan: Plan) -> None:
    """The distillation teacher: where it runs, its weight, and (before anything starts) that it shares the
    student's tokenizer and chat template."""
    from agentrl.runner.teacher_check import teacher_problem

    teacher = cfg.teacher
    if teacher is None:
        return
    where = {"model": f"{teacher.path} on the trainer",
             "engines": f"{teacher.path} on {teacher.engines.count} SGLang engine(s) of its own "
                        f"(tp={teacher.engines.tp_size})",
             "endpoint": f"{', '.join(teacher.urls)} (scoring token ids by prefill)",
             "self": f"the student given a privileged {teacher.privileged_role} message {teacher.privileged!r}"}
    mix = "A_task + " if teacher.task_reward else ""
    plan.add("teacher", f"{teacher.kind}: {where[teacher.kind]}; advantage {mix}{teacher.coef:g} x (log p_teacher - "
                        "log p_student) on sampled tokens")
    problem = teacher_problem(cfg)
    if problem is not None:
        plan.problems.append(problem)
