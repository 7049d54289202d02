"""GPU check of a mixture-of-experts training step (issue "[MoE]"): the torch backend's pieces on a
Qwen3-30B-A3B-shaped model cut to ``--layers`` layers (hidden 2048, 32 query / 4 KV heads of 128, 128
experts of 768, top-8, vocabulary 151,936), bf16 compute with float32 master weights and fused AdamW,
full activation checkpointing, one packed row of ``--tokens`` tokens, tokens scored from hidden
states, transformers' grouped-GEMM experts.

Figures, each written as a JSON line as soon as it is known (``--out``, default
``$OUT/gpu_check_moe.jsonl``), then one ``RESULT {...}`` line:

- step time and tokens/s with routing replay off and on (``agentrl.train.moe.MoeRouting``; the
  "engine" routing is the model's own, recorded by a no-grad forward, so both runs route alike and
  only replay's own cost differs): the overhead of replay (target ≤ 5%);
- replay takes effect in bf16: logprobs with the recorded routing replayed against the plain forward
  (the same experts: ~0), and with every expert id shifted by 3 (other experts: far);
- the peak of ``torch.cuda.max_memory_allocated`` against the memory planner's figure for the same
  setup (``agentrl.train.memory_plan``, its MoE terms);
- grouped-GEMM experts against transformers' eager experts (a Python loop over the experts hit).

Not here: the megatron backend (megatron-core is not installed on the device machine, and expert
parallelism, and TP=2 × EP=2 with the sequence parallelism it needs, take several GPUs).

Needs only torch and transformers: the project's modules are loaded by path with stub packages,
without the package ``__init__`` files. ≤ 4 minutes on one H100 or H200.

    python scripts/gpu_check_moe.py                                        # CUDA, 4 layers of the 30B-A3B shape
    python scripts/gpu_check_moe.py --device cpu --layers 2 --hidden 256 --experts 16 --expert-ffn 128 \\
        --tokens 1024 --vocab 4096 --steps 1                                 # a smoke run anywhere
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
GIB = float(1 << 30)


def _load_project_module(name: str) -> types.ModuleType:
    """``agentrl.<...>`` without running the package ``__init__`` files (they import pydantic & co)."""
    for package in ("agentrl", "agentrl.train", "agentrl.algorithms"):
        if package not in sys.modules:
            stub = types.ModuleType(package)
            stub.__path__ = [str(ROOT / package.replace(".", "/"))]
            sys.modules[package] = stub
    return importlib.import_module(name)


def _documents(tokens: int, seed: int) -> list[int]:
    """Document lengths of one packed row: random, 256 to 2048 tokens, summing to ``tokens``."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(256, 2048), tokens - sum(lengths)))
    return lengths


