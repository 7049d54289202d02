"""Tiny-model generation throughput on a real SGLang engine (CPU build on a machine without a GPU).

One run: start one SGLang server with the tiny Qwen3 model behind sglang-router, warm it up, then
measure output tokens/s at batch 1 and batch 16 (64 new tokens each, logprobs on, ``ignore_eos``),
best of ``--repeats``, both directly and through the router, using agentrl's InferenceClient. The
baseline, measured in the same run after the engine is stopped, is Hugging Face transformers
``generate`` on the same model (fp32, ``output_scores``), and the ratio SGLang / HF is printed.

    .venv/bin/python bench/bench_engine_throughput.py [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from agentrl.rollout import ClientConfig, EngineConfig, EngineGroup, InferenceClient, SamplingParams
from agentrl.testing import build_tiny_model

PROMPT = list(range(100, 116))


async def measure_engine(client: InferenceClient, batch: int, new_tokens: int, repeats: int) -> float:
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, temperature=1.0)
    best = 0.0
    for r in range(repeats):
        t0 = time.perf_counter()
        results = await asyncio.gather(*(client.generate(PROMPT, params, routing_key=f"b{r}-{i}")
                                         for i in range(batch)))
        elapsed = time.perf_counter() - t0
        tokens = sum(len(x.output_ids) for x in results)
        assert tokens == batch * new_tokens, tokens
        best = max(best, tokens / elapsed)
    return best


async def bench_sglang(model: str, new_tokens: int, repeats: int) -> dict[tuple[str, int], float]:
    config = EngineConfig(model_path=model, context_length=1024, max_total_tokens=8192)
    group = await EngineGroup.launch([config])
    out: dict[tuple[str, int], float] = {}
    try:
        direct = InferenceClient(ClientConfig(base_url=group.engines[0].url))
        routed = group.client()
        async with direct, routed:
            await measure_engine(direct, 16, new_tokens, 2)  # warm-up: the first batches are much slower
            for name, client in (("direct", direct), ("router", routed)):
                for batch in (1, 16):
                    out[(name, batch)] = await measure_engine(client, batch, new_tokens, repeats)
    finally:
        await group.shutdown()
    return out


def bench_hf(model: str, new_tokens: int, repeats: int) -> dict[int, float]:
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    out: dict[int, float] = {}
    for batch in (1, 16):
        ids = torch.tensor([PROMPT] * batch)
        best = 0.0
        for _ in range(repeats + 1):  # the first run is a warm-up
            t0 = time.perf_counter()
            with torch.no_grad():
                gen = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=True, output_scores=True,
                                  return_dict_in_generate=True, pad_token_id=0)
            elapsed = time.perf_counter() - t0
            tokens = (gen.sequences.shape[1] - len(PROMPT)) * batch
            best = max(best, tokens / elapsed)
        out[batch] = best
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = str(build_tiny_model())
    sglang = asyncio.run(bench_sglang(model, args.new_tokens, args.repeats))
    hf = bench_hf(model, args.new_tokens, args.repeats)
    print(f"tiny Qwen3, {args.new_tokens} new tokens, logprobs on, best of {args.repeats}: output tokens/s")
    print(f"{'backend':<28}{'batch 1':>10}{'batch 16':>10}")
    for path in ("direct", "router"):
        print(f"{'SGLang CPU ' + path:<28}{sglang[(path, 1)]:>10.0f}{sglang[(path, 16)]:>10.0f}")
    print(f"{'HF transformers generate':<28}{hf[1]:>10.0f}{hf[16]:>10.0f}")
    for batch in (1, 16):
        print(f"SGLang (router) / HF at batch {batch}: {sglang[('router', batch)] / hf[batch]:.2f}")


if __name__ == "__main__":
    main()
