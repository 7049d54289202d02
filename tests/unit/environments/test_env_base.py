"""Environment base class: default step, failure policy per kind, limits, groups, row handling."""

from __future__ import annotations

import asyncio
import pickle
import time
from typing import Any

import pytest
from pydantic import BaseModel

from agentrl.chat.types import FailureKind, Message, ToolCall, ToolCallFailure
from agentrl.environments.base import Environment, EpisodeDoneError, StepResult
from agentrl.environments.group import make_group
from agentrl.environments.policy import EnvLimits, FailureAction, FailurePolicy
from agentrl.tools import ToolResult
from agentrl.trajectory import StopReason, Trajectory


class FakeTool:
    """A fake tool (the real tools are exercised in tests/integration)."""

    def __init__(self, name: str, fn: Any, delay_s: float = 0.0) -> None:
        self.name, self.description, self.fn, self.delay_s = name, f"{name} tool", fn, delay_s
        self.parameters = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
        self.calls: list[dict[str, Any]] = []
        self.spans: list[tuple[float, float]] = []  # (start, end) of each call, to see overlap

    async def __call__(self, **arguments: Any) -> Any:
        start = time.perf_counter()
        self.calls.append(arguments)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.spans.append((start, time.perf_counter()))
        return self.fn(**arguments)


class Env(Environment):
    async def reset(self) -> list[Message]:
        return [Message(role="user", content=str(self.task["q"]))]

    def reward(self, trajectory: Trajectory) -> float:
        return 1.0


def make_env(*tools: FakeTool, **kw: Any) -> Env:
    env = Env({"q": "hi"}, **kw)
    for t in tools:
        env.register_tool(t)
    return env


def call(name: str, x: int = 1, i: int = 0) -> ToolCall:
    return ToolCall(name=name, arguments={"x": x}, id=f"c{i}")


def reply(*calls: ToolCall) -> Message:
    return Message(role="assistant", content="r", tool_calls=list(calls))


async def test_no_calls_ends_with_no_tool_calls_and_refuses_a_later_step() -> None:
    env = make_env()
    assert await env.reset() == [Message(role="user", content="hi")]
    res = await env.step(Message(role="assistant", content="\\boxed{1}"))
    assert res.done and res.stop_reason is StopReason.NO_TOOL_CALLS and res.messages == []
    with pytest.raises(EpisodeDoneError, match="single-use"):
        await env.step(Message(role="assistant", content="again"))


async def test_tool_results_come_back_in_call_order_and_run_concurrently() -> None:
    slow = FakeTool("slow", lambda x: f"slow {x}", delay_s=0.3)
    fast = FakeTool("fast", lambda x: f"fast {x}", delay_s=0.3)
    env = make_env(slow, fast)
    res = await env.step(reply(call("slow", 1, 0), call("fast", 2, 1), call("slow", 3, 2)))
    assert not res.done
    assert [m.content for m in res.messages] == ["slow 1", "fast 2", "slow 3"]
    assert [m.tool_call_id for m in res.messages] == ["c0", "c1", "c2"]
    assert all(m.role == "tool" for m in res.messages)
    spans = sorted(slow.spans + fast.spans)
    assert all(later[0] < spans[0][1] for later in spans[1:]), "a call started after another had finished"
    assert env.tool_calls == 3 and env.successful_tool_calls == 3


@pytest.mark.parametrize("action", list(FailureAction))
@pytest.mark.parametrize("kind", list(FailureKind))
async def test_every_failure_kind_under_every_policy(kind: FailureKind, action: FailureAction) -> None:
    """Parse kinds arrive as parser failures, tool kinds as tool results; each policy acts as documented."""
    policy = FailurePolicy(overrides={kind: action}, penalty=-0.2)
    if kind in (FailureKind.TOOL_ERROR, FailureKind.TOOL_TIMEOUT, FailureKind.SANDBOX_ERROR):
        tool = FakeTool("t", lambda x: ToolResult.error(kind, f"it broke ({kind.value})"))
        env = make_env(tool, failure_policy=policy)
        res = await env.step(reply(call("t")))
    elif kind is FailureKind.UNKNOWN_TOOL:
        env = make_env(FakeTool("t", lambda x: "ok"), failure_policy=policy)
        res = await env.step(reply(call("nope")))
    else:
        env = make_env(failure_policy=policy)
        res = await env.step(reply(), [ToolCallFailure(kind, "bad thing")])
    assert res.failures == [kind]
    assert env.failure_counts[kind.value] == 1
    if action is FailureAction.END:
        assert res.done and res.stop_reason is StopReason.FAILED and res.messages == []
        return
    if action is FailureAction.RECORD and not kind.value.startswith(("tool_", "sandbox_", "unknown_")):
        # Counted only: no message, and a reply with no call is an answer.
        assert res.done and res.stop_reason is StopReason.NO_TOOL_CALLS and res.messages == []
        assert res.reward_parts == {}
        return
    assert not res.done and len(res.messages) == 1 and res.messages[0].role == "tool"
    content = str(res.messages[0].content)
    assert kind.value in content or "broke" in content
    if action is FailureAction.PENALIZE:
        assert res.reward_parts == {"failure_penalty": -0.2}
    else:
        assert res.reward_parts == {}


