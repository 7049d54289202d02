"""Distillation teachers on a real CPU SGLang engine (the session's, serving the tiny Qwen3 in float32).

- Scoring by prefill through the engine (``/generate``, ``max_new_tokens = 0``, input-token logprobs
  from the first sampled token) equals the trainer-side forward of the same weights
  (:class:`~agentrl.train.TeacherModel`) within the engine-vs-trainer tolerance of float32 (mean
  |Δ| ≤ 1e-4, max ≤ 1e-3; see tests/integration/runner/test_runner_e2e.py for why), on multi-turn
  trajectories whose environment tokens are never scored; a second scoring (the prompts now in the
  engine's prefix cache) agrees as well.
- The endpoint check: the engine renders the probe conversation with the project's qwen3 template,
  so it passes for a qwen3 student and is refused, in one line, for a student rendering qwen3_5.
- Self-distillation end to end (``agentrl.run``, in-process trainer, the engine through
  ``rollout.engines.urls``): the run's own engine scores every sampled token after a privileged
  prefix, and each step reports the distillation figures.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from agentrl.chat import ChatTemplate
from agentrl.episode import Episode
from agentrl.rollout import ClientConfig, InferenceClient
from agentrl.rollout.teacher import EngineTeacher, score_episodes
from agentrl.runner.teacher_check import endpoint_difference
from agentrl.testing import build_tiny_model, build_tokenizer
from agentrl.token_data import TEACHER_LOGPROBS
from agentrl.train import TeacherModel, TorchBackendConfig
from agentrl.trajectory import SegmentKind, Status, Trajectory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

MEAN_BOUND, MAX_BOUND = 1e-4, 1e-3


def _episodes(n: int, seed: int) -> list[Episode]:
    """Multi-turn trajectories over the tiny vocabulary: a rendered opening (shared by all: a prefix the
    engine caches), then model / tool / model turns of random ids."""
    tok = build_tokenizer()
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    rng = random.Random(seed)
    ordinary = [i for i in range(len(tok)) if i not in set(tok.all_special_ids)]
    out = []
    for k in range(n):
        opening = template.encode([{"role": "system", "content": "Use the calculator."},
                                   {"role": "user", "content": f"What is {k} * {k + 7}?"}],
                                  add_generation_prompt=True)
        traj = Trajectory.from_prompt(opening, rollout_id=f"r{k}", group_id="g")
        for turn in range(3):
            m = rng.randint(3, 30)
            traj.append_model([rng.choice(ordinary) for _ in range(m)], [-1.0] * m)
            if turn < 2:
                traj.append_env([rng.choice(ordinary) for _ in range(rng.randint(2, 12))], kind="tool")
        traj.finish(Status.COMPLETED)
        out.append(Episode(sequences=[traj]))
    return out


def _sampled(episodes: list[Episode]) -> list[float]:
    return [float(t.channels[TEACHER_LOGPROBS].values[p]) for ep in episodes for t in ep.sequences
            for s in t.segments_of(SegmentKind.MODEL) for p in range(s.start, s.end)]


async def test_engine_scoring_equals_the_trainer_side_forward(tiny_engine: str) -> None:
    trainer = TeacherModel.from_pretrained(build_tiny_model(), TorchBackendConfig(device="cpu", dtype="float32"))
    on_trainer, on_engine, again = _episodes(12, seed=0), _episodes(12, seed=0), _episodes(12, seed=0)

    async def trainer_side(sequences: list[list[int]], _firsts: list[int]) -> list[list[float]]:
        return trainer.score(sequences)

    await score_episodes(on_trainer, trainer_side)
    async with InferenceClient(ClientConfig(base_url=tiny_engine)) as client:
        teacher = EngineTeacher([client])
        figures = await score_episodes(on_engine, teacher.score)
        await score_episodes(again, teacher.score)
    for episodes in (on_trainer, on_engine):  # environment tokens are never scored as the student's
        for traj in (t for ep in episodes for t in ep.sequences):
            present = traj.channels[TEACHER_LOGPROBS].present
            sampled = {p for s in traj.segments_of(SegmentKind.MODEL) for p in range(s.start, s.end)}
            assert {i for i, flag in enumerate(present) if flag} == sampled
    ref = _sampled(on_trainer)
    for scored in (_sampled(on_engine), _sampled(again)):
        diffs = [abs(a - b) for a, b in zip(scored, ref, strict=True)]
        mean, worst = sum(diffs) / len(diffs), max(diffs)
        print(f"engine vs trainer over {len(diffs)} sampled tokens: mean |d| {mean:.2e}, max {worst:.2e}")
        assert mean <= MEAN_BOUND and worst <= MAX_BOUND
    assert figures["teacher/sequences"] == 12 and all(math.isfinite(x) and x <= 0 for x in ref)


def test_the_endpoint_check_passes_the_same_template_and_refuses_another(tiny_engine: str) -> None:
    tok = build_tokenizer()
    assert endpoint_difference(tiny_engine, ChatTemplate.from_name("qwen3", tokenizer=tok)) is None
    why = endpoint_difference(tiny_engine, ChatTemplate.from_name("qwen3_5", tokenizer=tok))
    assert why is not None and why.startswith("its chat template differs from the student's: the probe conversation")
    assert "\n" not in why


class _OnTheSessionEngine:
    """An engine starter that, instead of starting a process, hands back the session's engine: the
    teacher engine the run asked for is real, only not a new process (a second engine would need a core
    of its own); records the config it was asked to start."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.configs: list[object] = []
        self.stopped = 0

    async def start(self, config: object, port: int | None) -> tuple[str, object]:
        self.configs.append(config)
        starter = self

        class Process:
            pid = 0

            def alive(self) -> bool:
                return True

            def returncode(self) -> int | None:
                return None

            def stop(self) -> None:
                starter.stopped += 1

        return self.url, Process()


