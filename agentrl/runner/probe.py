"""Engine-vs-trainer logprob checks: the post-sync probe and the mismatch statistics.

After a weight sync the engine and the trainer should score any sequence alike (up to numeric
precision). :class:`LogprobProbe` scores a few fixed sequences on both sides and stops the run
with :class:`ProbeError` when the mean |Δ| exceeds its bound; silent sync corruption (a stale tied
``lm_head``, a skipped or partial sync, a dtype mix-up) shows up here and nowhere else.

The engine side is ``client.generate(ids, SamplingParams(max_new_tokens=0), logprob_start_len=0)``:
SGLang then returns ``input_logprobs`` for every prompt position (the first is ``None``) and, with
``logprob_start_len=0``, reuses no cached prefix (``max_prefix_len`` is capped by it), so stale KV
cannot hide a change of weights. The trainer side is a callable returning, per sequence,
position-aligned logprobs (entry ``i`` scores token ``i`` given the tokens before it; entry 0 is
ignored), as :meth:`agentrl.train.TorchTrainBackend.compute_logprobs` does.

:func:`logprob_mismatch` is the pure statistic (mean, max and quantiles of |Δ|) that the runner also
uses for the engine-vs-trainer mismatch of trained tokens. :func:`probe_sequences` draws the fixed
probe sequences from a tokenizer's ordinary (non-special) tokens.

Example::

    probe = LogprobProbe(probe_sequences(tokenizer, n=4, length=64, seed=0), bound=1e-2, prompt_length=1)
    report = await probe.check(client, backend_scorer(backend), expected_version=str(step))
    metrics.update(report.to_metrics())
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
from collections.abc import Awaitable, Callable, Sequence, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from agentrl.rollout.types import GenerateResult, SamplingParams

if TYPE_CHECKING:
    from agentrl.runner._interfaces import RolloutSide, TrainSide
    from agentrl.train.base import LogprobScorer

__all__ = ["LogprobProbe", "ProbeError", "ProbeReport", "ScoringClient", "backend_scorer", "check_adapter",
           "compare_probe", "logprob_mismatch", "probe_sequences"]

QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
HINT = ("the engine does not serve the trainer's weights: a skipped or partial weight sync, a stale tied "
        "lm_head (embedding and output head exported out of step), or a dtype mismatch between engine and trainer")


class ProbeError(RuntimeError):
    """The post-sync probe found the engine's logprobs off the trainer's; ``report`` has the figures."""

    def __init__(self, message: str, report: ProbeReport | None = None) -> None:
        super().__init__(message)
        self.report = report


class ScoringClient(Protocol):
    """What the probe needs of an inference client (:class:`agentrl.rollout.InferenceClient` fits)."""

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *,
                       logprob_start_len: int | None = None) -> GenerateResult: ...


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = q * (len(sorted_values) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def logprob_mismatch(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """|a - b| statistics over aligned tokens: ``mean``, ``max``, ``p50``, ``p90``, ``p99`` and ``n``.

    With no tokens every statistic is NaN and ``n`` is 0 (nothing was compared, which is not a match).
    """
    if len(a) != len(b):
        raise ValueError(f"logprob_mismatch: a has {len(a)} values, b has {len(b)}; expected aligned sequences")
    diffs = sorted(abs(float(x) - float(y)) for x, y in zip(a, b, strict=True))
    if not diffs:
        return {"mean": math.nan, "max": math.nan, **{name: math.nan for name, _ in QUANTILES}, "n": 0.0}
    out = {"mean": math.fsum(diffs) / len(diffs), "max": diffs[-1]}
    out.update({name: _quantile(diffs, q) for name, q in QUANTILES})
    out["n"] = float(len(diffs))
    return out


def probe_sequences(tokenizer: Sized, n: int, length: int, seed: int) -> list[list[int]]:
    """``n`` sequences of ``length`` token ids drawn (seeded) from the tokenizer's ordinary tokens.

    Special and added tokens (chat markers, tool tags) are left out so that the sequences exercise
    the ordinary embedding rows; the same arguments always give the same sequences."""
    for name, value, low in (("n", n, 1), ("length", length, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"probe_sequences({name}={value!r}): expected an int >= {low}")
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "get_added_vocab", None)
    if callable(added):
        special.update(int(i) for i in added().values())
    pool = [i for i in range(len(tokenizer)) if i not in special]
    if not pool:
        raise ValueError("probe_sequences(tokenizer=...): the tokenizer has no ordinary tokens to draw from")
    rng = random.Random(seed)
    return [[rng.choice(pool) for _ in range(length)] for _ in range(n)]


@dataclass(frozen=True)
class ProbeReport:
    """The probe's figures over all compared tokens, and each sequence's mean |Δ|."""

    mean: float
    max: float
    p50: float
    p90: float
    p99: float
    n: int
    bound: float
    per_sequence: tuple[float, ...]
    engine_version: str | None

    @property
    def passed(self) -> bool:
        return self.mean <= self.bound

    def to_metrics(self) -> dict[str, float]:
        """Step metrics under ``probe/``."""
        return {"probe/mean_abs_diff": self.mean, "probe/max_abs_diff": self.max, "probe/p50_abs_diff": self.p50,
                "probe/p90_abs_diff": self.p90, "probe/p99_abs_diff": self.p99, "probe/tokens": float(self.n)}

    def describe(self) -> str:
        return (f"mean |Δ| {self.mean:.3g} (bound {self.bound:g}), max {self.max:.3g}, p50 {self.p50:.3g}, "
                f"p90 {self.p90:.3g}, p99 {self.p99:.3g} over {self.n} tokens of {len(self.per_sequence)} "
                f"sequences (engine weight_version {self.engine_version!r})")


TrainerScores = Callable[[list[list[int]]], "list[list[float]] | Awaitable[list[list[float]]]"]
"""The trainer side: sequences in, position-aligned logprobs out (sync or async)."""


def backend_scorer(backend: LogprobScorer) -> Callable[[list[list[int]]], list[list[float]]]:
    """The trainer side for a :class:`~agentrl.train.TorchTrainBackend` (or anything with its
    ``compute_logprobs(TrainingBatch)``): each sequence scored as one untrained sequence."""
    from agentrl.train.batching import TrainingBatch, TrainSequence

    def score(sequences: list[list[int]]) -> list[list[float]]:
        zeros = [[0.0] * len(s) for s in sequences]
        batch = TrainingBatch.from_sequences([
            TrainSequence(tokens=list(s), loss_mask=[0] * len(s), rollout_logprobs=z, advantages=z,
                          rollout_id=f"probe-{i}", group_id="probe", reward=0.0, denominator=1.0)
            for i, (s, z) in enumerate(zip(sequences, zeros, strict=True))])
        return [list(row) for row in backend.compute_logprobs(batch)]

    return score


class LogprobProbe:
    """Fixed sequences scored by an engine and by the trainer; see the module docstring.

    ``prompt_length`` (one for all, or one per sequence, >= 1) is where comparison starts: token
    positions ``prompt_length .. len-1`` are compared (position 0 has no logprob)."""

    def __init__(self, sequences: Sequence[Sequence[int]], *, bound: float, prompt_length: int | Sequence[int]) -> None:
        self.sequences = [list(map(int, s)) for s in sequences]
        if not self.sequences:
            raise ValueError("LogprobProbe(sequences=[]): expected at least one sequence")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0 or math.isinf(bound):
            raise ValueError(f"LogprobProbe(bound={bound!r}): expected a finite number > 0")
        self.bound = float(bound)
        lengths = ([prompt_length] * len(self.sequences) if isinstance(prompt_length, int)
                   else list(prompt_length))
        if len(lengths) != len(self.sequences):
            raise ValueError(f"LogprobProbe(prompt_length=...): {len(lengths)} values for {len(self.sequences)} "
                             "sequences; expected one int, or one per sequence")
        for i, (p, seq) in enumerate(zip(lengths, self.sequences, strict=True)):
            if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p < len(seq):
                raise ValueError(f"LogprobProbe(prompt_length[{i}]={p!r}): expected an int in [1, {len(seq) - 1}] "
                                 f"for a sequence of {len(seq)} tokens (at least one token to compare)")
        self.prompt_lengths = lengths

    async def engine_logprobs(self, client: ScoringClient) -> tuple[list[list[float]], str | None]:
        """Per sequence, the engine's logprobs of the compared positions; and the weight version it answered with."""
        results = await asyncio.gather(*(client.generate(s, SamplingParams(max_new_tokens=0), logprob_start_len=0)
                                         for s in self.sequences))
        out: list[list[float]] = []
        for i, (seq, start, res) in enumerate(zip(self.sequences, self.prompt_lengths, results, strict=True)):
            lps = res.input_logprobs
            if len(lps) != len(seq) or any(v is None for v in lps[start:]):
                raise ProbeError(f"probe sequence {i}: the engine returned {len(lps)} input logprobs for "
                                 f"{len(seq)} tokens (expected one per token, from logprob_start_len=0)")
            wrong = res.first_misscored(seq)
            if wrong is not None:
                raise ProbeError(f"probe sequence {i}: the engine scored other token ids than were sent (position "
                                 f"{wrong}: {res.input_ids_scored[wrong] if wrong < len(res.input_ids_scored) else None}"
                                 f" for {seq[wrong] if wrong < len(seq) else None})")
            out.append([float(v) for v in lps[start:] if v is not None])
        versions = {r.weight_version for r in results}
        return out, (results[0].weight_version if len(versions) == 1 else ",".join(sorted(map(str, versions))))

    async def trainer_logprobs(self, score_trainer: TrainerScores) -> list[list[float]]:
        scored = score_trainer([list(s) for s in self.sequences])
        rows = await scored if inspect.isawaitable(scored) else scored
        if len(rows) != len(self.sequences):
            raise ProbeError(f"score_trainer returned {len(rows)} rows for {len(self.sequences)} sequences")
        out: list[list[float]] = []
        for i, (row, seq, start) in enumerate(zip(rows, self.sequences, self.prompt_lengths, strict=True)):
            if len(row) != len(seq):
                raise ProbeError(f"score_trainer row {i}: {len(row)} logprobs for {len(seq)} tokens; expected "
                                 "position-aligned logprobs (entry i scores token i)")
            out.append([float(v) for v in row[start:]])
        return out

    async def check(self, client: ScoringClient, score_trainer: TrainerScores, *,
                    expected_version: str | None = None) -> ProbeReport:
        """Scores on both sides and compares; raises :class:`ProbeError` when ``mean > bound`` or when
        the engine answered from another weight version than ``expected_version``."""
        engine, version = await self.engine_logprobs(client)
        trainer = await self.trainer_logprobs(score_trainer)
        flat_e = [v for row in engine for v in row]
        flat_t = [v for row in trainer for v in row]
        stats = logprob_mismatch(flat_e, flat_t)
        report = ProbeReport(mean=stats["mean"], max=stats["max"], p50=stats["p50"], p90=stats["p90"],
                             p99=stats["p99"], n=int(stats["n"]), bound=self.bound, engine_version=version,
                             per_sequence=tuple(logprob_mismatch(e, t)["mean"] for e, t in zip(engine, trainer,
                                                                                               strict=True)))
        if expected_version is not None and version != str(expected_version):
            raise ProbeError(f"logprob probe: the engine scored with weight_version {version!r}, expected "
                             f"{expected_version!r} (the sync did not reach it); {report.describe()}", report)
        if not report.passed or math.isnan(report.mean):
            raise ProbeError(f"logprob probe failed: {report.describe()}; likely cause: {HINT}", report)
        return report


