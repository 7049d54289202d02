"""examples/sandboxed_python_env.py: concurrent episodes share one warm sandbox pool, `env check` accepts
the pattern (the pool is a warning, not a leak), and a CLI run (`agentrl eval --endpoint`, the
environment named ``module:Class`` with its options from the config file) plays it.

The policy is scripted (the example's own, and a fake OpenAI-compatible server for the CLI run); the
sandbox is the real bubblewrap pool (~0.4 s to start here)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentrl.environments.conformance import check_environment
from agentrl.testing import build_tiny_model
from agentrl.testing.chat_server import FakeChatServer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "sandboxed_python_env.py"
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sandboxed_python_env", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic looks the module up there
    spec.loader.exec_module(module)
    return module


async def test_concurrent_episodes_share_one_pool(example: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []

    def counting(backend: str, **options: Any) -> Any:
        made.append(options)
        return create(backend, **options)
    create = example.create_sandbox
    monkeypatch.setattr(example, "create_sandbox", counting)
    episodes = await example.main(count=6)
    assert [e.reward for e in episodes] == [1.0] * 6  # the tool ran the code; the answer copied its output
    assert made == [{"pool_size": 4, "timeout_s": 10.0, "memory_mb": 512}]  # one pool for all six episodes
    assert not example._POOLS  # main closed it
    tool_text = episodes[0].trajectory.messages[3].content
    row = example.make_rows(6)[0]
    assert episodes[0].trajectory.messages[3].role == "tool" and tool_text.strip() == row["answer"]


async def test_env_check_reports_the_shared_pool_as_a_warning_not_a_leak(example: ModuleType) -> None:
    try:
        report = await check_environment(example.DigitSumEnv, example.make_rows(2), max_rows=2)
    finally:
        await example.close_shared_sandbox()
    assert report.ok, report.format()
    assert [w.check for w in report.warnings] == ["shared_processes"], report.format()
    assert "no later episode started more: a pool shared across episodes?" in report.format()


def test_rows_are_checked_and_a_fresh_environment_pickles(example: ModuleType) -> None:
    import pickle

    env = example.DigitSumEnv({"n": 12, "answer": "19"}, pool_size=2)
    assert pickle.loads(pickle.dumps(env)).sandbox_options["pool_size"] == 2
    with pytest.raises(ValueError, match="n"):
        example.DigitSumEnv({"n": 0, "answer": "1"})


def _digit_policy(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Calls python on the question's 2**n, then answers with what the tool printed."""
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if results:
        return {"role": "assistant", "content": f"\\boxed{{{results[-1].strip()}}}"}
    n = re.findall(r"2\*\*(\d+)", next(m["content"] for m in messages if m["role"] == "user"))[-1]
    code = f"print(sum(int(d) for d in str(2**{n})))"
    call = {"id": "call_0", "type": "function", "function": {"name": "python", "arguments": json.dumps({"code": code})}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def test_a_cli_run_plays_it_with_options_from_the_config(tmp_path: Path, example: ModuleType) -> None:
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in example.make_rows(4)))
    config = tmp_path / "run.toml"
    config.write_text(f"""
[model]
path = "{build_tiny_model()}"
[data.train]
path = "{tmp_path / 'rows.jsonl'}"
[[data.eval]]
name = "digits"
path = "{tmp_path / 'rows.jsonl'}"
[environment]
name = "examples.sandboxed_python_env:DigitSumEnv"
options = {{ pool_size = 2, timeout_s = 5.0 }}
[logging]
run_dir = "{tmp_path / 'run'}"
""")
    agentrl = Path(sys.executable).parent / "agentrl"
    with FakeChatServer(_digit_policy) as server:
        proc = subprocess.run([str(agentrl), "eval", str(config), "--endpoint", server.url,
                               "--out", str(tmp_path / "evals")], cwd=ROOT,
                              capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "evals" / "digits.json").read_text())
    assert (report["prompts"], report["mean_reward"], report["tool_call_rate"]) == (4, 1.0, 1.0)
