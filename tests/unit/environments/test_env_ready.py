"""The shipped environments (toy arithmetic with the real calculator; ReTool row handling) and the
``agentrl env check`` command."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl.chat import ChatTemplate
from agentrl.cli.main import app
from agentrl.environments.arithmetic import ArithmeticTask, ToyArithmeticEnv, make_arithmetic_rows
from agentrl.environments.conformance import check_environment
from agentrl.environments.retool import MathTask, RetoolMathEnv
from agentrl.rewards import MathReward
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.types import SamplingParams
from agentrl.testing.scripted import ScriptedClient
from agentrl.tools.sandbox import create_sandbox
from agentrl.trajectory import SegmentKind, Status, StopReason

HERE = Path(__file__).parent


def test_arithmetic_rows_are_deterministic_distinct_and_correct() -> None:
    rows = make_arithmetic_rows(200, seed=3)
    assert rows == make_arithmetic_rows(200, seed=3) and rows != make_arithmetic_rows(200, seed=4)
    assert len({r["question"] for r in rows}) == 200
    for row in rows:
        a, b = (int(x) for x in row["question"].removeprefix("What is ").removesuffix("?").split(" * "))
        assert 100 <= a <= 999 and 100 <= b <= 999 and int(row["answer"]) == a * b
        assert row["answer"] not in row["question"]
    assert len({r["answer"] for r in rows}) > 190  # answers are spread: guessing one value earns ~nothing
    with pytest.raises(ValueError, match="n=0"):
        make_arithmetic_rows(0)
    with pytest.raises(ValueError, match="exceeds the 81 distinct"):
        make_arithmetic_rows(82, digits=1)
    with pytest.raises(ValueError, match=r"field answer: String should match pattern"):
        ToyArithmeticEnv({"question": "What is 2 * 3?", "answer": "six"})


def _call(expression: str) -> str:
    return ('<think>\nCompute.\n</think>\n\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "'
            + expression + '"}}\n</tool_call><|im_end|>')


def _final(text: str) -> str:
    return "<think>\nDone.\n</think>\n\n" + text + "<|im_end|>"


@pytest.mark.parametrize(("script", "reward"), [
    ([_call("{a} * {b}"), _final("\\boxed{{ans}}")], 1.0),                   # the tool, then the answer
    ([_final("\\boxed{{guess}}")], 0.0),                                       # guessing without the tool
    ([_call("{a} * {b}"), _final("The calculator said so.")], 0.0),          # result only in the tool turn
])
async def test_toy_task_with_the_real_calculator(script: list[str], reward: float, tok: Any) -> None:
    row = make_arithmetic_rows(1, seed=11)[0]
    a, b = row["question"].removeprefix("What is ").removesuffix("?").split(" * ")
    guess = str(round(int(a) * int(b), -3))  # a close estimate is still wrong
    turns = [t.replace("{a}", a).replace("{b}", b).replace("{ans}", row["answer"]).replace("{guess}", guess)
             for t in script]
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    env = ToyArithmeticEnv(row)
    ep = await run_episode(env, template, ScriptedClient(tok, turns),
                           AgentConfig(sampling=SamplingParams(max_new_tokens=128)))
    traj = ep.trajectory
    assert (traj.status, traj.stop_reason, traj.reward) == (Status.COMPLETED, StopReason.NO_TOOL_CALLS, reward)
    if len(turns) == 2:
        assert traj.messages[3].role == "tool" and traj.messages[3].content == row["answer"]
        assert traj.metrics["successful_tool_calls"] == 1
        assert template.encode(traj.messages, env.tool_specs())[:-1] == traj.tokens  # no drift
    assert traj.segments[0].kind is SegmentKind.PROMPT
    assert "calculator" in template.decode(traj.tokens[:traj.prompt_length])


async def test_shipped_toy_environment_passes_the_conformance_check() -> None:
    report = await check_environment(ToyArithmeticEnv, make_arithmetic_rows(3))
    assert report.ok, report.format()


def test_environments_with_class_tools_pickle_and_rebind_them() -> None:
    env = ToyArithmeticEnv(make_arithmetic_rows(1)[0])
    clone = pickle.loads(pickle.dumps(env))
    assert clone.tool_specs() == env.tool_specs() and clone.task == env.task
    assert clone.tool_map["calculator"] is ToyArithmeticEnv.tools[0]


def test_retool_rows_accept_dapo_shapes_and_reject_bad_ones() -> None:
    assert MathTask.model_validate({"prompt": "2+2?", "label": 4}).label == "4"
    chat = {"prompt": [{"role": "user", "content": "Solve x."}], "label": "\\frac{1}{2}"}
    assert MathTask.model_validate(chat).prompt == chat["prompt"]
    with pytest.raises(ValueError, match="field label"):
        RetoolMathEnv({"prompt": "2+2?"})
    with pytest.raises(ValueError, match="field prompt: Value error, expected a chat list with at least one user"):
        RetoolMathEnv({"prompt": [{"role": "system", "content": "x"}], "label": "1"})
    with pytest.raises(ValueError, match="non-empty problem"):
        RetoolMathEnv({"prompt": "  ", "label": "1"})
    assert ArithmeticTask(question="q", answer="-3").answer == "-3"


async def test_retool_opening_adds_the_system_prompt_once() -> None:
    env = RetoolMathEnv({"prompt": "What is 2+2?", "label": "4"})
    try:
        opening = await env.reset()
        assert [m.role for m in opening] == ["system", "user"] and "python tool" in str(opening[0].content)
        assert [s["function"]["name"] for s in env.tool_specs()] == ["python"]
    finally:
        await env.close()
    own = RetoolMathEnv({"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}],
                         "label": "1"})
    try:
        assert [m.content for m in await own.reset()] == ["S", "Q"]
    finally:
        await own.close()


async def test_retool_episode_sandbox_has_one_worker_unless_asked_for_more() -> None:
    env = RetoolMathEnv({"prompt": "What is 2+2?", "label": "4"})
    wide = RetoolMathEnv({"prompt": "What is 2+2?", "label": "4"}, sandbox_options={"pool_size": 3})
    try:
        await env.reset()
        await wide.reset()
        assert env.python is not None and getattr(env.python.sandbox, "pool_size", None) == 1
        assert wide.python is not None and getattr(wide.python.sandbox, "pool_size", None) == 3
    finally:
        await env.close()
        await wide.close()


async def test_retool_refuses_a_shared_sandbox_together_with_sandbox_options() -> None:
    async with create_sandbox("bwrap", pool_size=1) as shared:
        env = RetoolMathEnv({"prompt": "2+2?", "label": "4"}, sandbox=shared, sandbox_options={"memory_mb": 64})
        with pytest.raises(TypeError, match="given with an existing sandbox"):
            await env.reset()
        env = RetoolMathEnv({"prompt": "2+2?", "label": "4"}, sandbox=shared)
        await env.reset()
        await env.close()
        assert env.python is not None and env.python.sandbox is shared and not shared.closed


class _BonusRetool(RetoolMathEnv):
    """RetoolMathEnv whose reward adds 0.1 per successful call up to 0.2: the top needs two calls."""

    def __init__(self, task: Any, **options: Any) -> None:
        super().__init__(task, reward=MathReward(answer_line=True, tool_bonus=0.1, max_tool_bonus=0.2), **options)


async def test_retool_reference_reply_reaches_the_top_of_its_reward_range() -> None:
    env = _BonusRetool({"prompt": "What is 2+2?", "label": "\\frac{1}{2}"})
    first = env.reference_reply([])
    assert first is not None and [c.name for c in first.tool_calls] == ["python", "python"]
    report = await check_environment(_BonusRetool, [{"prompt": "What is 2+2?", "label": "\\frac{1}{2}"}])
    assert report.ok and not report.warnings, report.format()  # the reference episode scored 1.2


async def test_ready_environments_take_a_system_prompt(tok: Any) -> None:
    row = make_arithmetic_rows(1)[0]
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    default = await ToyArithmeticEnv(row).reset()
    custom = await ToyArithmeticEnv(row, system_prompt="Multiply.").reset()
    bare = await ToyArithmeticEnv(row, system_prompt=None).reset()
    assert [m.role for m in default] == ["system", "user"] and custom[0].content == "Multiply."
    assert [m.role for m in bare] == ["user"]
    with pytest.raises(TypeError, match="system_prompt"):
        ToyArithmeticEnv(row, system_prompt=3)  # type: ignore[arg-type]
    retool_env = RetoolMathEnv({"prompt": "1+1?", "label": "2"}, system_prompt="Be brief.")
    try:
        assert (await retool_env.reset())[0].content == "Be brief."
    finally:
        await retool_env.close()
    # the prompt is most of a CPU run's sequence: the default (system text + tool schema) stays short
    tools = ToyArithmeticEnv(row).tool_specs()
    full = len(template.encode(default, tools, add_generation_prompt=True))
    assert full < 300, full  # 331 tokens before the prompt and the calculator's descriptions were trimmed
    assert len(template.encode(bare, tools, add_generation_prompt=True)) < full
    assert pickle.loads(pickle.dumps(ToyArithmeticEnv(row, system_prompt="x"))).system_prompt == "x"


# -- the command line -----------------------------------------------------------------------------
def _flat(output: str) -> str:
    """CLI output without the panel frame and line wrapping that rich adds to usage errors."""
    return " ".join(output.replace("│", " ").split())


def _rows_file(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_env_check_command_passes_the_toy_environment(tmp_path: Path) -> None:
    data = _rows_file(tmp_path, make_arithmetic_rows(4))
    result = CliRunner().invoke(app, ["env", "check", "agentrl.environments.arithmetic:ToyArithmeticEnv",
                                      "--data", str(data), "--rows", "2"])
    assert result.exit_code == 0, result.output
    assert "2 rows, 8 episodes, 0 violation(s) — OK" in result.output


def test_env_check_command_reports_violations_and_bad_arguments(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(HERE)  # broken_envs.py is importable from here, as a user's module would be
    data = _rows_file(tmp_path, [{"answer": "3"}])
    result = CliRunner().invoke(app, ["env", "check", "broken_envs:OutOfRangeEnv", "--data", str(data)])
    assert result.exit_code == 1 and "[reward_range] line 1" in result.output
    bad = CliRunner().invoke(app, ["env", "check", "broken_envs:Nope", "--data", str(data)])
    assert bad.exit_code == 2 and "has no attribute 'Nope'" in _flat(bad.output)
    not_env = CliRunner().invoke(app, ["env", "check", "broken_envs:EchoTool", "--data", str(data)])
    assert not_env.exit_code == 2 and "expected an Environment subclass" in _flat(not_env.output)
    (tmp_path / "bad.jsonl").write_text('{"answer": "3"}\n{oops\n', encoding="utf-8")
    bad_rows = CliRunner().invoke(app, ["env", "check", "broken_envs:GoodEnv", "--data", str(tmp_path / "bad.jsonl"),
                                        "--rows", "5"])
    assert bad_rows.exit_code == 2 and "bad.jsonl:2: not a JSON row" in _flat(bad_rows.output)
    assert bad_rows.output.startswith("error: ")


def test_env_check_command_names_file_lines_and_says_when_rows_run_out(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(HERE)
    data = tmp_path / "rows.jsonl"
    data.write_text('{"answer": 3}\n\n{"answer": "x"}\n', encoding="utf-8")  # a blank line, then a bad row
    result = CliRunner().invoke(app, ["env", "check", "broken_envs:TypedRowEnv", "--data", str(data), "--rows", "10",
                                      "--verbose"])
    assert result.exit_code == 1, result.output
    assert "note: --rows 10, but" in result.output and "has 2 rows; checking 2" in result.output
    assert "[row] line 3: TypedRowEnv(row) refused the row" in result.output
    assert "--- line 1, tools episode" in result.output


def test_env_check_takes_names_as_every_command_does(tmp_path: Path) -> None:
    """One resolver: a built-in name works, an unknown one lists the valid names."""
    data = _rows_file(tmp_path, make_arithmetic_rows(2))
    result = CliRunner().invoke(app, ["env", "check", "toy_arithmetic", "--data", str(data), "--rows", "1"])
    assert result.exit_code == 0 and "agentrl.environments.arithmetic:ToyArithmeticEnv: 1 rows" in result.output
    typo = CliRunner().invoke(app, ["env", "check", "toy_arith", "--data", str(data)])
    assert typo.exit_code == 2, typo.output
    message = _flat(typo.output)
    assert message.startswith("error: unknown environment 'toy_arith'; did you mean 'toy_arithmetic'")
    assert "expected one of: long_key (built-in), long_recall (built-in), retool_math (built-in), toy_arithmetic (built-in), or 'module:attr' for your own " \
           "code" in message


def test_env_check_reward_option(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(HERE)
    data = _rows_file(tmp_path, [{"answer": "3"}])
    good = CliRunner().invoke(app, ["env", "check", "broken_envs:GoodEnv", "--data", str(data),
                                    "--reward", "broken_envs:reward_ok"])
    assert good.exit_code == 0 and "reward broken_envs:reward_ok called 7 times — OK" in good.output, good.output
    bad = CliRunner().invoke(app, ["env", "check", "broken_envs:GoodEnv", "--data", str(data),
                                   "--reward", "broken_envs:reward_none_without_answer"])
    assert bad.exit_code == 1, bad.output
    assert "[reward_fn] line 1: the reward function returned None" in bad.output
    assert "(last assistant text 'Let me use the tools.')" in bad.output
    missing = CliRunner().invoke(app, ["env", "check", "broken_envs:GoodEnv", "--data", str(data),
                                       "--reward", "broken_envs:nope"])
    assert missing.exit_code == 2
    assert "--reward: reward 'broken_envs:nope': module 'broken_envs' has no attribute 'nope'" in _flat(missing.output)


def test_env_check_warns_about_a_tool_returning_none(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(HERE)
    data = _rows_file(tmp_path, [{"answer": "3"}])
    result = CliRunner().invoke(app, ["env", "check", "broken_envs:NoneToolEnv", "--data", str(data)])
    assert result.exit_code == 0, result.output  # a warning does not fail the check
    assert "warning: [tool_none] tool 'lookup' returned None on 2 of 2 calls" in result.output
