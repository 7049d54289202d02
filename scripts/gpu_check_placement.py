"""GPU check of the colocated hand-off (issue "GPU placement"): a trainer rank's memory before and after
it gives the device to a colocated engine, measured with ``torch.cuda.memory_allocated`` and
``memory_reserved``.

A random Qwen3-shaped model (``--layers``/``--hidden``, default a 1.7B shape) trains one AdamW step
on the device (weights, gradients and optimizer state all there), then ``agentrl.train.offload``
frees the gradients and moves the optimizer state to pinned host memory (what the runner does
before the engines resume), then brings it back (before the next step), and a second step runs.
A small model checks that the round trip changes nothing: a step after offload + onload equals the
step of a copy that never left the device, bit for bit.

Needs only torch and transformers (an accelerator machine may have nothing else): the project's
modules are loaded by path, without the package's ``__init__`` files. Writes one JSON line per
figure to ``--out`` (default ``$OUT/gpu_check_placement.jsonl``) as it goes, and a last line
``RESULT {...}``.

    python scripts/gpu_check_placement.py                 # on a CUDA machine, ~1 minute
    python scripts/gpu_check_placement.py --device cpu --layers 2 --hidden 256   # a smoke run anywhere
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _load_project_module(name: str) -> types.ModuleType:
    """``agentrl.<...>`` without running the package ``__init__`` files (they import pydantic & co)."""
    for package in ("agentrl", "agentrl.train"):
        if package not in sys.modules:
            stub = types.ModuleType(package)
            stub.__path__ = [str(ROOT / package.replace(".", "/"))]
            sys.modules[package] = stub
    return importlib.import_module(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_check_placement.jsonl"))
    args = parser.parse_args()

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    offload_mod = _load_project_module("agentrl.train.offload")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sink = out.open("a", encoding="utf-8")

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    device = torch.device(args.device)
    module = getattr(torch, device.type, None) if device.type != "cpu" else None
    emit({"what": "machine", "torch": torch.__version__, "device": str(device),
          "name": module.get_device_name(device) if module is not None else "cpu"})

    def memory() -> dict[str, float]:
        if module is None:
            return {"allocated_gib": 0.0, "reserved_gib": 0.0}
        module.synchronize(device)
        return {"allocated_gib": module.memory_allocated(device) / 2**30,
                "reserved_gib": module.memory_reserved(device) / 2**30}

    def build(layers: int, hidden: int, seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        config = Qwen3Config(vocab_size=151936, hidden_size=hidden, intermediate_size=3 * hidden,
                             num_hidden_layers=layers, num_attention_heads=max(hidden // 128, 1),
                             num_key_value_heads=max(hidden // 256, 1), head_dim=128, tie_word_embeddings=True)
        with torch.device(device):
            model = Qwen3ForCausalLM(config).to(torch.bfloat16)
        return model

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: int, seed: int) -> float:
        generator = torch.Generator(device="cpu").manual_seed(seed)
        ids = torch.randint(0, 151936, (1, tokens), generator=generator).to(device)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        return float(loss)

    started = time.perf_counter()
    model = build(args.layers, args.hidden, seed=0)
    params = sum(p.numel() for p in model.parameters())
    emit({"what": "model", "params": params, "layers": args.layers, "hidden": args.hidden, **memory()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    loss = step(model, optimizer, args.tokens, seed=1)
    trained = memory()
    emit({"what": "after a train step (weights, grads, Adam state on the device)", "loss": loss, **trained})
    t0 = time.perf_counter()
    report = offload_mod.offload(model.parameters(), optimizer, device)
    offloaded = memory()
    emit({"what": "after offload (grads freed, Adam state in pinned host memory)", "offload_s": time.perf_counter() - t0,
          "moved_gib": report["offload/bytes"] / 2**30, **offloaded})
    t0 = time.perf_counter()
    offload_mod.onload(optimizer, device)
    onloaded = memory()
    emit({"what": "after onload", "onload_s": time.perf_counter() - t0, **onloaded})
    loss2 = step(model, optimizer, args.tokens, seed=2)
    emit({"what": "second train step", "loss": loss2, **memory()})
    del model, optimizer
    if module is not None:
        module.empty_cache()

    small = [build(2, 256, seed=3) for _ in range(2)]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in small]
    for m, o in zip(small, opts, strict=True):
        step(m, o, 256, seed=4)
    offload_mod.offload(small[0].parameters(), opts[0], device)
    offload_mod.onload(opts[0], device)
    for m, o in zip(small, opts, strict=True):
        step(m, o, 256, seed=5)
    same = all(torch.equal(a, b) for a, b in zip(small[0].parameters(), small[1].parameters(), strict=True))
    emit({"what": "round trip changes nothing", "bitwise_equal": same})
    freed = trained["allocated_gib"] - offloaded["allocated_gib"]
    result = {"params": params, "allocated_after_step_gib": trained["allocated_gib"],
              "allocated_after_offload_gib": offloaded["allocated_gib"], "freed_gib": freed,
              "reserved_after_offload_gib": offloaded["reserved_gib"], "round_trip_bitwise_equal": same,
              "wall_s": time.perf_counter() - started}
    emit({"what": "RESULT", **result})
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
