"""A GGUF-imported Llama served by the real CPU SGLang engine with the server arguments ``agentrl serve
FOLDER --template qwen3`` gives it (:func:`~agentrl.cli.serve.plan_serve`: agentrl's template, SGLang's
``qwen25`` parser; booted by the session's engine pool): the engine scores probe sequences, and the
tokens it samples, as the torch trainer does (mean |Δlogprob| ≤ 1e-4, float32 both sides), and its
OpenAI endpoint answers a chat request rendered with agentrl's template.

The model is the tiny Llama of :mod:`agentrl.testing.gguf`, written as Q8_0 GGUF and imported by
:func:`agentrl.models.import_gguf`: the same path SmolLM2-135M-Instruct takes (``LlamaForCausalLM``,
tied embeddings, SGLang's Llama class registered up front by the CPU shims). SmolLM2 itself (a 93 MB
download) is measured by ``bench/bench_real_model.py``, outside the suite.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.models import import_gguf
from agentrl.rollout import SamplingParams
from agentrl.rollout.client import ClientConfig, InferenceClient
from agentrl.runner.probe import backend_scorer, logprob_mismatch, probe_sequences
from agentrl.runner.rollout_service import _score_with
from agentrl.testing.gguf import write_tiny_gguf

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

pytest.importorskip("sglang")

MEAN_BOUND = 1e-4


async def test_imported_llama_is_served_as_the_trainer_scores_it(engine_pool: Any,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    import httpx
    from transformers import AutoTokenizer

    from agentrl.chat import ChatTemplate
    from agentrl.cli.serve import plan_serve
    from agentrl.train import TorchTrainBackend
    from agentrl.train.config import TorchBackendConfig

    tmp_path = tmp_path_factory.mktemp("gguf-llama")  # the pooled engine serves the folder for the session
    gguf_path, _ = write_tiny_gguf(tmp_path / "tiny.gguf", quant="Q8_0")
    folder = import_gguf(gguf_path, tmp_path / "model").folder
    tok = AutoTokenizer.from_pretrained(str(folder))
    backend = TorchTrainBackend.from_pretrained(str(folder), TorchBackendConfig(device="cpu", dtype="float32"))
    probes = probe_sequences(tok, n=4, length=48, seed=0)
    prompt = ChatTemplate.from_name("qwen3", tokenizer=tok).encode(
        [{"role": "user", "content": "What is 487 * 925?"}], add_generation_prompt=True)

    plan = plan_serve(folder, device="cpu", template="qwen3")
    assert plan.template == "qwen3" and plan.parser == "qwen25" and plan.config.dtype == "float32"
    url = await asyncio.to_thread(engine_pool.url, folder, extra_args=plan.config.extra_args)
    async with InferenceClient(ClientConfig(base_url=url, max_retries=0)) as client:
        served = await _score_with(client, probes)
        sampled = await client.generate(prompt, SamplingParams(max_new_tokens=24, temperature=1.0))
    async with httpx.AsyncClient(timeout=120) as http:
        reply = await http.post(f"{url}/v1/chat/completions", json={
            "model": str(folder), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    trained = backend_scorer(backend)(probes)
    probe = logprob_mismatch([v for r in served for v in r[1:]], [v for r in trained for v in r[1:]])
    rescored = backend_scorer(backend)([prompt + list(sampled.output_ids)])[0][len(prompt):]
    on_samples = logprob_mismatch(list(sampled.output_logprobs), rescored)
    print(f"probe mean |d| {probe['mean']:.2e} (max {probe['max']:.2e}); sampled tokens mean |d| "
          f"{on_samples['mean']:.2e} over {on_samples['n']:.0f}")
    assert probe["n"] == 4 * 47 and probe["mean"] <= MEAN_BOUND
    assert on_samples["n"] >= 1 and on_samples["mean"] <= MEAN_BOUND
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] is not None
