"""Tolerated parse failures: counted, but by default they change neither the episode nor the reward.

Each case parses a real completion with the default (serving-parity) parser, then steps an
environment with the parsed message and failures, and compares with the same call written
cleanly: same tool messages, same reward parts, same end of episode. A failure policy that names
the kind does change the episode.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from agentrl.chat import parse_tool_calls
from agentrl.chat.parse import CallFormat
from agentrl.chat.types import FailureKind
from agentrl.environments.base import Environment, StepResult
from agentrl.environments.policy import FailurePolicy
from agentrl.trajectory import StopReason, Trajectory


class Echo:
    """A fake tool: echoes its arguments."""

    name = "echo"
    description = "echo"
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {"text": {"type": "string"},
                                                                           "flag": {"type": "boolean"}},
                                            "required": ["text"]}

    async def __call__(self, **arguments: Any) -> str:
        return f"echo {sorted(arguments.items())}"


class Now:
    name = "now"
    description = "time"
    parameters: ClassVar[dict[str, Any]] = {}

    async def __call__(self, **arguments: Any) -> str:
        return "12:00"


class Env(Environment):
    tools: ClassVar[list[Any]] = [Echo(), Now()]

    async def reset(self) -> list[Any]:
        return []

    def reward(self, trajectory: Trajectory) -> float:
        return 1.0


TOOLS = [{"name": "echo", "parameters": Echo.parameters}, {"name": "now", "parameters": {}}]
CLEAN_JSON = '<tool_call>\n{"name": "echo", "arguments": {"text": "hi"}}\n</tool_call>'
CLEAN_XML = "<tool_call>\n<function=echo>\n<parameter=text>\nhi\n</parameter>\n</function>\n</tool_call>"
# (format, tolerated completion, the clean completion that serves the same call, the kind reported)
CASES: list[tuple[CallFormat, str, str, FailureKind]] = [
    ("json", CLEAN_JSON + "\nThat should do it.", CLEAN_JSON, FailureKind.TEXT_AFTER_CALL),
    ("json", '<tool_call>\n{"name": "now"}\n</tool_call>',
     '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>', FailureKind.MALFORMED_JSON),
    ("xml", CLEAN_XML[:-len("</tool_call>")], CLEAN_XML, FailureKind.UNTERMINATED),
    ("xml", CLEAN_XML.replace("hi\n</parameter>", "hi\n<parameter=flag>\nyes\n</parameter>"),
     "<tool_call>\n<function=echo>\n<parameter=text>\nhi\n</parameter>\n<parameter=flag>\nfalse\n</parameter>\n"
     "</function>\n</tool_call>", FailureKind.UNTERMINATED),
    ("xml", CLEAN_XML.replace("<parameter=text>\nhi\n</parameter>", "<parameter=text>\n\n</parameter>"),
     CLEAN_XML.replace("<parameter=text>\nhi\n</parameter>", "<parameter=text>\n\n</parameter>"), FailureKind.EMPTY_CALL),
]


async def _step(fmt: CallFormat, text: str, policy: FailurePolicy | None = None) -> tuple[Env, StepResult]:
    reply = parse_tool_calls(text, fmt, TOOLS)
    env = Env({}, failure_policy=policy)
    return env, await env.step(reply.to_message(), reply.failures)


@pytest.mark.parametrize("fmt, text, clean, kind", CASES, ids=[f"{c[0]}-{c[3].value}-{i}" for i, c in enumerate(CASES)])
async def test_tolerated_failures_change_nothing_by_default(fmt: CallFormat, text: str, clean: str,
                                                            kind: FailureKind) -> None:
    reply = parse_tool_calls(text, fmt, TOOLS)
    assert reply.calls and kind in [f.kind for f in reply.failures] and all(f.tolerated for f in reply.failures)
    env, res = await _step(fmt, text)
    _, clean_res = await _step(fmt, clean)
    assert [m.to_dict() for m in res.messages] == [m.to_dict() for m in clean_res.messages]
    assert res.reward_parts == clean_res.reward_parts == {}
    assert (res.done, res.stop_reason) == (clean_res.done, clean_res.stop_reason)
    assert res.failures == [] and kind in res.tolerated
    assert env.failure_counts[f"tolerated/{kind.value}"] >= 1 and env.failure_counts[kind.value] == 0
    # Even a policy that penalises everything by default leaves tolerated kinds alone.
    _, strict_default = await _step(fmt, text, FailurePolicy(default="penalize"))
    assert strict_default.reward_parts == {} and len(strict_default.messages) == len(clean_res.messages)


@pytest.mark.parametrize("fmt, text, clean, kind", CASES, ids=[f"{c[0]}-{c[3].value}-{i}" for i, c in enumerate(CASES)])
async def test_a_policy_naming_a_tolerated_kind_acts_on_it(fmt: CallFormat, text: str, clean: str,
                                                          kind: FailureKind) -> None:
    _, clean_res = await _step(fmt, clean)
    env, penalized = await _step(fmt, text, FailurePolicy(overrides={kind: "penalize"}, penalty=-0.3))
    assert kind in penalized.failures and penalized.reward_parts["failure_penalty"] <= -0.3
    assert len(penalized.messages) > len(clean_res.messages)  # the feedback message
    assert any(kind.value in str(m.content) for m in penalized.messages)
    assert env.failure_counts[kind.value] >= 1
    _, ended = await _step(fmt, text, FailurePolicy(overrides={kind: "end"}))
    assert ended.done and ended.stop_reason is StopReason.FAILED


async def test_strict_parsing_turns_tolerated_defects_into_failures() -> None:
    reply = parse_tool_calls('<tool_call>\n{"name": "now"}\n</tool_call>', "json", TOOLS, strict=True)
    assert reply.calls == [] and not any(f.tolerated for f in reply.failures)
    env = Env({})
    res = await env.step(reply.to_message(), reply.failures)
    assert res.failures == [FailureKind.MALFORMED_JSON] and not res.done and len(res.messages) == 1


def test_register_tool_checks_the_schema_and_accepts_type_aliases() -> None:
    class Tool:
        description = "t"

        def __init__(self, name: str, parameters: Any) -> None:
            self.name, self.parameters = name, parameters

        async def __call__(self, **arguments: Any) -> str:
            return "ok"

    env = Env({})
    env.register_tool(Tool("aliases", {"type": "object", "properties": {"x": {"type": "float"}, "n": {"type": "int"}}}))
    with pytest.raises(ValueError, match=r"register_tool: tool 'bad'.*JSON schema"):
        env.register_tool(Tool("bad", {"type": "object", "properties": {"x": {"type": 3}}}))
    with pytest.raises(ValueError, match=r"register_tool: tool 'worse'.*JSON-schema object"):
        env.register_tool(Tool("worse", [1, 2]))