async def test_tool_exception_becomes_a_tool_error_value() -> None:
    def boom(x: int) -> str:
        raise ZeroDivisionError("division by zero")

    env = make_env(FakeTool("t", boom))
    res = await env.step(reply(call("t")))
    assert res.failures == [FailureKind.TOOL_ERROR]
    assert "ZeroDivisionError: division by zero" in str(res.messages[0].content)
    assert env.successful_tool_calls == 0 and env.tool_calls == 1


async def test_a_long_tool_exception_message_is_cut_short() -> None:
    def boom(x: int) -> str:
        raise RuntimeError("x" * 5000)

    env = make_env(FakeTool("t", boom))
    content = str((await env.step(reply(call("t")))).messages[0].content)
    assert content.startswith("Error: tool_error: RuntimeError: xxx") and content.endswith(" ...")
    assert len(content) < 600


async def test_plain_strings_and_tool_results_both_come_back_as_tool_messages() -> None:
    env = make_env(FakeTool("s", lambda x: "plain"), FakeTool("r", lambda x: ToolResult("typed")))
    res = await env.step(reply(call("s", i=0), call("r", i=1)))
    assert [m.content for m in res.messages] == ["plain", "typed"] and res.failures == []


async def test_mixed_success_and_failure_in_one_turn_keeps_order_and_counts() -> None:
    ok = FakeTool("ok", lambda x: "fine")
    bad = FakeTool("bad", lambda x: ToolResult.error(FailureKind.TOOL_TIMEOUT, "nope"))
    env = make_env(ok, bad, failure_policy=FailurePolicy(overrides={"tool_timeout": "penalize"}))
    res = await env.step(reply(call("ok", i=0), call("bad", i=1), call("ok", i=2)),
                         [ToolCallFailure(FailureKind.MALFORMED_JSON, "trailing comma")])
    assert [m.content for m in res.messages][:3] == ["fine", "nope", "fine"]
    assert "malformed_json: trailing comma" in str(res.messages[3].content)
    assert res.failures == [FailureKind.MALFORMED_JSON, FailureKind.TOOL_TIMEOUT]
    assert res.reward_parts == {"failure_penalty": -0.1}


async def test_max_turns_ends_the_episode_after_the_last_turn() -> None:
    env = make_env(FakeTool("t", lambda x: "r"), limits=EnvLimits(max_turns=2))
    first = await env.step(reply(call("t")))
    second = await env.step(reply(call("t")))
    assert not first.done
    assert second.done and second.stop_reason is StopReason.MAX_TURNS and len(second.messages) == 1


async def test_max_tool_calls_runs_what_fits_then_ends() -> None:
    tool = FakeTool("t", lambda x: f"r{x}")
    env = make_env(tool, limits=EnvLimits(max_tool_calls=3))
    r1 = await env.step(reply(call("t", 1), call("t", 2)))
    assert not r1.done
    r2 = await env.step(reply(call("t", 3), call("t", 4)))
    assert r2.done and r2.stop_reason is StopReason.MAX_TOOL_CALLS
    assert [m.content for m in r2.messages] == ["r3"] and r2.info["tool_calls_skipped"] == 1
    assert [c["x"] for c in tool.calls] == [1, 2, 3]


async def test_reaching_the_tool_cap_exactly_still_lets_the_model_answer() -> None:
    env = make_env(FakeTool("t", lambda x: "r"), limits=EnvLimits(max_tool_calls=1))
    assert not (await env.step(reply(call("t")))).done
    final = await env.step(Message(role="assistant", content="done"))
    assert final.stop_reason is StopReason.NO_TOOL_CALLS


