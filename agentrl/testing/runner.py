"""A whole training run on fakes, for tests of the runner: the deterministic fake engine
(:class:`~agentrl.testing.policy.FakePolicyClient`), ``ToyArithmeticEnv``, the real torch backend on
the tiny Qwen3 and real run folders and checkpoints.

The fake engine's answers depend only on the prompt, so a run is reproducible bit for bit; the
reward differs between the members of a group by their index, so advantages are not zero and the
weights move. ``python -m agentrl.testing.runner ROOT --steps N [--resume]`` runs one in a
subprocess (the kill-and-resume tests ``kill -9`` it); ``python -m agentrl.testing.runner --serve``
is a fork server for many such runs: it imports torch and agentrl once, then forks one child per
command line read on stdin (``OUT_FILE ARGS...``), printing ``pid PID`` when the child starts and
``exit PID STATUS`` when it ends, so each run starts in milliseconds instead of seconds.

Use in tests only.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import time
from pathlib import Path
from typing import Any

from agentrl.chat.template import ChatTemplate
from agentrl.data.source import DataSource
from agentrl.rollout.agent import AgentConfig
from agentrl.rollout.pacing import Pacer
from agentrl.rollout.scheduler import Scheduler
from agentrl.rollout.types import SamplingParams
from agentrl.testing.policy import FakePolicyClient, Policy, PolicyRequest

__all__ = ["FakeWeights", "build_fake_runner", "fake_run_config", "main", "trained_prompts"]

_QUESTION = re.compile(r"(\d+) \* (\d+)")


class FakeWeights:
    """The engines' weight loader for a fake engine: checks the exported folder (a model, or a LoRA
    run's adapter), then stamps the version on the fake engine's answers; keeps ``keep`` folders."""

    def __init__(self, root: Path, client: FakePolicyClient, *, keep: int = 1) -> None:
        self.root, self.client, self.keep = Path(root), client, keep
        self.loaded: list[int] = []
        self.inflight_at_load: list[int] = []

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    async def load(self, version: int, folder: Path) -> dict[str, float]:
        started = time.perf_counter()
        if not any((folder / name).is_file() for name in ("config.json", "adapter_config.json")):
            raise FileNotFoundError(f"weight sync v{version}: {str(folder)!r} holds no exported model")
        self.inflight_at_load.append(len(self.client.running))
        self.client.weight_version = str(version)
        self.loaded.append(version)
        for old in sorted(self.root.glob("v*"))[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return {"sync/load_s": time.perf_counter() - started, "sync/engines_updated": 1.0}


def trained_prompts(run_dir: Any) -> list[list[str]]:
    """Per step, the prompt ids a run folder's ``metrics.jsonl`` says were trained, in order."""
    return [line["prompt_ids"] for line in run_dir.read_metrics() if "prompt_ids" in line]


def arithmetic_answer(req: PolicyRequest) -> str:
    """Calls the calculator on the question, then answers with its result."""
    text = req.text
    a, b = (int(x) for x in _QUESTION.findall(text)[-1])
    if "<tool_response>" not in text:
        call = '{"name": "calculator", "arguments": {"expression": "%s"}}' % f"{a} * {b}"  # noqa: UP031
        return f"<tool_call>\n{call}\n</tool_call><|im_end|>"
    return f"The answer is \\boxed{{{a * b}}}.<|im_end|>"


def index_reward(trajectory: Any, task: Any) -> float:
    """1.0 for odd member indices, 0.0 for even ones: deterministic, never uniform in a group of 2+."""
    return float(int(str(trajectory.sample_id).rsplit(":", 1)[-1]) % 2)


def fake_run_config(root: Path, *, steps: int, mode: str = "sync", rows: int = 12, groups_per_step: int = 2,
                    group_size: int = 2, checkpoint_every: int | None = 1, partial_rollout: bool = False,
                    max_staleness: int | None = None, epochs: int | None = 1,
                    over_sampling: float = 0.0, lora: dict[str, Any] | None = None,
                    teacher: dict[str, Any] | None = None, scheduler_options: dict[str, Any] | None = None) -> Any:
    """A :class:`~agentrl.runner.RunConfig` for the tiny model and a JSONL of arithmetic rows under ``root``
    (``lora``: the ``train.lora`` section, trained at the same learning rate as the full model;
    ``teacher``: the ``teacher`` section; ``scheduler_options``: more ``rollout.scheduler`` settings)."""
    import orjson

    from agentrl.environments import make_arithmetic_rows
    from agentrl.runner.config import RunConfig
    from agentrl.testing.tiny_model import build_tiny_model

    root.mkdir(parents=True, exist_ok=True)
    data = root / "train.jsonl"
    if not data.exists():
        data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in make_arithmetic_rows(rows, seed=0)))
    scheduler: dict[str, Any] = {"groups_per_step": groups_per_step, "group_size": group_size,
                                 "partial_rollout": partial_rollout, "max_staleness": max_staleness,
                                 "over_sampling": over_sampling, **(scheduler_options or {})}
    return RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data), "seed": 0, "epochs": epochs}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {"sampling": {"max_new_tokens": 64}, "scheduler": scheduler},
        "algorithm": {},
        "train": {"steps": steps, "optimizer": {"lr": 1e-3}, "max_tokens_per_micro_batch": 2048, "lora": lora},
        "logging": {"run_dir": str(root / "run")},
        "checkpoint": {"every_steps": checkpoint_every, "keep_last": 2},
        "mode": mode,
        "teacher": teacher,
    })


