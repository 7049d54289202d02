"""``agentrl train``: a training run from a config file.

    agentrl train examples/tiny_cpu.toml                       # run it
    agentrl train examples/tiny_cpu.toml train.steps=4 rollout.sampling.temperature=0.8
    agentrl train examples/tiny_cpu.toml --dry-run             # check everything, print the plan, start nothing
    agentrl train examples/tiny_cpu.toml --print-config        # every value and where it came from
    agentrl train examples/tiny_cpu.toml --resume              # continue the config's run folder
    agentrl train runs/exp1 --resume                           # continue a run from its own saved config
    agentrl train examples/tiny_cpu.toml --quiet               # plain line logs instead of the live display

CONFIG is a ``.toml``/``.yaml`` file (see :mod:`agentrl.cli.config_files` for the override syntax),
or, with ``--resume``, a run folder, whose ``config.json`` is the config (overrides apply on top;
changing anything that enters the config hash is refused). ``environment.name`` is a built-in, an
installed package's entry point (group ``agentrl.environments``) or ``module:attr``; ``--reward``
and ``--group-filter`` name a reward ``(trajectory, task) -> float`` and a group filter the same
way (entry-point groups ``agentrl.rewards`` and ``agentrl.group_filters``; built-in filter
``drop_uniform_rewards``). They are not part of the config (nor of its hash): the names given are
recorded in the run folder's ``components.json``, and ``--resume`` reuses them when none are
given and refuses different ones (a resumed run trains with the reward it started with).

Every check (config, environment, template, model folder, first data rows, accelerators and cores)
runs before Ray or any engine starts; a problem is ``error: ...`` on stderr with exit status 2.
Under ``--dry-run`` what this machine lacks (CUDA for a GPU recipe, cores) is reported, not fatal.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentrl.cli._errors import fail

if TYPE_CHECKING:
    from agentrl.cli.config_files import ResolvedConfig

__all__ = ["COMPONENTS_FILE", "resolve_target", "train"]

COMPONENTS_FILE = "components.json"
"""The run folder's record of the names given to ``--reward`` and ``--group-filter`` (``null``: none)."""

_FLAGS = {"reward": "--reward", "group_filter": "--group-filter"}

def _run_folder_config(folder: Path) -> dict[str, Any]:
    record_path = folder / "config.json"
    if not record_path.is_file():
        fail(f"{folder}: not a run folder (no config.json); expected a folder written by 'agentrl train'")
    import json

    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"{record_path}: cannot read it ({exc})")
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        fail(f"{record_path}: not a run folder's config.json (expected a 'config' table)")
    config: dict[str, Any] = record["config"]
    return config


def resolve_target(target: Path, overrides: list[str], resume: bool) -> ResolvedConfig:
    """The config of ``target`` (a config file, or a run folder under ``--resume``) with ``overrides``."""
    from agentrl.cli.config_files import ConfigError, load_run_config

    try:
        if target.is_dir():
            if not resume:
                fail(f"{target}: a folder; expected a .toml or .yaml config file (or add --resume to continue "
                     "the run in that folder)")
            base = _run_folder_config(target)
            base.setdefault("logging", {})["run_dir"] = str(target)
            return load_run_config(None, overrides, base=base)
        return load_run_config(target, overrides)
    except ConfigError as exc:
        fail(str(exc))


def _check_resume(resolved: ResolvedConfig) -> str:
    """The run folder to resume; it must hold this config's run and a complete checkpoint."""
    from agentrl.runner.checkpoint import CheckpointError, RunCheckpointer

    config = resolved.config
    folder = config.run_dir()
    if not folder.is_dir():
        fail(f"--resume: run folder {str(folder)!r} does not exist (logging.run_dir, or runs/<config hash>); "
             "expected the folder of an earlier run of this config")
    saved = _run_folder_config(folder)
    import json

    saved_hash = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("config_hash")
    if saved_hash != config.hash():
        from agentrl.cli.config_files import leaves
        from agentrl.runner.config import RunConfig

        old, new = leaves(RunConfig.from_dict(saved).to_dict()), leaves(config.to_dict())
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and not k.startswith(
            ("logging.", "checkpoint.resume", "cluster.ray_address")))
        fail(f"--resume: {folder} was run with another config (hash {str(saved_hash)[:12]}, this one "
             f"{config.hash()[:12]}); changed: {', '.join(changed[:8]) or '?'}; expected the same config")
    try:
        RunCheckpointer.resolve(folder)
    except CheckpointError as exc:
        fail(f"--resume: {exc}")
    return str(folder)