async def test_a_teacher_on_engines_of_its_own_scores_each_step(tmp_path: Path, tiny_engine: str) -> None:
    from agentrl.environments import make_arithmetic_rows
    from agentrl.runner import RunConfig
    from agentrl.runner.envs import environment_factory
    from agentrl.runner.rollout_service import RolloutService

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(8, seed=0)))
    teacher_path = str(build_tiny_model())
    config = RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data)}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {"engines": {"urls": [tiny_engine], "context_length": 1024, "max_total_tokens": 8192},
                    "sampling": {"max_new_tokens": 24}, "scheduler": {"groups_per_step": 2, "group_size": 2}},
        "train": {"steps": 1},
        "teacher": {"kind": "engines", "path": teacher_path, "engines": {"count": 1, "max_total_tokens": 4096}},
        "logging": {"run_dir": str(tmp_path / "run")},
    })
    starter = _OnTheSessionEngine(tiny_engine)
    service = await RolloutService.launch(config, environment_factory(config), teacher_starters=[starter])
    try:
        batch = await service.collect()
    finally:
        await service.shutdown()
    assert starter.stopped == 1                                         # the service stops what it started
    asked = starter.configs[0]
    assert asked.model_path == teacher_path and asked.max_total_tokens == 4096  # type: ignore[attr-defined]
    assert str(asked.log_dir).endswith("logs/teacher-0")  # type: ignore[attr-defined]
    assert batch.report.metrics["teacher/sequences"] == 4
    trainer = TeacherModel.from_pretrained(teacher_path, TorchBackendConfig(device="cpu", dtype="float32"))
    for traj in (t for ep in batch.episodes() for t in ep.sequences):
        expected = trainer.score([traj.tokens])[0]
        for seg in traj.segments_of(SegmentKind.MODEL):
            got = traj.channels[TEACHER_LOGPROBS].values[seg.start:seg.end].tolist()
            assert got == pytest.approx(expected[seg.start:seg.end], abs=1e-3)


@pytest.mark.slow
def test_self_distillation_runs_on_the_runs_own_engine(tmp_path: Path, tiny_engine: str) -> None:
    """Last in the module: its two steps load the student's new weights into the session's engine."""
    import agentrl
    from agentrl.environments import make_arithmetic_rows
    from agentrl.runner import RunConfig
    from agentrl.runner.rundir import RunDirectory

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(8, seed=0)))
    config = RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data)}},
        "environment": {"name": "toy_arithmetic"},
        "rollout": {"engines": {"urls": [tiny_engine], "context_length": 1024, "max_total_tokens": 8192},
                    "sampling": {"max_new_tokens": 24}, "scheduler": {"groups_per_step": 2, "group_size": 2}},
        "train": {"steps": 2, "optimizer": {"lr": 1e-3}, "max_tokens_per_micro_batch": 2048},
        "teacher": {"kind": "self", "privileged": "The answer is {answer}.", "task_reward": True},
        "logging": {"run_dir": str(tmp_path / "run")},
        "checkpoint": {"save_final": False},
    })
    summary = agentrl.run(config, use_ray=False)
    assert summary.steps == 2
    run_dir = RunDirectory(tmp_path / "run", config_hash=config.hash())
    for line in run_dir.read_metrics():
        if line.get("initial") or line.get("final"):
            continue
        assert line["teacher/sequences"] == 4 and line["distill/tokens"] > 0
        assert math.isfinite(line["distill/reverse_kl"]) and 0 < line["distill/teacher_share"] <= 1
    for ep in run_dir.read_trajectories(1):
        for traj in ep.sequences:
            sampled = sum(s.length for s in traj.segments_of(SegmentKind.MODEL))
            assert traj.channels[TEACHER_LOGPROBS].num_present == sampled
