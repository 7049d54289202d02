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
    out = tmp_path / "evals" / "endpoint-fake-model"  # no run's folder: an endpoint belongs to none
    assert not (tmp_path / "run").exists()
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
    report = json.loads((tmp_path / "evals" / "endpoint-fake-model" / "arith.json").read_text())
    assert (report["prompts"], report["mean_reward"]) == (4, 0.5)  # the class of quiz_envs scored them


QUIZ_AGENT = r"""
import json

from agentrl.proxy import Agent

CALCULATOR = {"type": "function", "function": {"name": "calculator", "parameters": {
    "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


async def run(task, client):
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(3):
        message = (await client.chat.completions.create(model="agentrl", messages=messages,
                                                         tools=[CALCULATOR])).choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            a, b = (int(x) for x in json.loads(call.function.arguments)["expression"].split("*"))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(a * b)})


def reward(task, answer):
    return float("\\boxed{" + task["answer"] + "}" in (answer or ""))


agent = Agent(run, reward)
"""


def test_eval_endpoint_runs_an_agent_harness_against_the_endpoint(tmp_path: Path) -> None:
    """Bring your own agent: its client is pointed at the endpoint (no proxy), the last exchange kept."""
    (tmp_path / "quiz_agents.py").write_text(QUIZ_AGENT)
    config = _write(tmp_path, CONFIG.replace('"toy_arithmetic"', '"quiz_agents:agent"'))
    with FakeChatServer() as server:
        proc = _agentrl("eval", str(config), "--endpoint", server.url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "evals" / "endpoint-fake-model"
    report = json.loads((out / "arith.json").read_text())
    assert (report["prompts"], report["mean_reward"], report["message_level"]) == (4, 1.0, True)
    lines = [json.loads(x) for x in (out / "arith.episodes.jsonl").read_text().splitlines()]
    assert [m["role"] for m in lines[0]["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert {r["model"] for r in server.requests} == {"fake-model"}  # the harness's "agentrl" replaced


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


def test_eval_reads_a_run_folders_own_config_as_train_resume_does(tmp_path: Path) -> None:
    """CONFIG may be a run folder: its config.json (here written as a run writes it), its folder as run_dir."""
    from agentrl.cli.config_files import load_run_config
    from agentrl.runner.rundir import RunDirectory

    config = load_run_config(_write(tmp_path, CONFIG), []).config
    run = tmp_path / "exp1"
    RunDirectory(run, config_hash=config.hash()).write_config(config.to_dict())
    with FakeChatServer() as server:
        shown = _agentrl("eval", "exp1", "--print-config", cwd=tmp_path)
        proc = _agentrl("eval", "exp1", "--endpoint", server.url, "--limit", "1", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert 'logging.run_dir = "exp1"' in shown.stdout  # the folder is the run's
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "evals" / "endpoint-fake-model" / "arith.json").read_text())["prompts"] == 1


def test_the_eval_table_off_a_terminal_is_as_wide_as_it_needs(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped into a log (80 columns by default) the table is neither cut nor wrapped."""
    from agentrl.cli._eval_run import print_table
    from agentrl.rollout.eval import EvalReport

    monkeypatch.delenv("COLUMNS", raising=False)
    report = EvalReport(name="a_long_evaluation_set_name", prompts=128, samples=1024, mean_reward=0.4321,
                        pass_at_k={1: 0.43, 4: 0.61, 16: 0.82}, tool_call_rate=0.97, tool_calls_per_episode=2.5,
                        truncation_rate=0.01, failure_rate=0.02, failure_kinds={"malformed_json": 12, "tool_error": 3},
                        errors={"reward": 2}, wall_s=123.4)
    print_table([report], {"kind": "endpoint", "url": "http://127.0.0.1:30000/v1"}, [])
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if "a_long_evaluation_set_name" in line)
    for cell in ("128", "1024", "0.432", "0.820", "malformed_json 12, tool_error 3", "reward 2", "123.4"):
        assert cell in row, row  # every cell on the one row, whole
    assert "…" not in "\n".join(lines) and max(len(line) for line in lines) > 80