def _mean_abs(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    """Mean |a - b| over aligned rows, position 0 (no logprob) left out."""
    diffs = [abs(float(x) - float(y)) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra[1:], rb[1:], strict=True)]
    return math.fsum(diffs) / len(diffs) if diffs else math.nan


async def check_adapter(rollout: RolloutSide, trainer: TrainSide, sequences: list[list[int]], *, folder: str, bound: float,
                        seed: int) -> dict[str, float]:
    """A LoRA run's start-up check that the engines *apply* an adapter the way the trainer does.

    The trainer writes a probe adapter of fixed random weights (B ≠ 0: a fresh peft adapter has B = 0,
    where an adapter that is never applied looks exactly like one that is) and scores ``sequences``
    with it and without it (``trainer.probe_adapter``); every engine loads it, scores them through it
    and unloads it (``rollout.score_adapter``). Each engine must be within ``bound`` (mean |Δ|) of the
    trainer with the adapter, and so away from the base. Raises :class:`ProbeError` naming the engine
    and what it serves instead; returns ``lora/*`` metrics."""
    sides = await trainer.probe_adapter(folder, sequences, seed)
    adapter, base = sides["adapter"], sides["base"]
    effect = _mean_abs(adapter, base)
    if not effect > 4 * bound:
        raise ProbeError(f"LoRA check at start: the probe adapter moves the trainer's logprobs by only {effect:.3g} "
                         f"(mean |Δ|), too little to tell against sync.probe_bound={bound}; expected a larger "
                         "train.lora.rank or alpha, or a smaller probe_bound")
    worst, closest = 0.0, math.inf
    for url, rows in (await rollout.score_adapter(folder, sequences)).items():
        through, off_base = _mean_abs(rows, adapter), _mean_abs(rows, base)
        worst, closest = max(worst, through), min(closest, off_base)
        if not through <= bound:
            why = ("its logprobs through the adapter are the base model's: the engine does not apply the adapter "
                   "(an adapter that is never loaded, loaded as zeros, or requests that do not name it)"
                   if off_base <= bound else
                   "it applies another adapter than the trainer's (tensor names, scaling alpha/r or target modules "
                   "differ between trainer and engine)")
            raise ProbeError(f"LoRA check at start on engine {url}: mean |engine through the probe adapter - trainer "
                             f"with it| = {through:.3g} (bound {bound}), |engine - base model| = {off_base:.3g}, while "
                             f"the adapter moves the trainer by {effect:.3g}: {why}")
    return {"lora/check_abs_diff": worst, "lora/check_base_abs_diff": closest, "lora/check_adapter_effect": effect}


def compare_probe(engine: Sequence[Sequence[float]], trainer: Sequence[Sequence[float]], *, bound: float,
                  version: int) -> dict[str, float]:
    """The runner's post-sync probe: ``probe/*`` metrics of the engine's and the trainer's logprobs of
    the probe sequences (position 0 left out); :class:`ProbeError` when the mean |Δ| exceeds ``bound``."""
    diffs = [abs(a - b) for e, t in zip(engine, trainer, strict=True) for a, b in zip(e[1:], t[1:], strict=True)]
    mean = sum(diffs) / max(len(diffs), 1)
    worst = max(diffs, default=0.0)
    if mean > bound or not math.isfinite(mean):
        raise ProbeError(
            f"post-sync probe after weight version {version}: mean |engine - trainer| logprob = {mean:.4g} "
            f"(max {worst:.4g}) over {len(diffs)} tokens exceeds the bound {bound}; the engines do not serve the "
            "trainer's weights (a skipped or partial sync, a stale tied lm_head, a dtype mismatch; with LoRA, an "
            "adapter that was not loaded or requests that do not name it)")
    return {"probe/mean_abs_diff": mean, "probe/max_abs_diff": worst, "probe/tokens": float(len(diffs))}