def _finished(folder: Path, config: Any) -> str | None:
    """Why resuming the run in ``folder`` would train nothing (it reached ``train.steps``, or its data
    ran out), or ``None``."""
    import json

    from agentrl.runner.checkpoint import RunCheckpointer

    latest = RunCheckpointer.resolve(folder)
    step = int(latest.name.removeprefix("step_")) if latest.name.startswith("step_") else 0
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = {}
    # judged on what a resume restores, the latest checkpoint: a run whose last steps were not
    # checkpointed (killed, or the checkpoint removed) resumes and redoes them
    steps = step
    if config.train.steps is not None and steps >= config.train.steps:
        return (f"the run in {folder} already finished: {steps} steps (train.steps={config.train.steps}); nothing "
                f"to resume. To train more, --resume it with train.steps=<more than {steps}> (the one setting a "
                "resumed run may change)")
    if summary.get("stopped_because") == "data exhausted" and int(summary.get("steps") or 0) == step:
        return (f"the run in {folder} already finished: its data ran out after {steps} steps; nothing to resume "
                "(more data or epochs make another run)")
    return None


def _recorded_components(folder: Path) -> dict[str, str | None] | None:
    """The names a run folder records (``None`` for a folder written before they were recorded)."""
    import json

    path = folder / COMPONENTS_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"--resume: {path}: cannot read it ({exc}); expected {{\"reward\": ..., \"group_filter\": ...}}")
    if not isinstance(record, dict) or any(not isinstance(record.get(k), (str, type(None))) for k in _FLAGS):
        fail(f"--resume: {path}: expected {{\"reward\": name or null, \"group_filter\": name or null}}, "
             f"got {record!r:.200}")
    return {k: record.get(k) for k in _FLAGS}


def _component_names(given: dict[str, str | None], resume_from: str | None) -> dict[str, str | None]:
    """The ``--reward`` / ``--group-filter`` names a run uses: ``given``, or on ``--resume`` the
    run folder's recorded ones, which a different name given cannot replace."""
    recorded = _recorded_components(Path(resume_from)) if resume_from is not None else None
    if recorded is None:
        return dict(given)
    names = dict(recorded)
    for kind, name in given.items():
        if name is not None and name != recorded[kind]:
            was = f"{_FLAGS[kind]} {recorded[kind]!r}" if recorded[kind] is not None else f"no {_FLAGS[kind]}"
            fail(f"{_FLAGS[kind]} {name!r}: the run in {resume_from} was trained with {was} "
                 f"({COMPONENTS_FILE}); expected the same, or leave {_FLAGS[kind]} out to reuse it")
    return names


def _write_components(config: Any, names: dict[str, str | None]) -> None:
    import json

    folder = config.run_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / COMPONENTS_FILE).write_text(json.dumps(names, indent=2) + "\n", encoding="utf-8")


def _component(kind: Any, name: str | None) -> Any:
    if name is None:
        return None
    from agentrl.environments.registry import RegistryError, resolve

    try:
        return resolve(kind, name, allow_import=True)
    except RegistryError as exc:
        fail(f"--{kind.replace('_', '-')}: {exc}")