def build_fake_runner(config: Any, *, token_delay_s: float = 0.0, resume: str | None = None,
                      callbacks: Any = (), environment: Any = None, policy: Policy = arithmetic_answer,
                      reward: Any = index_reward, max_new_tokens: int = 64) -> tuple[Any, FakePolicyClient]:
    """The runner of ``config`` on the fake engine (in-process trainer); returns it and the engine.
    ``environment``: the environment class (``None``: ``ToyArithmeticEnv``); ``policy``: the fake
    engine's replies (default: the arithmetic one); ``reward``: a ``reward(trajectory, task)``
    replacing the environment's (default :func:`index_reward`; ``None``: the environment's own);
    ``max_new_tokens``: per turn."""
    from agentrl.environments import ToyArithmeticEnv
    from agentrl.runner.checkpoint import RunCheckpointer
    from agentrl.runner.envs import environment_factory
    from agentrl.runner.loop import LoopSettings, Runner
    from agentrl.runner.rollout_service import RolloutService
    from agentrl.runner.rundir import RunDirectory
    from agentrl.runner.sides import LocalTrainer
    from agentrl.runner.trainer import TrainService
    from agentrl.testing.tokenizer import build_tokenizer

    tok = build_tokenizer()
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    client = FakePolicyClient(tok, policy, token_delay_s=token_delay_s, logprob=-0.5)
    env_cls = environment if environment is not None else ToyArithmeticEnv
    factory = environment_factory(config, env_cls, reward=reward)
    data = DataSource(config.data.train, validate=env_cls.task_type.model_validate)
    agent = AgentConfig(sampling=SamplingParams(max_new_tokens=max_new_tokens))
    from agentrl.runner._launch import scheduler_config

    sched_cfg = scheduler_config(config)
    scheduler = Scheduler(factory, template, client, data, sched_cfg, agent=agent)
    # The pacer spreads CPU work by a time budget, so under CPU pressure it reorders episodes that
    # became ready together: with an unbounded budget it is first come, first served, and a run
    # depends on the fake engine's answers only (the bitwise resume tests need that).
    scheduler.pacer = Pacer(budget_s=1e9)
    run_dir = RunDirectory(config.run_dir(), config_hash=config.hash())
    run_dir.write_config(config.to_dict())
    weights = FakeWeights(run_dir.root / "weights", client)
    from agentrl.data.source import read_rows

    evals = {}
    for section in config.data.eval:
        good, _ = read_rows(section.to_config())
        evals[section.name] = ([row for _, row in good], section.to_eval_config(), section.every_steps,
                               section.at_start)
    rollout = RolloutService(scheduler, weights, eval_sets=evals)
    service = TrainService.from_config(config, threads=1)
    trainer = LocalTrainer(service)
    checkpointer = RunCheckpointer(run_dir.checkpoints_dir, keep_last=config.checkpoint.keep_last,
                                   config_hash=config.hash())
    warm = service.warmup(str(run_dir.root)) if config.warmup is not None and resume is None else None
    runner = Runner(rollout, trainer, LoopSettings.from_config(config), run_dir=run_dir,
                    checkpointer=checkpointer, resume=resume, callbacks=callbacks, warmup=warm)
    return runner, client


class _PrintPhases:
    """Prints ``phase NAME STEP`` as each named step starts (a kill test aims at them)."""

    def on_phase(self, phase: str, step: int) -> None:
        print(f"phase {phase} {step}", flush=True)

    def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
        print(f"step {step} done", flush=True)

    def on_run_end(self, summary: Any) -> None:
        pass


def serve() -> None:
    """The fork server (see the module doc). One child at a time; ends at end of input."""
    import os
    import sys

    # the expensive imports, done once (nothing runs threads yet, so forking stays safe)
    import torch  # noqa: F401
    import transformers.modeling_layers
    import transformers.models.auto.auto_factory
    import transformers.models.qwen3.modeling_qwen3  # noqa: F401

    import agentrl.environments
    import agentrl.runner.checkpoint
    import agentrl.runner.loop
    import agentrl.runner.trainer  # noqa: F401

    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        out, argv = parts[0], parts[1:]
        pid = os.fork()
        if pid == 0:  # the child: its output goes to OUT_FILE
            code = 1
            try:
                fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = os.fdopen(1, "w", buffering=1)
                sys.stderr = os.fdopen(2, "w", buffering=1)
                main(argv)
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {pid} {status}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a fake-engine training run (tests only)")
    parser.add_argument("root", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--mode", default="sync")
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--partial-rollout", action="store_true")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    config = fake_run_config(args.root, steps=args.steps, mode=args.mode, rows=args.rows, epochs=args.epochs,
                             partial_rollout=args.partial_rollout)
    from agentrl.runner.checkpoint import RunCheckpointer

    folder = config.run_dir() / "checkpoints"
    has_checkpoint = folder.is_dir() and RunCheckpointer(folder, keep_last=2, config_hash=config.hash()).latest() is not None
    resume = str(config.run_dir()) if args.resume and has_checkpoint else None
    if resume is None and config.run_dir().exists():  # killed before its first checkpoint: start over
        shutil.rmtree(config.run_dir())
    runner, _ = build_fake_runner(config, token_delay_s=args.token_delay, resume=resume, callbacks=[_PrintPhases()])

    async def go() -> None:
        summary = await runner.run()
        print(f"done steps={summary.steps} digest={await runner.trainer.digest()}", flush=True)

    asyncio.run(go())


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main()
