"""Supervised fine-tuning on conversations: JSONL → RL-identical token layout → packed NLL steps → a model folder.

:func:`run_sft` reads the config's conversations, lays each one out with :class:`TranscriptBuilder`
(the agent loop's tokens: only assistant tokens have loss mask 1, taken from the provenance
segments), and trains the torch backend's supervised objective
(:meth:`~agentrl.train.TorchTrainBackend.sft_step`: mean next-token NLL over the trained tokens of
a step, packed into token-budgeted micro-batches). It writes a Hugging Face folder (config,
safetensors, tokenizer) to ``config.output``, which :class:`~agentrl.rollout.SGLangEngine` and
``agentrl train`` load, with three files beside the weights: ``sft_config.json``,
``sft_metrics.jsonl`` (one line per logged step) and ``sft_summary.json``.

Steps: each epoch visits the conversations once in an order drawn from ``data.seed`` and the epoch
number; a step takes the next ``train.batch_size`` of them (the last step of an epoch may be
smaller). ``train.steps`` caps (or extends, with more epochs) the number of steps. The learning
rate follows ``train.optimizer``'s schedule (warm-up, constant or cosine).

Example::

    result = run_sft(SftConfig.from_dict(...))
    result.output, result.losses[0], result.losses[-1]
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.sft.config import SftConfig
from agentrl.sft.transcript import TranscriptBuilder, TranscriptError
from agentrl.train.batching import TrainingBatch, TrainSequence

if TYPE_CHECKING:
    from agentrl.episode import Episode
    from agentrl.train.base import TrainBackend

__all__ = ["SftDataError", "SftResult", "load_sft_sequences", "plan_batches", "run_sft", "sft_sequences"]

StepCallback = Callable[[int, dict[str, float]], None]


class SftDataError(ValueError):
    """A conversations file that cannot be trained on (the message names the file and line)."""


@dataclass
class SftResult:
    """What a run did: where the model is, per-step losses (mean NLL per trained token), counts, time."""

    output: Path
    steps: int
    losses: list[float] = field(default_factory=list)
    conversations: int = 0
    trained_tokens: int = 0
    seconds: float = 0.0


def sft_sequences(episode: Episode, rollout_id: str) -> list[TrainSequence]:
    """The training sequences of one laid-out episode: tokens and the provenance mask (prompt positions 0)."""
    out = []
    total = float(episode.num_trainable_tokens)
    for seq in episode.sequences:
        n = len(seq.tokens)
        out.append(TrainSequence(tokens=list(seq.tokens), loss_mask=[0] * seq.prompt_length + list(seq.loss_mask),
                                 rollout_logprobs=[0.0] * n, advantages=[0.0] * n, rollout_id=rollout_id,
                                 group_id=rollout_id, reward=0.0, denominator=total))
    return out


def _rows(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SftDataError(f"{path}:{lineno}: not a JSON object ({exc})") from None
    except OSError as exc:
        raise SftDataError(f"data.path={str(path)!r}: cannot read it ({exc.strerror or exc})") from None


def load_sft_sequences(path: str | Path, builder: TranscriptBuilder, *,
                       max_sequence_length: int | None = None) -> list[list[TrainSequence]]:
    """Per conversation (in file order), its training sequences. A bad line raises :class:`SftDataError`
    naming the file, the line and the problem."""
    source = Path(path)
    conversations: list[list[TrainSequence]] = []
    for lineno, row in _rows(source):
        where = f"{source}:{lineno}"
        if not isinstance(row, dict) or "messages" not in row:
            raise SftDataError(f"{where}: expected an object {{\"messages\": [...], \"tools\": [...]}}, got "
                               f"{json.dumps(row)[:80]}")
        extra = sorted(set(row) - {"messages", "tools", "id"})
        if extra:
            raise SftDataError(f"{where}: unknown keys {extra}; expected 'messages', 'tools' and optionally 'id'")
        try:
            episode = builder.episode(row["messages"], tools=row.get("tools"), rollout_id=f"line-{lineno}")
        except TranscriptError as exc:
            raise SftDataError(f"{where}: {exc}") from None
        for seq in episode.sequences:
            if max_sequence_length is not None and len(seq.tokens) > max_sequence_length:
                raise SftDataError(f"{where}: {len(seq.tokens)} tokens exceed data.max_sequence_length="
                                   f"{max_sequence_length}; shorten the conversation or raise the limit")
        conversations.append(sft_sequences(episode, f"line-{lineno}"))
    if not conversations:
        raise SftDataError(f"data.path={str(source)!r}: expected at least one conversation, found none")
    return conversations


def plan_steps(n: int, config: SftConfig) -> list[list[int]]:
    """Conversation indices of each step (see the module doc); a pure function of the config and ``n``."""
    t = config.train
    return plan_batches(n, batch_size=t.batch_size, steps=t.steps, epochs=t.epochs, shuffle=config.data.shuffle,
                        seed=config.data.seed)


def plan_batches(n: int, *, batch_size: int, steps: int | None, epochs: int = 1, shuffle: bool = True,
                 seed: int = 0) -> list[list[int]]:
    """``steps`` batches of ``batch_size`` indices of ``n`` items (``None``: ``epochs`` passes), each
    epoch in an order drawn from ``seed`` and the epoch (file order without ``shuffle``); the last
    batch of an epoch may be smaller."""
    per_epoch = -(-n // batch_size)
    total = steps if steps is not None else per_epoch * epochs
    batches: list[list[int]] = []
    epoch = 0
    while len(batches) < total:
        order = list(range(n))
        if shuffle:
            random.Random(f"{seed}:{epoch}").shuffle(order)
        for start in range(0, n, batch_size):
            if len(batches) == total:
                break
            batches.append(order[start:start + batch_size])
        epoch += 1
    return batches


def _prepare_output(config: SftConfig) -> Path:
    out = Path(config.output)
    if out.exists() and not out.is_dir():
        raise SftDataError(f"output={config.output!r}: exists and is not a folder; expected a folder to write to")
    if out.is_dir() and any(out.iterdir()):
        if not config.overwrite:
            raise SftDataError(f"output={config.output!r}: the folder is not empty; choose another or set "
                               "overwrite=true")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_sft(config: SftConfig, *, on_step: StepCallback | None = None) -> SftResult:
    """Runs the supervised fine-tuning ``config`` describes; returns its :class:`SftResult`.

    ``on_step(step, metrics)`` is called after every optimiser step (1-based ``step``). Raises
    :class:`SftDataError` for unusable data or output, :class:`~agentrl.model_folder.ModelFolderError`
    for an unusable model folder, before any training starts.
    """
    import torch
    from transformers import AutoTokenizer

    from agentrl.chat import ChatTemplate
    from agentrl.model_folder import check_model_folder, model_vocab_size
    from agentrl.train.torch_backend import TorchTrainBackend

    started = time.perf_counter()
    if config.train.threads is not None:
        torch.set_num_threads(config.train.threads)
    folder = check_model_folder(config.model.path, needs=("config", "weights"), what="model.path")
    tok_folder = check_model_folder(config.model.tokenizer, needs=("tokenizer",), what="model.tokenizer_path")
    tokenizer = AutoTokenizer.from_pretrained(str(tok_folder), local_files_only=True)
    template = ChatTemplate.from_name(config.model.template, tokenizer=tokenizer)
    vocab = model_vocab_size(folder)
    builder = TranscriptBuilder(template, template_kwargs=config.model.template_kwargs, vocab_size=vocab)
    conversations = load_sft_sequences(config.data.path, builder, max_sequence_length=config.data.max_sequence_length)
    budget = config.train.max_tokens_per_micro_batch
    for i, seqs in enumerate(conversations):
        for seq in seqs:
            if len(seq.tokens) - 1 > budget:
                raise SftDataError(f"{config.data.path}: conversation {i + 1} has {len(seq.tokens)} tokens; "
                                   f"train.max_tokens_per_micro_batch={budget} must hold {len(seq.tokens) - 1}")
    out = _prepare_output(config)
    (out / "sft_config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n", encoding="utf-8")
    backend = TorchTrainBackend.from_pretrained(folder, config.backend_config(), vocab_size=vocab)
    steps = plan_steps(len(conversations), config)
    result = _train(backend, conversations, steps, config, out, on_step)
    backend.export_hf(out, tokenizer=tokenizer)  # LoRA: the base with the adapter merged in
    if backend.adapter is not None:
        backend.export_adapter(out / "adapter")
    result.conversations, result.seconds = len(conversations), time.perf_counter() - started
    summary = {"steps": result.steps, "conversations": result.conversations, "trained_tokens": result.trained_tokens,
               "first_loss": result.losses[0], "last_loss": result.losses[-1], "seconds": round(result.seconds, 3)}
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return result


def _train(backend: TrainBackend, conversations: list[list[TrainSequence]], steps: list[list[int]], config: SftConfig,
           out: Path, on_step: StepCallback | None) -> SftResult:
    result = SftResult(output=out, steps=len(steps))
    optimizer = config.train.optimizer
    with (out / "sft_metrics.jsonl").open("w", encoding="utf-8") as log:
        for step, picked in enumerate(steps):
            lr = optimizer.lr_at(step, len(steps))
            for group in backend.optimizer.param_groups:
                group["lr"] = lr
            batch = TrainingBatch.from_sequences([s for i in picked for s in conversations[i]])
            t0 = time.perf_counter()
            metrics = backend.sft_step(batch)
            metrics.update({"step": float(step + 1), "lr": lr, "conversations": float(len(picked)),
                            "trained_tokens": float(batch.num_trainable_tokens),
                            "step_s": time.perf_counter() - t0})
            result.losses.append(metrics["loss"])
            result.trained_tokens += batch.num_trainable_tokens
            if (step + 1) % config.train.log_every == 0 or step + 1 == len(steps):
                log.write(json.dumps(metrics) + "\n")
                log.flush()
            if on_step is not None:
                on_step(step + 1, metrics)
    return result
