"""WeightBuckets: the flat layout SGLang loads, one reused buffer, tied weights once, and shared memory
whose helper process does not hold the caller's output open."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import torch

from agentrl.train.weight_stream import WeightBuckets


def _weights() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    emb = torch.randn(10, 4)
    return [("embed.weight", emb), ("norm.weight", torch.randn(3)), ("proj.weight", torch.randn(4, 4)),
            ("lm_head.weight", emb)]  # tied to embed.weight


def test_buckets_hold_each_weight_once_in_order_aligned_and_converted() -> None:
    weights = _weights()
    buckets = WeightBuckets(lambda: iter(weights), dtype=torch.bfloat16, bucket_bytes=90)
    filled = [(b.index, b.nbytes, [(e.name, e.start, e.end) for e in b.entries], b.flat.clone()) for b in buckets.fill()]
    # 40 bf16 values = 80 bytes and 3 more fit 90; the 16 of proj do not (the tied lm_head is not sent)
    assert [f[2] for f in filled] == [[("embed.weight", 0, 80), ("norm.weight", 80, 86)], [("proj.weight", 0, 32)]]
    for _, _, entries, flat in filled:
        for name, start, end in entries:
            expected = dict(weights)[name].to(torch.bfloat16).reshape(-1)
            assert torch.equal(flat[start:end].view(torch.bfloat16), expected)
    first = buckets._buffer
    with torch.no_grad():
        weights[2][1].add_(1.0)
    again = [b.flat for b in buckets.fill()]
    assert buckets._buffer is first and again[-1].data_ptr() == first.data_ptr()  # refilled in place
    assert torch.equal(again[-1][0:32].view(torch.bfloat16), weights[2][1].to(torch.bfloat16).reshape(-1))
    changing = iter([weights, weights[:2]])
    staged = WeightBuckets(lambda: iter(next(changing)), dtype=None, bucket_bytes=1 << 20)
    list(staged.fill())
    with pytest.raises(ValueError, match=r"'proj.weight' is missing or changed shape"):
        list(staged.fill())


def test_the_shared_memory_helper_does_not_hold_a_captured_output_open() -> None:
    """The first shared-memory allocation starts torch's shm manager, which lives while the memory is
    mapped (here: by a process standing for the engine, for 90 s). A parent capturing the trainer's
    output must still see it end when the trainer ends."""
    child = textwrap.dedent("""
        import subprocess, sys, torch
        from multiprocessing.reduction import ForkingPickler
        from agentrl.train.weight_stream import WeightBuckets
        torch.multiprocessing.set_sharing_strategy("file_system")
        buckets = WeightBuckets(lambda: iter([("w", torch.ones(1024))]), dtype=None, bucket_bytes=1 << 20, shared=True)
        flat = next(buckets.fill()).flat
        payload = ForkingPickler.dumps(flat)
        engine = subprocess.Popen([sys.executable, "-c",
            "import sys, time, pickle, torch; torch.multiprocessing.set_sharing_strategy('file_system');"
            "t = pickle.loads(sys.stdin.buffer.read()); time.sleep(90)"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        engine.stdin.write(payload); engine.stdin.close()
        print("pushed", engine.pid, flush=True)
    """)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=150)
    elapsed = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    engine_pid = int(out.stdout.split()[1])
    try:
        assert elapsed < 60, f"the captured output stayed open {elapsed:.1f} s (held by torch_shm_manager)"
    finally:
        import os
        import signal

        try:
            os.kill(engine_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
