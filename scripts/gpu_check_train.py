"""GPU check of a training step that fits and learns (issue "Fit and learn at scale"): the torch
backend's step on a random Qwen3-1.7B-shaped model, bf16 compute with float32 master weights and
AdamW state, full activation checkpointing, packed micro-batches of 16k tokens, tokens scored from
hidden states (no logits), packed attention through torch's ``varlen_attn`` (flash-attn where
installed) with the causal window passed.

Figures, each written as a JSON line as soon as it is known (``--out``, default
``$OUT/gpu_check_train.jsonl``), then one ``RESULT {...}`` line:

- tokens/s of the step, MFU (model FLOPs: 6·N per token plus causal attention, against
  ``--peak-tflops``, H200 dense bf16 ~790 measured) and HFU (with the recomputed forward);
- the peak of ``torch.cuda.max_memory_allocated`` against the memory planner's figure for the same
  setup (``agentrl.train.memory_plan``);
- packed varlen attention against transformers' own SDPA attention (a ``[S, S]`` mask): step time,
  peak memory, and the logprobs of the two paths (they must agree: documents isolated either way);
- the colocated hand-off with master weights: what offloading the optimizer state and the float32
  masters frees, and that the next step after onloading still runs.

Needs only torch and transformers (the GPU machine has nothing else): the project's modules are
loaded by path with stub packages, without the package ``__init__`` files. ≤ 4 minutes on one H200.

    python scripts/gpu_check_train.py                                   # CUDA, the 1.7B shape
    python scripts/gpu_check_train.py --device cpu --layers 2 --hidden 256 --tokens 2048 --vocab 4096   # smoke run
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _load_project_module(name: str) -> types.ModuleType:
    """``agentrl.<...>`` without running the package ``__init__`` files (they import pydantic & co)."""
    for package in ("agentrl", "agentrl.train", "agentrl.algorithms"):
        if package not in sys.modules:
            stub = types.ModuleType(package)
            stub.__path__ = [str(ROOT / package.replace(".", "/"))]
            sys.modules[package] = stub
    return importlib.import_module(name)


def _documents(tokens: int, seed: int) -> list[int]:
    """Document lengths of one packed row: random, 512 to 4096 tokens, summing to ``tokens``."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(512, 4096), tokens - sum(lengths)))
    return lengths


GIB = float(1 << 30)


