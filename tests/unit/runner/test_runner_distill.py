"""Distillation through the training loop on the fake engine and the real torch backend: the teacher's
logprob of every sampled token reaches the trajectory's channel (and nothing else does), the advantages
are the teacher's, and each step reports the distillation figures. The teacher is the trainer's
(``teacher.kind = "model"``) or scored on the rollout side (an engine stand-in that scores by the same
tiny model; the real engine is tests/integration/runner/test_teacher_engine.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from agentrl.chat.template import ChatTemplate
from agentrl.rollout.teacher import EngineTeacher, RolloutTeacher, privileged_prefix
from agentrl.rollout.types import FinishReason, GenerateResult, SamplingParams
from agentrl.testing import build_tiny_model, build_tokenizer
from agentrl.testing.runner import build_fake_runner, fake_run_config
from agentrl.token_data import TEACHER_LOGPROBS
from agentrl.train import TeacherModel, TorchBackendConfig
from agentrl.trajectory import SegmentKind

pytestmark = [pytest.mark.timeout(300)]


def _teacher_folder() -> Path:
    return build_tiny_model(seed=1)  # another model than the student, same tokenizer and template


def _check_channels(runner: object, teacher: TeacherModel, steps: int, prefix: Sequence[int] = ()) -> None:
    run_dir = runner.run_dir  # type: ignore[attr-defined]
    for step in range(1, steps + 1):
        for episode in run_dir.read_trajectories(step):
            for traj in episode.sequences:
                channel = traj.channels[TEACHER_LOGPROBS]
                sampled = {p for s in traj.segments_of(SegmentKind.MODEL) for p in range(s.start, s.end)}
                assert {i for i, present in enumerate(channel.present) if present} == sampled  # no env token scored
                expected = teacher.score([[*prefix, *traj.tokens]])[0][len(prefix):]
                for pos in sampled:
                    assert float(channel.values[pos]) == pytest.approx(expected[pos], abs=2e-5)


@pytest.mark.parametrize("mode", ["sync", "one_step_off"])  # one step off: it scores while the next step generates
async def test_a_trainer_held_teacher_scores_every_sampled_token_and_sets_the_advantage(tmp_path: Path,
                                                                                       mode: str) -> None:
    config = fake_run_config(tmp_path, steps=2, checkpoint_every=None, mode=mode,
                             teacher={"kind": "model", "path": str(_teacher_folder()), "coef": 0.5})
    runner, _client = build_fake_runner(config)
    await runner.run()
    lines = runner.run_dir.read_metrics()
    teacher = TeacherModel.from_pretrained(_teacher_folder(), TorchBackendConfig(device="cpu"))
    _check_channels(runner, teacher, steps=2)
    for line in lines:
        assert line["distill/tokens"] > 0 and line["teacher/sequences"] == 4
        assert line["distill/teacher_share"] == 1.0          # task_reward=False: the teacher alone
        assert line["distill/student_logprob"] == pytest.approx(-0.5)   # the fake engine's sampling logprob
        assert line["distill/reverse_kl"] == pytest.approx(-0.5 - line["distill/teacher_logprob"])
        assert line["train/skipped"] == 0.0


class _ScoringEngine:
    """An engine stand-in that scores by prefill like SGLang (input logprobs from ``logprob_start_len``,
    the first one ``None``) with a :class:`TeacherModel`."""

    def __init__(self, model: TeacherModel) -> None:
        self.model = model
        self.starts: list[int] = []

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       logprob_start_len: int | None = None) -> GenerateResult:
        assert sampling.max_new_tokens == 0
        start = logprob_start_len or 0
        self.starts.append(start)
        row = self.model.score([list(input_ids)])[0]
        lps = (None, *row[start + 1:])
        return GenerateResult(rid="r", output_ids=(), output_logprobs=(), finish_reason=FinishReason.from_meta({"type": "length"}),
                              weight_version="0", prompt_tokens=len(input_ids), cached_tokens=0, completion_tokens=0,
                              input_logprobs=lps, input_ids_scored=tuple(input_ids[start:]))


@pytest.mark.parametrize("privileged", [None, "The answer is {answer}."])
async def test_a_rollout_side_teacher_scores_before_hand_over(tmp_path: Path, privileged: str | None) -> None:
    kind = {"kind": "self", "privileged": privileged} if privileged else {"kind": "endpoint",
                                                                           "urls": ["http://127.0.0.1:9"]}
    config = fake_run_config(tmp_path, steps=1, checkpoint_every=None, teacher={**kind, "task_reward": True})
    runner, _client = build_fake_runner(config)
    teacher = TeacherModel.from_pretrained(_teacher_folder(), TorchBackendConfig(device="cpu"))
    engine = _ScoringEngine(teacher)
    template = ChatTemplate.from_name("qwen3", tokenizer=build_tokenizer())
    runner.rollout.teacher = RolloutTeacher(EngineTeacher([engine]), template=template, privileged=privileged)
    await runner.run()
    episodes = runner.run_dir.read_trajectories(1)
    assert engine.starts and all(s > 0 for s in engine.starts)   # the prompt's logprobs are not asked for
    if privileged is None:
        _check_channels(runner, teacher, steps=1)
    else:
        for episode in episodes:  # each row's prefix: the answer of its own question
            question = episode.sequences[0].messages[1].content      # "What is A * B?"
            a, b = (int(x) for x in question.rstrip("?").split()[-3::2])
            prefix = privileged_prefix(template, f"The answer is {a * b}.")
            for traj in episode.sequences:
                expected = teacher.score([[*prefix, *traj.tokens]])[0][len(prefix):]
                for seg in traj.segments_of(SegmentKind.MODEL):
                    got = traj.channels[TEACHER_LOGPROBS].values[seg.start:seg.end]
                    assert got.tolist() == pytest.approx(expected[seg.start:seg.end], abs=2e-5)
    line = runner.run_dir.read_metrics()[-1]
    assert 0 < line["distill/teacher_share"] < 1.0          # task_reward=True: both terms
    assert line["teacher/sequences"] == 4 and line["teacher/score_s"] > 0


class _AnsweringEngine:
    """An engine stand-in whose scoring answer names the given ids (what SGLang says it scored)."""

    def __init__(self, scored: Sequence[int]) -> None:
        self.scored = tuple(scored)

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       logprob_start_len: int | None = None) -> GenerateResult:
        start = logprob_start_len or 0
        return GenerateResult(rid="r", output_ids=(), output_logprobs=(), finish_reason=FinishReason.from_meta({"type": "length"}),
                              weight_version="0", prompt_tokens=len(input_ids), cached_tokens=0, completion_tokens=0,
                              input_logprobs=(None, *[-1.0] * (len(input_ids) - start - 1)), input_ids_scored=self.scored)


async def test_an_engine_teacher_accepts_sglangs_clipped_last_row_and_refuses_other_ids() -> None:
    from agentrl.rollout.teacher import TeacherError

    tokens, first = [3, 4, 5, 1791, 6], 3  # the model sampled the last vocabulary row, 1791
    # SGLang names ids >= vocab_size - 1 as 0 in its answer
    scores = await EngineTeacher([_AnsweringEngine([5, 0, 6])]).score([tokens], [first])
    assert scores == [[0.0, 0.0, 0.0, -1.0, -1.0]]
    with pytest.raises(TeacherError, match=r"at position 4 of a 5-token sequence it names 7, the request held 6"):
        await EngineTeacher([_AnsweringEngine([5, 0, 7])]).score([tokens], [first])
