"""`agentrl eval --endpoint` against a real SGLang server's own OpenAI-compatible
``/v1/chat/completions`` (the tiny Qwen3 on CPU, the project's Qwen3 chat template, SGLang's qwen25
tool-call parser): messages in, messages out, the environment's reward, a message-level report
and conversations in the run folder. The session's shared engine, on the tiny model's weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

AGENTRL = Path(sys.executable).parent / "agentrl"


def test_eval_endpoint_on_sglang_v1(tiny_engine: str, tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(3, seed=2)))
    (tmp_path / "eval.toml").write_text(f"""
[model]
path = "{build_tiny_model()}"
[data.train]
path = "test.jsonl"
[[data.eval]]
name = "arith"
path = "test.jsonl"
[environment]
name = "toy_arithmetic"
[rollout.sampling]
max_new_tokens = 32
[logging]
run_dir = "run"
""")
    proc = subprocess.run([str(AGENTRL), "eval", "eval.toml", "--endpoint", f"{tiny_engine}/v1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    [out] = (tmp_path / "evals").glob("endpoint-*")  # named by the model SGLang lists; no run's folder
    report = json.loads((out / "arith.json").read_text())
    assert report["message_level"] is True and report["source"]["kind"] == "endpoint"
    assert report["source"]["model"]  # the name SGLang lists at /v1/models
    assert (report["prompts"], report["samples"]) == (3, 3) and report["failure_rate"] == 0.0
    assert sum(report["stop_reasons"].values()) == 3
    assert set(report["stop_reasons"]) <= {"no_tool_calls", "engine_length", "max_turns", "max_tool_calls"}
    records = [json.loads(x) for x in (out / "arith.episodes.jsonl").read_text().splitlines()]
    for r in records:
        roles = [m["role"] for m in r["messages"]]
        assert roles[:3] == ["system", "user", "assistant"]
        assert r["metrics"]["usage/completion_tokens"] > 0  # counted by the server, per answer
        assert r["reward"] is not None and 0.0 <= r["reward"] <= 1.0
        assert r["status"] in ("completed", "truncated")
        assert r["info"]["message_level"] is True and r["errors"] == []
