"""`agentrl eval` through a subprocess on real files: the endpoint path end to end (fake
OpenAI-compatible server on 127.0.0.1) and every bad command line, each with its one-line message
and exit status 2. The engine paths (--model, --checkpoint) are in tests/integration/cli/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.testing import build_tiny_model
from agentrl.testing.chat_server import FakeChatServer

pytestmark = pytest.mark.timeout(300)

AGENTRL = Path(sys.executable).parent / "agentrl"  # the installed console script


def _agentrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(AGENTRL), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=240, env={**os.environ, "COLUMNS": "200"})


def _write(folder: Path, body: str, rows: int = 4) -> Path:
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(rows, seed=3)))
    config = folder / "eval.toml"
    config.write_text(body.replace("MODEL", str(build_tiny_model())))
    return config


CONFIG = """
[model]
path = "MODEL"
[data.train]
path = "test.jsonl"
[[data.eval]]
name = "arith"
path = "test.jsonl"
[environment]
name = "toy_arithmetic"
[logging]
run_dir = "run"
"""


def test_eval_endpoint_writes_the_report_and_the_conversations(tmp_path: Path) -> None:
    config = _write(tmp_path, CONFIG)
    with FakeChatServer() as server:
        proc = _agentrl("eval", str(config), "--endpoint", server.url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "run" / "evals" / "endpoint"
    report = json.loads((out / "arith.json").read_text())
    assert report["message_level"] is True and report["source"] == {"kind": "endpoint", "url": server.url,
                                                                      "model": "fake-model"}
    assert (report["prompts"], report["samples"], report["mean_reward"]) == (4, 4, 1.0)
    assert report["pass_at_k"] == {"1": 1.0} and report["tool_call_rate"] == 1.0
    assert report["truncation_rate"] == 0.0 and report["failure_kinds"] == {}
    lines = [json.loads(x) for x in (out / "arith.episodes.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(r["reward"] == 1.0 for r in lines)
    assert [m["role"] for m in lines[0]["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert "arith" in proc.stdout and "mean reward" in proc.stdout and "results:" in proc.stdout


def test_eval_takes_a_module_attr_environment_like_train(tmp_path: Path) -> None:
    """environment.name = "module:Class" from the current directory, resolved as `agentrl train` does."""
    (tmp_path / "quiz_envs.py").write_text(
        "from agentrl.environments import ToyArithmeticEnv\n\n\n"
        "class HalfCreditEnv(ToyArithmeticEnv):\n"
        "    def reward(self, trajectory):\n"
        "        return 0.5 * super().reward(trajectory)\n")
    config = _write(tmp_path, CONFIG.replace('"toy_arithmetic"', '"quiz_envs:HalfCreditEnv"'))
    with FakeChatServer() as server:
        proc = _agentrl("eval", str(config), "--endpoint", server.url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "run" / "evals" / "endpoint" / "arith.json").read_text())
    assert (report["prompts"], report["mean_reward"]) == (4, 0.5)  # the class of quiz_envs scored them


def test_eval_data_limit_and_out(tmp_path: Path) -> None:
    config = _write(tmp_path, CONFIG, rows=6)
    with FakeChatServer() as server:
        proc = _agentrl("eval", str(config), "--endpoint", server.url, "--data", "test.jsonl", "--limit", "2",
                        "--out", "elsewhere", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "elsewhere" / "test.json").read_text())["prompts"] == 2


@pytest.mark.parametrize(("args", "body", "message"), [
    ((), CONFIG, "expected exactly one of --model PATH, --checkpoint DIR, --endpoint URL; got none"),
    (("--model", "m", "--endpoint", "http://x"), CONFIG, "got --model, --endpoint"),
    (("--model", "no-such-model"), CONFIG, "--model"),
    (("--checkpoint", "."), CONFIG, "--checkpoint: .: no complete checkpoint"),
    (("--endpoint", "http://127.0.0.1:9/v1"), CONFIG, "--endpoint 'http://127.0.0.1:9/v1': GET"),
    (("--endpoint", "http://x", "--eval-set", "nope"), CONFIG,
     "--eval-set 'nope': not an eval set of CONFIG (expected one of ['arith'])"),
    (("--endpoint", "http://x"), CONFIG.replace('name = "arith"\npath = "test.jsonl"', 'name = "arith"\npath = "gone.jsonl"'),
     "data.eval 'arith': DataConfig.path='gone.jsonl': no such file"),
    (("--endpoint", "http://x"), CONFIG.replace("[[data.eval]]\nname = \"arith\"\npath = \"test.jsonl\"\n", ""),
     "CONFIG has no [[data.eval]] set"),
    (("--endpoint", "http://x"), CONFIG.replace("toy_arithmetic", "toy_arith"),
     "unknown environment 'toy_arith'; did you mean 'toy_arithmetic'"),
    (("--endpoint", "http://x"), CONFIG.replace("toy_arithmetic", "no_such_module:Env"),
     "environment.name: environment 'no_such_module:Env': cannot import module 'no_such_module' (No module named"),
    (("--endpoint", "http://x"), CONFIG.replace("[logging]", "[logging]\nverbose = true"),
     "logging.verbose: unknown key 'verbose' in section [logging] (valid keys: log_every, run_dir,"),
    (("--endpoint", "http://x"), CONFIG.replace("[logging]", "[logging]\nlog_every = 0"),
     "logging.log_every = 0 (set by file): expected a value >= 1"),
    (("--endpoint", "http://x"), CONFIG.replace("[logging]", "[logging\n"),
     "TOML syntax error: Expected ']' at the end of a table declaration (at line"),
    (("--endpoint", "http://x", "rollout.sampling.temprature=0"), CONFIG,
     "rollout.sampling.temprature: unknown key 'temprature' in section [rollout.sampling]; did you mean "
     "'temperature'?"),
    (("--endpoint", "http://x", "--api-key-env", "AGENTRL_TEST_NO_SUCH_VAR"), CONFIG,
     "--api-key-env 'AGENTRL_TEST_NO_SUCH_VAR': that environment variable is not set"),
], ids=["no-source", "two-sources", "bad-model", "not-a-checkpoint", "unreachable", "unknown-set", "missing-data",
        "no-eval-set", "unknown-env", "unimportable-env", "unknown-key", "out-of-range", "toml-syntax", "bad-override", "no-api-key"])
def test_eval_bad_command_lines(tmp_path: Path, args: tuple[str, ...], body: str, message: str) -> None:
    config = _write(tmp_path, body)
    proc = _agentrl("eval", str(config), *args, cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_eval_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    config = _write(tmp_path, CONFIG.replace("[logging]", "[logging\n"))
    proc = _agentrl("eval", str(config), "--endpoint", "http://x", cwd=tmp_path)
    line = CONFIG.splitlines().index("[logging]") + 1
    assert proc.returncode == 2 and f"line {line}" in proc.stderr, proc.stderr


def test_eval_missing_config(tmp_path: Path) -> None:
    proc = _agentrl("eval", "nope.toml", "--endpoint", "http://x", cwd=tmp_path)
    assert proc.returncode == 2 and "error: nope.toml: no such config file" in proc.stderr


def test_eval_help_has_examples(tmp_path: Path) -> None:
    proc = _agentrl("eval", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and "agentrl eval toy.toml --checkpoint runs/exp1" in proc.stdout


def test_eval_print_config_shows_each_value_and_its_source(tmp_path: Path) -> None:
    """--print-config needs no model source; --model shows up as an override of model.path."""
    config = _write(tmp_path, CONFIG)
    other = tmp_path / "other-model"
    other.symlink_to(build_tiny_model())
    proc = _agentrl("eval", str(config), "rollout.sampling.temperature=0.5", "--model", str(other), "--print-config",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split(" = ")[0]: line for line in proc.stdout.splitlines()[1:]}
    assert proc.stdout.startswith(f"# resolved config from {config}")
    assert lines["rollout.sampling.temperature"].endswith("# override") and " = 0.5 " in lines["rollout.sampling.temperature"]
    assert lines["model.path"].endswith("# override") and str(other) in lines["model.path"]
    assert lines["environment.name"].endswith("# file") and lines["rollout.router.policy"].endswith("# default")
    assert not (tmp_path / "run").exists()
    proc = _agentrl("eval", str(config), "rollout.sampling.temprature=0.5", "--print-config", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown key 'temprature'" in proc.stderr