class _Check:
    """The check's model factory, inputs and one training step (the torch backend's pieces, loaded by path)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.torch, self.args = torch, args
        self.attention = _load_project_module("agentrl.train.attention")
        self.recompute = _load_project_module("agentrl.train.recompute")
        self.precision = _load_project_module("agentrl.train.precision")
        self.lm_head = _load_project_module("agentrl.train.lm_head")
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.hf = {"vocab_size": args.vocab, "hidden_size": args.hidden, "intermediate_size": 3 * args.hidden,
                   "num_hidden_layers": args.layers, "num_attention_heads": max(args.hidden // 128, 1),
                   "num_key_value_heads": max(args.hidden // 256, 1), "head_dim": 128,
                   "max_position_embeddings": 40960, "tie_word_embeddings": True, "rope_theta": 1000000.0}
        self.lengths = _documents(args.tokens, seed=0)
        gen = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(self.device)
        self.targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(self.device)
        self.positions = torch.cat([torch.arange(n) for n in self.lengths]).to(self.device)
        self.advantages = torch.where(torch.rand(args.tokens, generator=gen) < 0.5, -1.0, 1.0).to(self.device)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def build(self, kernel: str) -> dict[str, Any]:
        """The model in bf16 on the device with packed attention (or its own for "model"), full
        checkpointing and the switchable head; float32 master weights and a fused AdamW over them."""
        from transformers import Qwen3Config, Qwen3ForCausalLM

        torch = self.torch
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(self.device):
                model = Qwen3ForCausalLM(Qwen3Config(**self.hf)).eval()
        finally:
            torch.set_default_dtype(default)
        resolved = "model" if kernel == "model" else self.attention.use_packed_attention(model, kernel)
        self.recompute.apply_activation_checkpointing(model, "full")
        head = self.lm_head.HeadSwitch(model)
        masters = self.precision.MasterWeights(model.named_parameters())
        opt = torch.optim.AdamW(masters.params, lr=1e-6, **({"fused": True} if self.cuda else {}))
        return {"model": model, "head": head, "masters": masters, "opt": opt, "kernel": resolved}

    def forward(self, run: dict[str, Any], grad: bool) -> Any:
        kwargs: dict[str, Any] = {"input_ids": self.ids[None], "position_ids": self.positions[None],
                                  "use_cache": False}
        if run["kernel"] != "model":
            kwargs["agentrl_documents"] = self.attention.Documents.from_lengths(self.lengths, device=self.device)
        request = self.lm_head.ScoreRequest(self.targets, 1.0, 1024, "metric")
        with self.torch.set_grad_enabled(grad), run["head"].scoring(request):
            return run["model"](**kwargs).logits

    def step(self, run: dict[str, Any]) -> float:
        with self.torch.no_grad():
            self.forward(run, grad=False)  # the old-logprob forward of a recompute step
        scored = self.forward(run, grad=True)
        loss = -(scored.logprobs * self.advantages).sum() / self.args.tokens
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(run["masters"].params, 1.0)
        run["opt"].step()
        run["masters"].copy_to_model()
        run["masters"].zero_grad()
        return float(loss.detach())

    def timed(self, kernel: str) -> dict[str, Any]:
        """Build, warm up (Adam's state), then time ``--steps`` steps; the peak memory of those steps."""
        torch = self.torch
        run = self.build(kernel)
        self.step(run)
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        started = time.perf_counter()
        for _ in range(self.args.steps):
            self.step(run)
        self.sync()
        run["step_s"] = (time.perf_counter() - started) / self.args.steps
        run["tokens_per_s"] = self.args.tokens / run["step_s"]
        run["peak_gib"] = torch.cuda.max_memory_allocated(self.device) / GIB if self.cuda else None
        with torch.no_grad():
            run["logprobs"] = self.forward(run, grad=False).logprobs.float().cpu()
        return run


def _throughput(check: _Check, run: dict[str, Any]) -> dict[str, Any]:
    """MFU: model FLOPs (6·N per token plus causal attention) against ``--peak-tflops``; HFU adds the
    recomputed forward."""
    args, hf = check.args, check.hf
    n_params = sum(p.numel() for p in run["model"].parameters())
    heads, head_dim = hf["num_attention_heads"], hf["head_dim"]
    attn_flops = sum(6 * 2 * heads * head_dim * n * n // 2 * args.layers for n in check.lengths)
    model_flops = 6 * n_params * args.tokens + attn_flops
    hardware_flops = model_flops + 2 * n_params * args.tokens + attn_flops // 3
    tflops = model_flops / run["step_s"] / 1e12
    return {"what": "packed step", "params": n_params, "tokens": args.tokens, "documents": len(check.lengths),
            "kernel": run["kernel"], "step_s": run["step_s"], "tokens_per_s": run["tokens_per_s"],
            "model_tflops": tflops, "mfu": tflops / args.peak_tflops if check.cuda else None,
            "hfu": hardware_flops / run["step_s"] / 1e12 / args.peak_tflops if check.cuda else None,
            "peak_gib": run["peak_gib"]}


def _planned(check: _Check, measured: float | None) -> dict[str, Any]:
    memory_plan = _load_project_module("agentrl.train.memory_plan")
    shape = memory_plan.ModelShape.from_config({"model_type": "qwen3", **check.hf})
    plan = memory_plan.plan_trainer_memory(shape, memory_plan.TrainerSetup(
        micro_batch_tokens=check.args.tokens, activation_checkpointing="full", fused_optimizer=check.cuda,
        kernel_copies_output=not check.cuda, logprob_chunk_size=1024, micro_batches=1))
    planned = plan.peak / GIB
    return {"what": "memory vs planner", "measured_peak_gib": measured, "planned_peak_gib": planned,
            "error": (planned - measured) / measured if measured else None,
            "planned_terms_gib": {k: v / GIB for k, v in plan.terms.items()}}


def _offload(check: _Check, run: dict[str, Any]) -> dict[str, Any]:
    """The colocated hand-off with master weights: optimizer state and masters to host memory and
    back, then one more step."""
    offload = _load_project_module("agentrl.train.offload")
    torch, device = check.torch, check.device
    check.sync()
    before = torch.cuda.memory_allocated(device) / GIB if check.cuda else 0.0
    moved = offload.offload(run["model"].parameters(), run["opt"], device, extra=run["masters"].params)
    after = torch.cuda.memory_allocated(device) / GIB if check.cuda else 0.0
    offload.onload(run["opt"], device, extra=run["masters"].params)
    return {"what": "offload with master weights", "allocated_before_gib": before, "allocated_after_gib": after,
            "moved_gib": moved["offload/bytes"] / GIB, "next_step_loss": check.step(run)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per packed micro-batch")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 peak of the device")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_check_train.jsonl"))
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sink = out.open("a", encoding="utf-8")

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    started = time.perf_counter()
    check = _Check(args)
    torch = check.torch
    emit({"what": "machine", "torch": torch.__version__, "device": str(check.device),
          "name": torch.cuda.get_device_name(check.device) if check.cuda else "cpu"})
    packed = check.timed("auto")
    throughput = _throughput(check, packed)
    emit(throughput)
    planned = _planned(check, packed["peak_gib"])
    emit(planned)
    emit(_offload(check, packed))
    kept = {k: packed[k] for k in ("logprobs", "step_s", "tokens_per_s", "peak_gib", "kernel")}
    del packed
    if check.cuda:
        torch.cuda.empty_cache()
    dense = check.timed("model")  # transformers' SDPA with the packed [S, S] mask
    diff = float((dense["logprobs"] - kept["logprobs"]).abs().max())
    emit({"what": "varlen vs transformers' SDPA", "packed_kernel": kept["kernel"], "packed_step_s": kept["step_s"],
          "sdpa_step_s": dense["step_s"], "speedup": dense["step_s"] / kept["step_s"],
          "packed_peak_gib": kept["peak_gib"], "sdpa_peak_gib": dense["peak_gib"], "max_abs_logprob_diff_bf16": diff})
    result = {"params": throughput["params"], "tokens": args.tokens, "kernel": kept["kernel"],
              "tokens_per_s": kept["tokens_per_s"], "mfu": throughput["mfu"], "peak_gib": kept["peak_gib"],
              "planned_peak_gib": planned["planned_peak_gib"], "sdpa_tokens_per_s": dense["tokens_per_s"],
              "sdpa_peak_gib": dense["peak_gib"], "max_abs_logprob_diff_bf16": diff,
              "wall_s": time.perf_counter() - started}
    emit({"what": "RESULT", **result})
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