async def test_failure_end_takes_precedence_over_turn_cap() -> None:
    env = make_env(limits=EnvLimits(max_turns=1), failure_policy=FailurePolicy(default="end"))
    res = await env.step(reply(), [ToolCallFailure(FailureKind.UNTERMINATED, "no closer")])
    assert res.stop_reason is StopReason.FAILED


def test_policy_and_limits_validate_with_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"FailurePolicy.overrides key: got 'bogus'"):
        FailurePolicy(overrides={"bogus": "end"})
    with pytest.raises(ValueError, match=r"overrides\['tool_error'\]: got 'explode'"):
        FailurePolicy(overrides={"tool_error": "explode"})
    with pytest.raises(ValueError, match="penalty"):
        FailurePolicy(penalty=0.5)
    with pytest.raises(ValueError, match=r"EnvLimits.max_turns: got 0"):
        EnvLimits(max_turns=0)
    with pytest.raises(ValueError, match="max_context_tokens"):
        EnvLimits(max_context_tokens=1)
    assert FailurePolicy(overrides={"tool_error": "end"}).action_for(FailureKind.TOOL_ERROR) is FailureAction.END


def test_step_result_validates_messages_and_reasons() -> None:
    with pytest.raises(ValueError, match=r"messages\[0\].role='assistant'"):
        StepResult(messages=[Message(role="assistant", content="x")])
    with pytest.raises(ValueError, match="only when done"):
        StepResult(stop_reason=StopReason.MAX_TURNS)
    assert StepResult(done=True).stop_reason is StopReason.ENV_DONE


class Task(BaseModel):
    prompt: str
    label: str


class TypedEnv(Env):
    task_type = Task

    async def reset(self) -> list[Message]:
        return [Message(role="user", content=self.task.prompt)]


def test_rows_are_copied_and_typed_rows_validated() -> None:
    row = {"q": ["nested"]}
    env = Env(row)
    env.task["q"].append("mutated")
    assert row == {"q": ["nested"]}
    assert TypedEnv({"prompt": "p", "label": "1"}).task == Task(prompt="p", label="1")
    with pytest.raises(ValueError, match=r"field label: Field required"):
        TypedEnv({"prompt": "p"})
    with pytest.raises(TypeError, match="expected a row mapping"):
        Env(["not", "a", "row"])  # type: ignore[arg-type]


def test_register_tool_rejects_duplicates_and_non_tools() -> None:
    env = make_env(FakeTool("t", lambda x: "r"))
    with pytest.raises(ValueError, match="already registered"):
        env.register_tool(FakeTool("t", lambda x: "r"))
    with pytest.raises(TypeError, match="non-empty 'name'"):
        env.register_tool(object())  # type: ignore[arg-type]
    assert env.tool_specs()[0]["function"]["name"] == "t"


class DeclaredToolEnv(Env):
    tools = (FakeTool("shared", lambda x: "s"),)


async def test_group_members_are_independent_and_picklable() -> None:
    row = {"q": "same"}
    group = make_group(DeclaredToolEnv, row, 4, group_id="g1")
    assert len(group) == 4 and group.group_id == "g1"
    await group.envs[0].step(reply(call("shared")))
    assert group.envs[0].tool_calls == 1 and all(e.tool_calls == 0 for e in group.envs[1:])
    group.envs[0].task["q"] = "changed"
    assert all(e.task["q"] == "same" for e in group.envs[1:]) and row == {"q": "same"}
    copy = pickle.loads(pickle.dumps(make_env()))
    assert isinstance(copy, Env) and copy.task == {"q": "hi"}
    with pytest.raises(ValueError, match="size=0"):
        make_group(Env, row, 0)
    shared = Env(row)
    with pytest.raises(ValueError, match="shared instances"):
        make_group(lambda r: shared, row, 2)


def test_an_environment_owns_its_row_copy_shallow_or_deep() -> None:
    """Rows of immutable values are copied shallowly (cheap: every member of every group builds one);
    a row with a nested value is deep-copied, so no environment changes another's row."""
    from agentrl.environments.base import _own_copy

    flat = {"question": "What is 2 * 3?", "answer": "6", "n": 2}
    copied = _own_copy(flat)
    assert copied == flat and copied is not flat
    nested = {"question": "q", "hints": ["a", "b"]}
    deep = _own_copy(nested)
    deep["hints"].append("c")
    assert nested["hints"] == ["a", "b"]
