"""Full episodes with the real bubblewrap sandbox: ReTool-style math in both tool-call formats.

Only the policy is scripted (tests/integration/environments/test_env_sglang.py runs the loop
against a real SGLang server). The python tool, the sandbox, templates, parser, bridge and
trajectory are all real. The drift check: the tokens the trajectory holds equal a full render of
its messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrl.chat import ChatTemplate
from agentrl.environments import (
    FailurePolicy,
    RetoolMathEnv,
    ToyArithmeticEnv,
    check_environment,
    make_arithmetic_rows,
    make_group,
)
from agentrl.rewards import MathReward
from agentrl.rollout.agent import AgentConfig, Episode, run_episode
from agentrl.rollout.types import SamplingParams
from agentrl.testing.scripted import ScriptedClient
from agentrl.tools.sandbox import create_sandbox
from agentrl.trajectory import SegmentKind, Status, StopReason

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROW = {"prompt": [{"role": "user", "content": "What is 2**100 mod 7?"}], "label": "2"}
CONFIG = AgentConfig(sampling=SamplingParams(max_new_tokens=256))


def call(fmt: str, code: str, think: str = "Let me compute it.") -> str:
    if fmt == "qwen3":
        return (f"<think>\n{think}\n</think>\n\n<tool_call>\n"
                + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call><|im_end|>")
    return (f"{think}\n</think>\n\n<tool_call>\n<function=python>\n<parameter=code>\n{code}\n</parameter>\n"
            "</function>\n</tool_call><|im_end|>")


def final(fmt: str, text: str) -> str:
    body = f"It is done.\n</think>\n\n{text}<|im_end|>"
    return body if fmt == "qwen3_5" else "<think>\n" + body


def assert_consistent(ep: Episode, template: ChatTemplate, env: RetoolMathEnv) -> None:
    traj = ep.trajectory
    traj.validate()
    full = template.encode(traj.messages, env.tool_specs())
    assert traj.tokens == full[:-1], "token buffer drifted from the full render"
    for seg in traj.segments[1:]:
        lo, hi = seg.start - traj.prompt_length, seg.end - traj.prompt_length
        trained = seg.kind is SegmentKind.MODEL
        assert traj.loss_mask[lo:hi] == [int(trained)] * seg.length
        assert all((lp < 0) if trained else (lp == 0.0) for lp in traj.logprobs[lo:hi])


@pytest.mark.parametrize("fmt", ["qwen3", "qwen3_5"])
async def test_full_episode_with_bwrap_has_no_drift(fmt: str, tok: Any) -> None:
    template = ChatTemplate.from_name(fmt, tokenizer=tok)
    code = "x = pow(2, 100, 7)\nprint(x)"
    script = [call(fmt, code), call(fmt, "2**100 % 7", think="Check it another way."),
              final(fmt, "So the answer is \\boxed{2}.")]
    env = RetoolMathEnv(ROW)
    ep = await run_episode(env, template, ScriptedClient(tok, script), CONFIG)
    traj = ep.trajectory
    assert (traj.status, traj.stop_reason, traj.reward) == (Status.COMPLETED, StopReason.NO_TOOL_CALLS, 1.0)
    assert [m.content for m in traj.messages if m.role == "tool"] == ["2\n", "2\n"]  # real executions
    assert [m.tool_calls[0].arguments["code"] for m in traj.messages if m.tool_calls] == [code, "2**100 % 7"]
    assert traj.metrics["successful_tool_calls"] == 2 and traj.metrics["bridge/append"] == 2
    assert "bridge/sampled_text_differs" not in traj.metrics
    assert_consistent(ep, template, env)
    assert env.python is not None and env.python.sandbox.closed  # close() released the sandbox


@pytest.mark.parametrize("fmt", ["qwen3", "qwen3_5"])
async def test_printed_answers_earn_nothing_and_errors_earn_no_bonus(fmt: str, tok: Any) -> None:
    template = ChatTemplate.from_name(fmt, tokenizer=tok)
    script = [call(fmt, "print('\\\\boxed{2}')"), call(fmt, "1/0", think="Try again."),
              final(fmt, "I am not sure.")]
    env = RetoolMathEnv(ROW, reward=MathReward(tool_bonus=0.1, max_tool_bonus=0.5),
                        failure_policy=FailurePolicy(overrides={"tool_error": "penalize"}, penalty=-0.05))
    ep = await run_episode(env, template, ScriptedClient(tok, script), CONFIG)
    traj = ep.trajectory
    tool_out = [str(m.content) for m in traj.messages if m.role == "tool"]
    assert tool_out[0] == "\\boxed{2}\n" and "ZeroDivisionError" in tool_out[1]
    assert traj.metrics["failures/tool_error"] == 1
    # outcome 0 (the box was printed by the program, not written by the model) + one successful call
    # (0.1) + the tool_error penalty (-0.05)
    assert traj.reward == pytest.approx(0.05)
    assert traj.reward_parts == pytest.approx({"outcome": 0.0, "tool_bonus": 0.1, "failure_penalty": -0.05})
    assert_consistent(ep, template, env)


async def test_parallel_python_calls_run_concurrently_in_the_sandbox(tok: Any) -> None:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    sleepy = "import time\nt0 = time.time()\ntime.sleep(2.0)\nprint({}, t0, time.time())"
    two = call("qwen3", sleepy.format(1)).replace(
        "</tool_call><|im_end|>",
        "</tool_call>\n<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": sleepy.format(2)}})
        + "\n</tool_call><|im_end|>")
    async with create_sandbox("bwrap", pool_size=2) as sandbox:
        await sandbox.run("print(0)")  # warm the pool
        env = RetoolMathEnv(ROW, sandbox=sandbox)
        ep = await run_episode(env, template, ScriptedClient(tok, [two, final("qwen3", "\\boxed{2}")]), CONFIG)
        assert not sandbox.closed  # a shared sandbox belongs to its owner
    outputs = [str(m.content).split() for m in ep.trajectory.messages if m.role == "tool"]
    assert [o[0] for o in outputs] == ["1", "2"]  # results in call order
    first, second = sorted((float(o[1]), float(o[2])) for o in outputs)
    assert second[0] < first[1], "the second program started only after the first had finished: not concurrent"
    assert_consistent(ep, template, env)


async def test_a_group_shares_one_warm_sandbox(tok: Any) -> None:
    template = ChatTemplate.from_name("qwen3_5", tokenizer=tok)
    async with create_sandbox("bwrap", pool_size=2) as sandbox:
        group = make_group(lambda row: RetoolMathEnv(row, sandbox=sandbox), ROW, 4)
        answers = ["2", "3", "2", "4"]
        episodes = await asyncio.gather(*(
            run_episode(env, template, ScriptedClient(tok, [call("qwen3_5", "print(pow(2, 100, 7))"),
                                                            final("qwen3_5", f"\\boxed{{{a}}}")]),
                        CONFIG, group_id=group.group_id)
            for env, a in zip(group.envs, answers, strict=True)))
    assert [e.reward for e in episodes] == [1.0, 0.0, 1.0, 0.0]
    assert {e.trajectory.group_id for e in episodes} == {group.group_id}
    assert len({e.trajectory.rollout_id for e in episodes}) == 4


async def test_shipped_environments_pass_the_conformance_check() -> None:
    for env_cls, rows in ((RetoolMathEnv, [ROW, {"prompt": "What is 3 * 7?", "label": 21}]),
                          (ToyArithmeticEnv, make_arithmetic_rows(2))):
        report = await check_environment(env_cls, rows)
        assert report.ok, report.format()
        assert not report.warnings, report.format()  # the reference replies reached full marks


def test_env_check_command_on_the_shipped_environments(tmp_path: Path) -> None:
    agentrl = Path(sys.executable).with_name("agentrl")
    cases = {"agentrl.environments:RetoolMathEnv": [ROW], "agentrl.environments:ToyArithmeticEnv":
             make_arithmetic_rows(2)}
    for target, rows in cases.items():
        data = tmp_path / "rows.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        out = subprocess.run([str(agentrl), "env", "check", target, "--data", str(data)], capture_output=True,
                             text=True, timeout=240, cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 violation(s) — OK" in out.stdout, out.stdout
        assert "warning" not in out.stdout, out.stdout  # the reference replies reached full marks
