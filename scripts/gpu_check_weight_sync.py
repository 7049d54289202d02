"""GPU check of the trainer's side of a weight sync without disk (issue "Fast weight sync"): gather,
bucket and convert a Qwen3-1.7B-shaped model's weights into the reused flat buffer
(``agentrl.train.weight_stream.WeightBuckets``, as ``tensor`` and ``distributed`` do), and serialize
each bucket for ``update_weights_from_tensor`` (CUDA IPC handles), timed; against a plain
device-to-device copy of the same bytes (the limit). No SGLang on that machine: the engine's side is
measured on CPU (``bench/bench_weight_sync.py``).

Needs only torch and transformers; the project's modules are loaded by path. Writes one JSON line
per figure to ``--out`` (default ``$OUT/gpu_check_weight_sync.jsonl``) as it goes, then ``RESULT {...}``.

    python scripts/gpu_check_weight_sync.py            # ~1 minute on one GPU
    python scripts/gpu_check_weight_sync.py --device cpu --layers 2 --hidden 256   # a smoke run anywhere
"""

from __future__ import annotations

import argparse
import base64
import importlib
import io
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _load_project_module(name: str) -> types.ModuleType:
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
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_check_weight_sync.jsonl"))
    args = parser.parse_args()

    from multiprocessing.reduction import ForkingPickler

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    stream = _load_project_module("agentrl.train.weight_stream")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sink = out.open("a", encoding="utf-8")

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    emit({"what": "machine", "torch": torch.__version__, "device": str(device),
          "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"})
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=151936, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=max(args.hidden // 128, 1),
                         num_key_value_heads=max(args.hidden // 256, 1), head_dim=128, tie_word_embeddings=True)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)  # fp32 master weights, exported in bf16
    params = sum(p.numel() for p in model.parameters())
    emit({"what": "model", "params": params, "layers": args.layers, "hidden": args.hidden})

    def named() -> Any:
        return ((n, t.detach()) for n, t in model.state_dict().items())

    buckets = stream.WeightBuckets(named, dtype=torch.bfloat16, bucket_bytes=args.bucket_mb << 20, device=device)
    rows = []
    for repeat in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        fill_s = serialize_s = 0.0
        total = 0
        for bucket in buckets.fill():
            sync()
            fill_s += bucket.timings["fill_s"]
            t1 = time.perf_counter()
            buf = io.BytesIO()
            ForkingPickler(buf).dump({"flattened_tensor": bucket.flat, "metadata": [e.name for e in bucket.entries]})
            base64.b64encode(buf.getvalue())
            serialize_s += time.perf_counter() - t1
            total += bucket.nbytes
        sync()
        row = {"what": "trainer side of a push", "repeat": repeat, "wall_s": time.perf_counter() - t0,
               "fill_s": fill_s, "serialize_s": serialize_s, "bytes": total, "buckets": len(buckets.layout)}
        rows.append(row)
        emit(row)
    flat = torch.empty(buckets.total_bytes, dtype=torch.uint8, device=device)
    sent = {e.name for b in buckets.layout for e in b}  # a tied weight travels once
    copies = []
    for _ in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        offset = 0
        for _, tensor in ((n, t) for n, t in named() if n in sent):
            n = tensor.numel() * 2
            flat[offset:offset + n].view(torch.bfloat16).copy_(tensor.reshape(-1))
            offset += n
        sync()
        copies.append(time.perf_counter() - t0)
    best = min(rows, key=lambda r: r["wall_s"])
    result = {"params": params, "bytes": best["bytes"], "buckets": best["buckets"], "push_side_s": best["wall_s"],
              "fill_s": best["fill_s"], "serialize_s": best["serialize_s"], "copy_limit_s": min(copies),
              "vs_copy": best["wall_s"] / min(copies), "gb_per_s": best["bytes"] / best["wall_s"] / 1e9}
    emit({"what": "RESULT", **result})
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
