"""Chunked token log-probs vs the naive full ``log_softmax``, measured in the same run.

Both methods score the same ``[tokens, vocab]`` float32 logits (default 2,048 × 151,936, the Qwen3
vocabulary: 1.2 GB). Each method runs in a fresh child process so its peak memory can be read on
its own: on CPU the growth of the peak resident set size over the level reached once the logits
exist; on an accelerator the device allocator's peak over the same level. Prints the peak *extra*
memory of each, their ratio (target ≤ 25%), the max absolute difference of the values (target
≤ 1e-5) and the time ratio.

    .venv/bin/python bench/bench_logprobs.py                        # CPU, forward only
    .venv/bin/python bench/bench_logprobs.py --backward             # forward + backward
    .venv/bin/python bench/bench_logprobs.py --device cuda
    .venv/bin/python bench/bench_logprobs.py --from-hidden 1024   # hidden @ W.T + log_softmax vs fused

With ``--from-hidden H`` the inputs are hidden states ``[tokens, H]`` and an output embedding
``[vocab, H]``: the naive method builds the logits and their log-softmax, the chunked one is
:func:`agentrl.algorithms.logprobs_from_hidden`, which builds neither.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from agentrl.algorithms import DEFAULT_CHUNK_SIZE, logprobs_from_hidden, logprobs_from_logits
from agentrl.train import device_module, resolve_device


def _naive(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(logits.float() / temperature, dim=-1).gather(1, targets[:, None]).squeeze(1)


def _inputs(args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits with std 3 (in place: no second [tokens, vocab] temporary inflates the baseline peak)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(args.tokens, args.vocab, generator=gen).mul_(3.0).to(device)
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(device)
    return logits, targets


def _hidden_inputs(args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Hidden states and an output embedding whose products have logits of std ~3."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.from_hidden, generator=gen).to(device)
    weight = torch.randn(args.vocab, args.from_hidden, generator=gen).mul_(3.0 / args.from_hidden**0.5).to(device)
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=gen).to(device)
    return hidden, weight, targets


def _float64_reference(args: argparse.Namespace) -> torch.Tensor:
    """Exact (float64) log-probs, computed 64 rows at a time on CPU."""
    if args.from_hidden:
        hidden, weight, targets = _hidden_inputs(args, torch.device("cpu"))
        logits = None
    else:
        logits, targets = _inputs(args, torch.device("cpu"))
    out = torch.empty(args.tokens, dtype=torch.float64)
    for start in range(0, args.tokens, 64):
        rows = (hidden[start:start + 64].double() @ weight.double().T) if logits is None else logits[start:start + 64]
        z = rows.double() / args.temperature
        out[start:start + 64] = z.gather(1, targets[start:start + 64, None])[:, 0] - torch.logsumexp(z, -1)
    return out


def _peak_bytes(device: torch.device) -> int:
    module = device_module(device)
    if module is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return int(module.max_memory_allocated(device))


def _child(args: argparse.Namespace) -> None:
    device = resolve_device(args.device)
    if args.from_hidden:
        hidden, weight, targets = _hidden_inputs(args, device)
        hidden.requires_grad_(args.backward)
        weight.requires_grad_(args.backward)
        logits = hidden
        if args.method == "naive":
            def fn(h: torch.Tensor, t: torch.Tensor, temp: float) -> torch.Tensor:
                return _naive(h @ weight.T, t, temp)
        else:
            def fn(h: torch.Tensor, t: torch.Tensor, temp: float) -> torch.Tensor:
                return logprobs_from_hidden(h, weight, t, temperature=temp, chunk_size=args.chunk_size)
    else:
        logits, targets = _inputs(args, device)
        logits.requires_grad_(args.backward)
        if args.method == "naive":
            fn = _naive
        else:
            def fn(z: torch.Tensor, t: torch.Tensor, temp: float) -> torch.Tensor:
                return logprobs_from_logits(z, t, temperature=temp, chunk_size=args.chunk_size)
    warm = logits.detach()[:8].clone().requires_grad_(args.backward)
    out = fn(warm, targets[:8], args.temperature)  # warm-up: lazy initialisation is not the method's cost
    if args.backward:
        out.sum().backward()
        if args.from_hidden:
            weight.grad = None
    module = device_module(device)
    if module is not None:
        module.synchronize(device)
        module.reset_peak_memory_stats(device)
    base = _peak_bytes(device)
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        out = fn(logits, targets, args.temperature)
        if args.backward:
            out.sum().backward()
            logits.grad = None
            if args.from_hidden:
                weight.grad = None
        if module is not None:
            module.synchronize(device)
        times.append(time.perf_counter() - start)
    extra = _peak_bytes(device) - base
    torch.save(out.detach().cpu(), args.out)
    print(json.dumps({"extra_bytes": extra, "seconds": min(times)}))


def _run_child(method: str, args: argparse.Namespace, out: Path) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", "--method", method, "--out", str(out),
           "--tokens", str(args.tokens), "--vocab", str(args.vocab), "--device", args.device,
           "--chunk-size", str(args.chunk_size), "--temperature", str(args.temperature), "--repeat", str(args.repeat)]
    if args.backward:
        cmd.append("--backward")
    if args.from_hidden:
        cmd += ["--from-hidden", str(args.from_hidden)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backward", action="store_true", help="time and measure forward + backward")
    parser.add_argument("--from-hidden", type=int, default=0, metavar="H",
                        help="score from hidden states of size H and an output embedding (fused path)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        naive = _run_child("naive", args, Path(tmp) / "naive.pt")
        chunked = _run_child("chunked", args, Path(tmp) / "chunked.pt")
        naive_out = torch.load(Path(tmp) / "naive.pt").double()
        chunked_out = torch.load(Path(tmp) / "chunked.pt").double()
    exact = _float64_reference(args)
    diff = float((naive_out - chunked_out).abs().max())
    err_naive = float((naive_out - exact).abs().max())
    err_chunked = float((chunked_out - exact).abs().max())
    mib = 1024 * 1024
    mode = "forward+backward" if args.backward else "forward"
    source = f"hidden [{args.tokens} x {args.from_hidden}] @ W.T" if args.from_hidden else "float32 logits"
    print(f"logprobs of [{args.tokens} x {args.vocab}] from {source}, T={args.temperature}, {mode}, "
          f"device={args.device}, chunk={args.chunk_size}")
    print(f"  naive log_softmax : peak extra {naive['extra_bytes'] / mib:9.1f} MiB, {naive['seconds'] * 1e3:8.1f} ms")
    print(f"  chunked           : peak extra {chunked['extra_bytes'] / mib:9.1f} MiB, {chunked['seconds'] * 1e3:8.1f} ms")
    ratio = chunked["extra_bytes"] / max(naive["extra_bytes"], 1)
    print(f"  memory ratio chunked/naive = {ratio:.3f} (target <= 0.25): {'PASS' if ratio <= 0.25 else 'FAIL'}")
    print(f"  max |chunked - float64 exact| = {err_chunked:.2e} (target <= 1e-5): "
          f"{'PASS' if err_chunked <= 1e-5 else 'FAIL'}")
    print(f"  max |naive   - float64 exact| = {err_naive:.2e}")
    print(f"  max |chunked - naive|         = {diff:.2e} (target <= 1e-5): {'PASS' if diff <= 1e-5 else 'FAIL'}")
    print(f"  time ratio chunked/naive = {chunked['seconds'] / naive['seconds']:.2f}")
    figures = {"mode": mode, "device": args.device, "tokens": args.tokens, "vocab": args.vocab,
               "from_hidden": args.from_hidden, "chunked_extra_bytes": chunked["extra_bytes"],
               "chunked_s": round(chunked["seconds"], 4), "max_abs_err_chunked": err_chunked,
               "max_abs_diff_chunked_naive": diff}
    baseline = {"naive_extra_bytes": naive["extra_bytes"], "naive_s": round(naive["seconds"], 4),
                "max_abs_err_naive": err_naive}
    ratios = {"chunked_vs_naive_memory": round(ratio, 4),
              "chunked_vs_naive_time": round(chunked["seconds"] / naive["seconds"], 3)}
    targets = {"chunked_vs_naive_memory": 0.25, "max_abs_err_chunked": 1e-5}
    met = {"chunked_vs_naive_memory": ratio <= 0.25, "max_abs_err_chunked": err_chunked <= 1e-5}
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met}))


if __name__ == "__main__":
    main()
