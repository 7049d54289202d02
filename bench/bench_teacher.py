"""What a distillation teacher costs per step, against the step's rollouts, on the CPU demo's shape.

One real CPU SGLang engine (pinned to its core by :func:`agentrl.runner.cpu.plan_cpu`, the trainer's
thread on the other) serves a model of the demo's shape (Qwen3, 4 layers, hidden 128, float32); the
:class:`~agentrl.rollout.Scheduler` collects ``--steps`` steps of 8 prompts × 8 samples of the toy
arithmetic task (64 new tokens per turn, the demo's settings). After each step every sampled token
is scored by a teacher of the same shape (other weights), two ways:

- ``trainer``: :class:`~agentrl.train.TeacherModel` on the trainer's thread (``teacher.kind = "model"``:
  packed rows, the shared prompt run once per micro-batch);
- ``engine``: :class:`~agentrl.rollout.teacher.EngineTeacher` by prefill on an SGLang engine (the same
  engine here, as a self-distillation teacher or an ``engines`` teacher colocated with it would).

The baseline is the rollout of the same step (``Scheduler.collect`` wall time). Target: each way of
scoring costs at most half the rollout (the teacher must not become the step's bottleneck).

    .venv/bin/python bench/bench_teacher.py [--steps 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.chat import ChatTemplate
from agentrl.data import DataConfig, DataSource
from agentrl.environments import ToyArithmeticEnv, make_arithmetic_rows
from agentrl.rollout import (
    AgentConfig,
    ClientConfig,
    EngineConfig,
    InferenceClient,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SGLangEngine,
)
from agentrl.rollout.teacher import EngineTeacher, score_episodes
from agentrl.runner.cpu import plan_cpu
from agentrl.testing import build_tiny_model, build_tokenizer
from agentrl.train import TeacherModel, TorchBackendConfig

DEMO_SHAPE: dict[str, Any] = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
TARGET_RATIO = 0.5


async def main(args: argparse.Namespace) -> dict[str, Any]:
    plan = plan_cpu(engines=1)
    plan.apply_trainer()
    student = build_tiny_model(seed=0, **DEMO_SHAPE)
    teacher_path = build_tiny_model(seed=1, **DEMO_SHAPE)
    tmp = Path(tempfile.mkdtemp(prefix="bench-teacher-"))
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(64 * args.steps, seed=0)))
    engine = await SGLangEngine.launch(EngineConfig(
        model_path=str(student), device=args.device, dtype="float32", context_length=1024, max_total_tokens=16384,
        random_seed=0, env=plan.engine_env(0), log_dir=tmp, extra_args=("--sleep-on-idle",)))
    try:
        if engine.process is not None:
            plan.pin(0, engine.process.pid)
        trainer_teacher = TeacherModel.from_pretrained(teacher_path, TorchBackendConfig(device=args.device))
        template = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
        async with InferenceClient(ClientConfig(base_url=engine.url)) as client:
            scheduler = Scheduler(ToyArithmeticEnv, template, client, DataSource(DataConfig(path=str(data), seed=0)),
                                  SchedulerConfig(groups_per_step=8, group_size=8),
                                  agent=AgentConfig(sampling=SamplingParams(max_new_tokens=64, temperature=1.0)))
            on_engine = EngineTeacher([client])
            rows: list[dict[str, float]] = []
            for step in range(args.steps + 1):  # step 0 warms the engine and the caches up, not counted
                started = time.perf_counter()
                batch = await scheduler.collect()
                rollout_s = time.perf_counter() - started
                episodes = batch.episodes()

                async def on_trainer(seqs: list[list[int]], _firsts: list[int]) -> list[list[float]]:
                    return await asyncio.to_thread(trainer_teacher.score, seqs)

                trained = await score_episodes(episodes, on_trainer)
                engined = await score_episodes(episodes, on_engine.score)
                sampled = sum(t.num_trainable_tokens for ep in episodes for t in ep.sequences)
                row = {"rollout_s": rollout_s, "trainer_s": trained["teacher/score_s"],
                       "engine_s": engined["teacher/score_s"], "tokens_read": trained["teacher/tokens"],
                       "sampled_tokens": float(sampled)}
                print(f"step {step}: rollout {rollout_s:.2f} s, teacher on the trainer {row['trainer_s']:.2f} s, "
                      f"by engine prefill {row['engine_s']:.2f} s ({int(row['tokens_read'])} tokens read, "
                      f"{sampled} sampled)", flush=True)
                if step:
                    rows.append(row)
            await scheduler.shutdown()
    finally:
        await asyncio.to_thread(engine.stop)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratios = {"trainer_over_rollout": med["trainer_s"] / med["rollout_s"],
              "engine_over_rollout": med["engine_s"] / med["rollout_s"]}
    met = {k: v <= TARGET_RATIO for k, v in ratios.items()}
    return {"figures": {k: round(v, 4) for k, v in med.items()} | {"steps": args.steps, "device": args.device},
            "baseline": {"rollout_s": round(med["rollout_s"], 4)},
            "ratios": {k: round(v, 4) for k, v in ratios.items()},
            "targets": {k: f"<= {TARGET_RATIO}" for k in ratios}, "met": met}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    result = asyncio.run(main(parser.parse_args()))
    print("RESULT " + json.dumps(result))