class _Check:
    """The model factory, inputs, recorded routing and one training step."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.torch, self.args = torch, args
        self.attention = _load_project_module("agentrl.train.attention")
        self.recompute = _load_project_module("agentrl.train.recompute")
        self.precision = _load_project_module("agentrl.train.precision")
        self.lm_head = _load_project_module("agentrl.train.lm_head")
        self.moe = _load_project_module("agentrl.train.moe")
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.hf = {"model_type": "qwen3_moe", "vocab_size": args.vocab, "hidden_size": args.hidden,
                   "intermediate_size": 3 * args.hidden, "moe_intermediate_size": args.expert_ffn,
                   "num_hidden_layers": args.layers, "num_attention_heads": max(args.hidden // 64, 1),
                   "num_key_value_heads": max(args.hidden // 512, 1), "head_dim": 128, "num_experts": args.experts,
                   "num_experts_per_tok": args.top_k, "norm_topk_prob": True, "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "max_position_embeddings": 40960, "tie_word_embeddings": False,
                   "rope_theta": 1000000.0}
        self.lengths = _documents(args.tokens, seed=0)
        gen = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(self.device)
        self.targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(self.device)
        self.positions = torch.cat([torch.arange(n) for n in self.lengths]).to(self.device)
        self.advantages = torch.where(torch.rand(args.tokens, generator=gen) < 0.5, -1.0, 1.0).to(self.device)
        self.present = torch.ones(args.tokens, dtype=torch.bool, device=self.device)
        self.experts: Any = None

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def build(self, experts: str, replay: str) -> dict[str, Any]:
        """The model in bf16 on the device: packed attention, full checkpointing, the switchable head,
        routers patched for replay (``"off"`` or ``"rollout"``), float32 masters and fused AdamW."""
        from transformers import AutoConfig, AutoModelForCausalLM

        torch = self.torch
        torch.manual_seed(0)
        config = AutoConfig.for_model(**self.hf)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(self.device):
                model = AutoModelForCausalLM.from_config(config, experts_implementation=experts).eval()
        finally:
            torch.set_default_dtype(default)
        kernel = self.attention.use_packed_attention(model, "auto")
        self.recompute.apply_activation_checkpointing(model, "full")
        routing = self.moe.MoeRouting.install(model, replay=replay)
        head = self.lm_head.HeadSwitch(model)
        masters = self.precision.MasterWeights(model.named_parameters())
        opt = torch.optim.AdamW(masters.params, lr=1e-6, **({"fused": True} if self.cuda else {}))
        return {"model": model, "head": head, "masters": masters, "opt": opt, "kernel": kernel, "routing": routing,
                "experts": experts, "replay": replay}

    def forward(self, run: dict[str, Any], grad: bool, experts: Any = None) -> Any:
        kwargs: dict[str, Any] = {"input_ids": self.ids[None], "position_ids": self.positions[None],
                                  "use_cache": False,
                                  "agentrl_documents": self.attention.Documents.from_lengths(self.lengths,
                                                                                             device=self.device)}
        request = self.lm_head.ScoreRequest(self.targets, 1.0, 1024, "metric")
        rows = self.experts if experts is None else experts
        with self.torch.set_grad_enabled(grad), run["head"].scoring(request), run["routing"].bind(rows, self.present):
            return run["model"](**kwargs).logits

    def record_routing(self, run: dict[str, Any]) -> None:
        """The model's own routing of the row (``[T, layers, top_k]``): the stand-in for an engine's."""
        picked: list[Any] = []
        model = run["model"]
        hooks = [layer.mlp.gate.register_forward_hook(lambda _m, _i, out: picked.append(out[2]))
                 for layer in model.model.layers]
        try:
            with run["routing"].bind(None, None, record=False), self.torch.no_grad():
                model(input_ids=self.ids[None], position_ids=self.positions[None], use_cache=False,
                      agentrl_documents=self.attention.Documents.from_lengths(self.lengths, device=self.device))
        finally:
            for hook in hooks:
                hook.remove()
        self.experts = self.torch.stack(picked, dim=1)

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

    def timed(self, experts: str, replay: str) -> dict[str, Any]:
        """Build, warm up (Adam's state), then time ``--steps`` steps; the peak memory of those steps."""
        torch = self.torch
        run = self.build(experts, replay)
        if self.experts is None:
            self.record_routing(run)
        with torch.no_grad():  # before any step: the weights the routing was recorded with
            run["logprobs"] = self.forward(run, grad=False).logprobs.float().cpu()
            shifted = (self.experts + 3) % self.args.experts  # other experts, still top_k distinct ids
            run["shifted_logprobs"] = self.forward(run, grad=False, experts=shifted).logprobs.float().cpu()
        self.step(run)
        run["routing"].stats.take()
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
        run["routing_stats"] = run["routing"].stats.take()
        return run


def _planned(check: _Check, measured: float | None) -> dict[str, Any]:
    memory_plan = _load_project_module("agentrl.train.memory_plan")
    shape = memory_plan.ModelShape.from_config(check.hf)
    plan = memory_plan.plan_trainer_memory(shape, memory_plan.TrainerSetup(
        micro_batch_tokens=check.args.tokens, activation_checkpointing="full", fused_optimizer=check.cuda,
        kernel_copies_output=not check.cuda, logprob_chunk_size=1024, micro_batches=1))
    planned = plan.peak / GIB
    return {"what": "memory vs planner", "measured_peak_gib": measured, "planned_peak_gib": planned,
            "error": (planned - measured) / measured if measured else None,
            "planned_terms_gib": {k: v / GIB for k, v in plan.terms.items()}, "notes": plan.notes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--expert-ffn", type=int, default=768)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per packed micro-batch")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip-eager", action="store_true", help="skip the eager-experts comparison")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_check_moe.jsonl"))
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
          "name": torch.cuda.get_device_name(check.device) if check.cuda else "cpu", "shape": check.hf})
    timings: dict[str, dict[str, Any]] = {}
    for replay in ("off", "rollout"):
        run = check.timed("grouped_mm", replay)
        timings[replay] = {k: run[k] for k in ("step_s", "tokens_per_s", "peak_gib", "kernel", "logprobs",
                                               "shifted_logprobs", "routing_stats")}
        emit({"what": f"step, replay {replay}", "step_s": run["step_s"], "tokens_per_s": run["tokens_per_s"],
              "peak_gib": run["peak_gib"], "kernel": run["kernel"], "routing": run["routing_stats"]})
        del run
        if check.cuda:
            torch.cuda.empty_cache()
    off, on = timings["off"], timings["rollout"]
    same = float((on["logprobs"] - off["logprobs"]).abs().max())
    moved = float((on["shifted_logprobs"] - off["logprobs"]).abs().max())
    overhead = on["step_s"] / off["step_s"] - 1
    emit({"what": "replay", "overhead": overhead, "max_abs_logprob_diff_same_experts_bf16": same,
          "max_abs_logprob_diff_shifted_experts_bf16": moved})
    planned = _planned(check, off["peak_gib"])
    emit(planned)
    result: dict[str, Any] = {
        "tokens": args.tokens, "layers": args.layers,
        "replay_off_tokens_per_s": off["tokens_per_s"], "replay_on_tokens_per_s": on["tokens_per_s"],
        "replay_overhead": overhead, "replay_overhead_target": 0.05, "replay_overhead_met": overhead <= 0.05,
        "peak_gib": off["peak_gib"], "planned_peak_gib": planned["planned_peak_gib"],
        "planner_error": planned["error"], "same_experts_diff": same, "shifted_experts_diff": moved}
    if not args.skip_eager:
        eager = check.timed("eager", "off")
        emit({"what": "eager experts", "step_s": eager["step_s"], "tokens_per_s": eager["tokens_per_s"],
              "peak_gib": eager["peak_gib"], "grouped_speedup": eager["step_s"] / off["step_s"]})
        result["eager_tokens_per_s"] = eager["tokens_per_s"]
        result["grouped_over_eager"] = eager["step_s"] / off["step_s"]
    result["wall_s"] = time.perf_counter() - started
    emit({"what": "RESULT", **result})
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