def train(
    target: Annotated[Path, typer.Argument(metavar="CONFIG", help="A .toml/.yaml config (or a run folder with --resume).")],
    overrides: Annotated[list[str] | None, typer.Argument(metavar="[KEY=VALUE]...",
                                                          help="Overrides, e.g. train.steps=10.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run folder from its latest checkpoint.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check everything, print the plan, start nothing.")] = False,
    print_config: Annotated[bool, typer.Option("--print-config",
                                               help="Print the resolved config and each value's source.")] = False,
    no_ray: Annotated[bool, typer.Option("--no-ray", help="Run the rollout and trainer sides in this process.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Plain line logs instead of the live display.")] = False,
    reward: Annotated[str | None, typer.Option("--reward", help="A reward by name or module:attr (recorded in the "
                                               "run folder; --resume reuses it).")] = None,
    group_filter: Annotated[str | None, typer.Option("--group-filter", help="A group filter by name or module:attr "
                                                     "(recorded like --reward).")] = None,
) -> None:
    """Trains a policy as CONFIG describes (see the examples/ folder and docs/training.md).

    Overrides are KEY=VALUE with dotted keys typed by the config schema, e.g. train.steps=4,
    rollout.sampling.temperature=0.7, train.optimizer.betas=0.9,0.95, logging.run_dir=none.

    --reward and --group-filter are recorded in the run folder (components.json): --resume
    reuses them when left out and refuses different ones.

    \b
    Examples:
      agentrl train examples/tiny_cpu.toml --dry-run
      agentrl train examples/tiny_cpu.toml train.steps=2 logging.run_dir=runs/try1
      agentrl train examples/tiny_cpu.toml --print-config
      agentrl train runs/try1 --resume
    """
    from agentrl.cli.plan import preflight

    resolved = resolve_target(target, list(overrides or []), resume)
    config = resolved.config
    if print_config:
        typer.echo(resolved.format())
        if not dry_run:
            return
    for kind, name in (("reward", reward), ("group_filter", group_filter)):
        _component(kind, name)  # an unknown name is reported before the pre-flight
    plan = preflight(config)
    if plan.problems:
        fail(plan.problems[0] if len(plan.problems) == 1 else
             f"{len(plan.problems)} problems:\n" + "\n".join(f"  - {p}" for p in plan.problems))
    if plan.machine and not dry_run:
        fail("; ".join(plan.machine))
    resume_from = _check_resume(resolved) if resume else None
    done = _finished(Path(resume_from), config) if resume_from is not None else None
    if done is not None:  # nothing to do: say so at once, leave the run folder as it is
        typer.echo(done)
        return
    names = _component_names({"reward": reward, "group_filter": group_filter}, resume_from)
    reward_fn, filter_fn = _component("reward", names["reward"]), _component("group_filter", names["group_filter"])
    if dry_run:
        typer.echo(plan.format())
        if resume_from is not None:
            typer.echo(f"resume from  {resume_from}")
        if any(names.values()):
            typer.echo("components   " + ", ".join(f"{_FLAGS[k]} {v}" for k, v in names.items() if v is not None))
        typer.echo("dry run: nothing started")
        return
    _write_components(config, names)
    _run(config, plan.environment, reward_fn, filter_fn, use_ray=not no_ray, resume=resume_from, quiet=quiet)


def _run(config: Any, environment: Any, reward: Any, group_filter: Any, *, use_ray: bool, resume: str | None,
         quiet: bool) -> None:
    from agentrl.cli.progress import LiveProgress, progress_callbacks
    from agentrl.rollout.scheduler import RepeatedFailureError
    from agentrl.runner.api import run as run_training
    from agentrl.runner.checkpoint import CheckpointError, CheckpointWriteError
    from agentrl.runner.loop import NoTrainableGroupsError

    typer.echo(f"run folder {config.run_dir()}", err=True)
    callbacks = progress_callbacks(config.train.steps, config.run_dir(), quiet=quiet)
    try:
        summary = run_training(config, environment=environment, reward=reward, group_filter=group_filter,
                               use_ray=use_ray, resume=resume, callbacks=callbacks)
    except CheckpointError as exc:
        fail(f"--resume: {exc}")
    except CheckpointWriteError as exc:  # a full disk, say: the run stopped; its last checkpoint is intact
        typer.echo(f"error: {exc}\nthe run folder {config.run_dir()} can be resumed with --resume", err=True)
        raise typer.Exit(code=1) from None
    except (NoTrainableGroupsError, RepeatedFailureError) as exc:  # every group failed: why, not "data exhausted"
        typer.echo(f"error: {exc}\n(the run folder's summary.json has it too)", err=True)
        raise typer.Exit(code=1) from None
    except (KeyboardInterrupt, asyncio.CancelledError):  # SIGINT/SIGTERM cancel the run; everything it started is stopped
        typer.echo(f"interrupted; the run folder {config.run_dir()} can be resumed with --resume", err=True)
        raise typer.Exit(code=130) from None
    finally:
        for callback in callbacks:
            if isinstance(callback, LiveProgress):
                callback.close()  # the terminal is left clean when the run fails too
    typer.echo(f"done: {getattr(summary, 'steps', '?')} steps; run folder {config.run_dir()}")

