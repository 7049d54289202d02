"""The logprob probe and mismatch statistics, with a scripted scoring client (no engine)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from agentrl.rollout.types import FinishKind, FinishReason, GenerateResult, SamplingParams
from agentrl.runner.probe import LogprobProbe, ProbeError, logprob_mismatch, probe_sequences


def true_logprob(prev: int, tok: int) -> float:
    """A stand-in model: the logprob of ``tok`` after ``prev``."""
    return -((prev * 31 + tok * 17) % 97) / 10.0


class ScriptedScorer:
    """Answers prompt-scoring requests the way SGLang does (first entry ``None``), with ``shift``
    added to every logprob (a model that differs from the trainer's)."""

    def __init__(self, shift: float = 0.0, version: str = "3", short: bool = False) -> None:
        self.shift, self.version, self.short = shift, version, short
        self.calls: list[tuple[list[int], int, int | None]] = []

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       logprob_start_len: int | None = None) -> GenerateResult:
        ids = list(input_ids)
        self.calls.append((ids, sampling.max_new_tokens, logprob_start_len))
        lps: list[float | None] = [None] + [true_logprob(a, b) + self.shift for a, b in itertools.pairwise(ids)]
        if self.short:
            lps = lps[:-1]
        return GenerateResult(rid="r", output_ids=(), output_logprobs=(), finish_reason=FinishReason(FinishKind.LENGTH),
                              weight_version=self.version, prompt_tokens=len(ids), cached_tokens=0,
                              completion_tokens=0, input_logprobs=tuple(lps), input_ids_scored=tuple(ids))


def trainer(noise: float = 0.0, seed: int = 0) -> Any:
    rng = random.Random(seed)

    def score(seqs: list[list[int]]) -> list[list[float]]:
        return [[0.0] + [true_logprob(a, b) + rng.uniform(-noise, noise) for a, b in itertools.pairwise(s)] for s in seqs]

    return score


def test_mismatch_statistics_match_numpy() -> None:
    rng = random.Random(1)
    a = [rng.uniform(-5, 0) for _ in range(257)]
    b = [x + rng.gauss(0, 0.1) for x in a]
    stats = logprob_mismatch(a, b)
    d = np.abs(np.array(a) - np.array(b))
    assert stats["n"] == 257 and stats["mean"] == pytest.approx(d.mean()) and stats["max"] == d.max()
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert stats[name] == pytest.approx(np.percentile(d, q))


def test_mismatch_of_nothing_is_nan_and_lengths_must_agree() -> None:
    empty = logprob_mismatch([], [])
    assert empty["n"] == 0 and all(math.isnan(v) for k, v in empty.items() if k != "n")
    with pytest.raises(ValueError, match="a has 2 values, b has 1"):
        logprob_mismatch([0.0, 1.0], [0.0])


def test_probe_sequences_are_fixed_seeded_and_ordinary(tok: Any) -> None:
    seqs = probe_sequences(tok, n=3, length=20, seed=7)
    assert seqs == probe_sequences(tok, n=3, length=20, seed=7) != probe_sequences(tok, n=3, length=20, seed=8)
    assert [len(s) for s in seqs] == [20, 20, 20]
    special = set(tok.all_special_ids) | set(tok.get_added_vocab().values())
    assert not special & {t for s in seqs for t in s} and all(0 <= t < len(tok) for s in seqs for t in s)
    with pytest.raises(ValueError, match=r"probe_sequences\(length=1\): expected an int >= 2"):
        probe_sequences(tok, n=1, length=1, seed=0)


async def test_probe_passes_within_the_bound_and_reports_figures() -> None:
    seqs = [[3, 9, 4, 1, 7, 2], [5, 5, 8, 0, 6]]
    client = ScriptedScorer()
    probe = LogprobProbe(seqs, bound=0.01, prompt_length=[2, 1])
    report = await probe.check(client, trainer(noise=0.004), expected_version="3")
    assert report.passed and report.n == (6 - 2) + (5 - 1) and 0 < report.mean <= 0.004 and report.max <= 0.004
    assert report.p50 <= report.p90 <= report.p99 <= report.max and len(report.per_sequence) == 2
    assert [c[1:] for c in client.calls] == [(0, 0), (0, 0)]  # pure scoring, every position
    assert set(report.to_metrics()) == {"probe/mean_abs_diff", "probe/max_abs_diff", "probe/p50_abs_diff",
                                        "probe/p90_abs_diff", "probe/p99_abs_diff", "probe/tokens"}


async def test_probe_fails_when_the_engine_serves_other_weights() -> None:
    probe = LogprobProbe([[3, 9, 4, 1, 7, 2]], bound=0.01, prompt_length=1)
    with pytest.raises(ProbeError, match=r"mean \|Δ\| 0\.5 \(bound 0\.01\).*skipped or partial weight sync.*tied") as info:
        await probe.check(ScriptedScorer(shift=0.5), trainer())
    assert info.value.report is not None and info.value.report.mean == pytest.approx(0.5)


async def test_probe_fails_on_another_engine_weight_version() -> None:
    probe = LogprobProbe([[3, 9, 4]], bound=0.01, prompt_length=1)
    with pytest.raises(ProbeError, match="scored with weight_version '2', expected '3'"):
        await probe.check(ScriptedScorer(version="2"), trainer(), expected_version="3")


async def test_probe_accepts_an_async_trainer_and_checks_shapes() -> None:
    probe = LogprobProbe([[3, 9, 4]], bound=0.01, prompt_length=1)

    async def score(seqs: list[list[int]]) -> list[list[float]]:
        return trainer()(seqs)

    assert (await probe.check(ScriptedScorer(), score)).mean == 0.0
    with pytest.raises(ProbeError, match="2 logprobs for 3 tokens; expected position-aligned"):
        await probe.check(ScriptedScorer(), lambda seqs: [row[1:] for row in trainer()(seqs)])
    with pytest.raises(ProbeError, match="returned 2 input logprobs for 3 tokens"):
        await probe.check(ScriptedScorer(short=True), trainer())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sequences": [], "bound": 0.1, "prompt_length": 1}, r"sequences=\[\]\): expected at least one"),
    ({"sequences": [[1, 2]], "bound": 0.0, "prompt_length": 1}, r"bound=0\.0\): expected a finite number > 0"),
    ({"sequences": [[1, 2]], "bound": 0.1, "prompt_length": 2}, r"prompt_length\[0\]=2\): expected an int in \[1, 1\]"),
    ({"sequences": [[1, 2], [1, 2]], "bound": 0.1, "prompt_length": [1]}, "1 values for 2 sequences"),
])
def test_probe_arguments_are_checked(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LogprobProbe(**kwargs)


def test_backend_scorer_gives_position_aligned_logprobs_of_the_trainer_model(tok: Any) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from agentrl.runner.probe import backend_scorer
    from agentrl.testing import TINY_MODEL_CONFIG
    from agentrl.train import TorchTrainBackend
    from agentrl.train.config import TorchBackendConfig

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=(len(tok) + 63) // 64 * 64, **TINY_MODEL_CONFIG))
    backend = TorchTrainBackend(model, TorchBackendConfig(device="cpu", dtype="float64"))
    seqs = probe_sequences(tok, n=2, length=9, seed=0)
    rows = backend_scorer(backend)(seqs)
    with torch.no_grad():
        logits = backend.model(torch.tensor(seqs)).logits.double()
    expected = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, torch.tensor(seqs)[:, 1:, None])[..., 0]
    assert [len(r) for r in rows] == [9, 9]
    assert np.allclose([r[1:] for r in rows], expected.numpy(), atol=1e-9)
