"""Prepares the CPU distillation experiment (docs/training.md "Distillation"): a teacher that solves the
demo's task and a much weaker student, both from one ``make demo`` run.

    make demo SEED=0
    python examples/distill_prepare.py --demo-run runs/demo-seed0-... --noise 0.4 --seed 1234
    agentrl train examples/distill_cpu.toml                               # (a) the teacher alone
    agentrl train examples/distill_cpu.toml teacher=none                  # (b) RL with the task reward
    agentrl train examples/distill_cpu.toml teacher.task_reward=true      # (c) both

- **Teacher** (``models/distill-teacher``): the demo run's last weights (after its 12 GRPO steps the
  demo's model answers every held-out question, greedy): the run folder's newest ``weights/v*``.
- **Student** (``models/distill-student``), one of two kinds:

  - ``--noise SIGMA`` (the measured comparison: 0.4, seed 1234): the teacher with Gaussian noise
    added to every weight, SIGMA times the RMS of its tensor. Its deficit is spread over every token
    it writes (the call, the copied digits, the answer): at 0.4 it still calls the tool (P(call)
    0.96) but predicts only 86% of the answer's tokens after a call, and writes a whole correct
    conversation with probability 4e-5, so the task reward almost never comes.
  - without ``--noise``: the demo's warmed-up model (``weights/v000000``: it copies digits and calls
    the calculator ~40% of the time) fine-tuned for a few steps on the warm-up's conversations with
    the tool called only ``--call-rate`` of the time. A direct answer trains its first token only
    (the decision not to call), not its guessed digits. The student keeps the format and most of the
    copying but almost never calls the tool: its deficit is that one token. Rounds of ``--steps``
    steps run until P(call) <= ``--call-prob`` (seed 0: 0.41 -> 0.020 -> 0.004 in 2-step rounds).
    The demo run must have kept version 0: run the demo's command with ``sync.keep_folders=20``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from agentrl.chat import ChatTemplate
from agentrl.sft import TranscriptBuilder, arithmetic_conversations
from agentrl.sft.trainer import sft_sequences
from agentrl.train import TeacherModel, TorchBackendConfig, TrainSequence


def _versions(run: Path) -> list[Path]:
    return sorted(p for p in (run / "weights").glob("v*") if (p / "config.json").is_file())


def call_probability(model: Path, questions: list[dict[str, str]], template: ChatTemplate) -> float:
    """The mean probability that ``model`` opens its answer with the tool call (greedy decoding calls the tool
    when it is above one half; T = 1 success is at most this)."""
    teacher = TeacherModel.from_pretrained(model, TorchBackendConfig(device="cpu"))
    sequences = []
    for call, direct in zip(arithmetic_conversations(questions, direct_rate=0.0),
                            arithmetic_conversations(questions, direct_rate=1.0), strict=True):
        a = template.encode(call["messages"], tools=call["tools"])
        b = template.encode(direct["messages"], tools=direct["tools"])
        first = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)  # <tool_call> vs <think>
        sequences.append(a[: first + 1])
    return sum(math.exp(row[-1]) for row in teacher.score(sequences)) / len(sequences)


def copy_accuracy(model: Path, questions: list[dict[str, str]], template: ChatTemplate) -> float:
    """The share of the answer's tokens after the first (the call) that ``model`` predicts with p >= 0.5 in
    conversations that call the tool: how well it copies the question into the call and the tool's result
    into the answer (the warm-up check's measure)."""
    scorer = TeacherModel.from_pretrained(model, TorchBackendConfig(device="cpu"))
    builder = TranscriptBuilder(template)
    sequences = [s for i, c in enumerate(arithmetic_conversations(questions, direct_rate=0.0))
                 for s in sft_sequences(builder.episode(c["messages"], tools=c["tools"]), f"q{i}")]
    hit = total = 0
    for seq, row in zip(sequences, scorer.score([s.tokens for s in sequences]), strict=True):
        trained = [p for p in range(1, len(seq.tokens)) if seq.loss_mask[p]][1:]  # the call-or-answer token aside
        hit += sum(row[p] >= math.log(0.5) for p in trained)
        total += len(trained)
    return hit / total


def reference_probability(model: Path, questions: list[dict[str, str]], template: ChatTemplate) -> float:
    """The mean probability that ``model``, sampling at T = 1, writes the reference conversation of a
    question token for token (the call, the copied digits, the answer): a lower bound of its T = 1 success."""
    scorer = TeacherModel.from_pretrained(model, TorchBackendConfig(device="cpu"))
    builder = TranscriptBuilder(template)
    sequences = [s for i, c in enumerate(arithmetic_conversations(questions, direct_rate=0.0))
                 for s in sft_sequences(builder.episode(c["messages"], tools=c["tools"]), f"q{i}")]
    per_question: dict[str, float] = {}
    for seq, row in zip(sequences, scorer.score([s.tokens for s in sequences]), strict=True):
        logprob = sum(row[p] for p in range(1, len(seq.tokens)) if seq.loss_mask[p])
        per_question[seq.rollout_id] = per_question.get(seq.rollout_id, 0.0) + logprob
    return sum(math.exp(v) for v in per_question.values()) / len(per_question)


def noised(teacher: Path, out: Path, *, sigma: float, seed: int) -> None:
    """Writes to ``out`` the teacher with Gaussian noise added to every weight, ``sigma`` times the RMS of
    its tensor (seeded): a student whose deficit is spread over every token it writes."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(teacher), dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            rms = param.pow(2).mean().sqrt()
            param.add_(torch.randn(param.shape, generator=generator) * sigma * rms)
    staged = out.with_name(out.name + "-next")
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(teacher, staged)  # tokenizer, template and config as the teacher's
    model.save_pretrained(staged)
    if out.exists():
        shutil.rmtree(out)
    staged.rename(out)


def _decision_only(seq: TrainSequence) -> TrainSequence:
    """``seq`` trained on its first assistant token alone: the call-or-answer decision."""
    first = seq.loss_mask.index(1)
    return dataclasses.replace(seq, loss_mask=[int(i == first) for i in range(len(seq.loss_mask))], denominator=1.0)


def fine_tune(start: Path, out: Path, conversations: list[dict[str, Any]], template: ChatTemplate, *, steps: int,
              lr: float, seed: int, batch_size: int = 32) -> float:
    """Fine-tunes ``start`` into ``out`` for ``steps`` steps on ``conversations`` (batches of ``batch_size``);
    returns the last step's loss. A conversation that calls the tool trains every assistant token; one that
    answers directly trains only its first token (the decision not to call), not its guessed digits."""
    from transformers import AutoTokenizer

    from agentrl.model_folder import model_vocab_size
    from agentrl.train import OptimizerConfig, PackingConfig, TorchTrainBackend, TrainingBatch

    builder = TranscriptBuilder(template)
    sequences = []
    for i, conv in enumerate(conversations):
        seqs = sft_sequences(builder.episode(conv["messages"], tools=conv["tools"]), f"c{i}")
        sequences.append(seqs if any("tool_calls" in m for m in conv["messages"]) else [_decision_only(s) for s in seqs])
    config = TorchBackendConfig(device="cpu", packing=PackingConfig(max_tokens=1536), seed=seed,
                                optimizer=OptimizerConfig(lr=lr, weight_decay=0.0, schedule="constant"))
    tokenizer = AutoTokenizer.from_pretrained(str(start))
    staged = out.with_name(out.name + "-next")  # ``start`` may be ``out``: written aside, then moved
    backend = TorchTrainBackend.from_pretrained(start, config, vocab_size=model_vocab_size(start))
    rng = random.Random(seed)
    loss = math.nan
    for _ in range(steps):
        picked = rng.sample(range(len(sequences)), min(batch_size, len(sequences)))
        loss = backend.sft_step(TrainingBatch.from_sequences([s for i in picked for s in sequences[i]]))["loss"]
    backend.export_hf(staged, tokenizer=tokenizer)
    if out.exists():
        shutil.rmtree(out)
    staged.rename(out)
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-run", type=Path, required=True, help="a demo run folder with weights/v000000")
    parser.add_argument("--data", type=Path, default=Path("data/demo"), help="the demo's data folder")
    parser.add_argument("--teacher", type=Path, default=Path("models/distill-teacher"))
    parser.add_argument("--student", type=Path, default=Path("models/distill-student"))
    parser.add_argument("--call-rate", type=float, default=0.01,
                        help="share of the fine-tuning conversations that call the tool")
    parser.add_argument("--call-prob", type=float, default=0.01,
                        help="fine-tune until the student's mean probability of calling the tool is at most this")
    parser.add_argument("--steps", type=int, default=2,
                        help="fine-tuning steps per round (P(call) is checked after each round)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=None, metavar="SIGMA",
                        help="build the student as the teacher plus Gaussian noise of SIGMA times each weight "
                             "tensor's RMS (seeded by --seed) instead of fine-tuning the warmed-up model; "
                             "the measured comparison used --noise 0.4 --seed 1234")
    args = parser.parse_args()
    versions = _versions(args.demo_run)
    if not versions:
        raise SystemExit(f"--demo-run {args.demo_run}: expected weights/v* folders (the run's weights)")
    if args.noise is None and (versions[0].name != "v000000" or len(versions) < 2):
        raise SystemExit(f"--demo-run {args.demo_run}: expected weights/v000000 (the warmed-up model) and a later "
                         f"version, found {[v.name for v in versions]}; run the demo with sync.keep_folders=20 "
                         "(or build a noised student: --noise)")
    template = ChatTemplate.from_name("qwen3", tokenizer=AutoTokenizer.from_pretrained(str(versions[0])))
    held_out = [json.loads(line) for line in (args.data / "held_out.jsonl").read_text().splitlines() if line.strip()]
    if args.teacher.exists():
        shutil.rmtree(args.teacher)
    shutil.copytree(versions[-1], args.teacher)
    for name, folder in (("teacher", args.teacher), ("warmed-up model", versions[0]))[: 1 if args.noise is not None else 2]:
        print(f"{name} {folder}: P(call) {call_probability(folder, held_out, template):.4f}, copy accuracy "
              f"{copy_accuracy(folder, held_out, template):.4f}")
    if args.noise is not None:
        noised(args.teacher, args.student, sigma=args.noise, seed=args.seed)
        print(f"student {args.student} (the teacher, noise {args.noise:g} x RMS): P(call) "
              f"{call_probability(args.student, held_out, template):.4f}, copy accuracy "
              f"{copy_accuracy(args.student, held_out, template):.4f}, P(reference) "
              f"{reference_probability(args.student, held_out, template):.5f}")
        return
    rows = [json.loads(line) for line in (args.data / "warmup.jsonl").read_text().splitlines() if line.strip()]
    questions = [{"question": next(m["content"] for m in r["messages"] if m["role"] == "user")} for r in rows]
    conversations = arithmetic_conversations(questions, direct_rate=1.0 - args.call_rate, seed=args.seed + 7)
    start = versions[0]
    for round_ in range(1, args.rounds + 1):
        loss = fine_tune(start, args.student, conversations, template, steps=args.steps, lr=args.lr,
                         seed=args.seed + round_)
        start = args.student
        prob = call_probability(args.student, held_out, template)
        print(f"round {round_}: {round_ * args.steps} SFT steps (tool called in {args.call_rate:.0%} of the "
              f"conversations), loss {loss:.4f}, P(call) {prob:.4f}")
        if prob <= args.call_prob:
            break
    print(f"student {args.student}: copy accuracy {copy_accuracy(args.student, held_out, template):.4f}")


if __name__ == "__main__":
    main()
