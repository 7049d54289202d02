"""The folder ``run_sft`` writes serves on a real CPU SGLang engine: the engine's logprobs of its own greedy
tokens match transformers' on the same folder (it loaded the fine-tuned weights, not the base model's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.chat import ChatTemplate
from agentrl.environments import make_arithmetic_rows
from agentrl.rollout import ClientConfig, EngineConfig, InferenceClient, SamplingParams, SGLangEngine
from agentrl.sft import SftConfig, TranscriptBuilder, arithmetic_conversations, run_sft
from agentrl.testing import build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def _transformers_logprobs(folder: Path, prompt: list[int], output: list[int]) -> tuple[list[float], list[float]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1:-1].float(), dim=-1)
    picked = logp.gather(1, torch.tensor(output)[:, None])[:, 0]
    return picked.tolist(), logp.argmax(-1).tolist()


async def test_the_sft_folder_serves_on_a_real_engine(tmp_path: Path) -> None:
    base = build_tiny_model(tmp_path / "base")
    rows = arithmetic_conversations(make_arithmetic_rows(40, seed=1000))
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:32]))
    config = SftConfig.from_dict({
        "model": {"path": str(base)}, "data": {"path": str(data)}, "output": str(tmp_path / "sft"),
        "train": {"steps": 6, "batch_size": 8, "device": "cpu", "threads": 1,
                  "optimizer": {"lr": 3e-3, "warmup_steps": 1}}})
    result = run_sft(config)
    assert result.losses[-1] < result.losses[0]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(result.output), local_files_only=True)
    held_out = rows[-1]["messages"]
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    prompt = TranscriptBuilder(template).episode(held_out, tools=rows[-1]["tools"]).trajectory
    prompt_ids = prompt.tokens[:prompt.prompt_length]

    engine = await SGLangEngine.launch(EngineConfig(model_path=result.output, device="cpu", dtype="float32",
                                                    context_length=1024, max_total_tokens=4096, log_dir=tmp_path,
                                                    startup_timeout_s=600))
    try:
        async with InferenceClient(ClientConfig(base_url=engine.url)) as client:
            out = await client.generate(prompt_ids, SamplingParams(max_new_tokens=12, temperature=0.0,
                                                                   stop_token_ids=template.stop_token_ids()))
    finally:
        engine.stop()
    assert len(out.output_ids) > 0
    expected, greedy = _transformers_logprobs(result.output, prompt_ids, list(out.output_ids))
    assert list(out.output_ids) == greedy[:len(out.output_ids)]
    assert max(abs(a - b) for a, b in zip(out.output_logprobs, expected, strict=True)) < 1e-2
    base_lp, _ = _transformers_logprobs(base, prompt_ids, list(out.output_ids))
    assert max(abs(a - b) for a, b in zip(base_lp, expected, strict=True)) > 0.1  # not the base model's weights
