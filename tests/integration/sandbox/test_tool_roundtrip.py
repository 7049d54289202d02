"""Tool schema round trip: a @tool function's schema renders unchanged in the three shipped chat
templates, and the calls those templates render parse back into calls that validate and run."""

from __future__ import annotations

import json
from typing import Literal

import pytest

from agentrl.chat import ChatTemplate, Message, ToolCall, parse_tool_calls
from agentrl.chat.types import FailureKind
from agentrl.tools import PythonTool, calculator, tool, validate_call

pytestmark = pytest.mark.integration


@tool
def search_docs(query: str, limit: int = 5, mode: Literal["fast", "exact"] = "fast",
                tags: list[str] | None = None) -> str:
    """Search the documentation.

    Args:
        query: What to look for.
        limit: Maximum number of hits.
        mode: Matching strategy.
        tags: Only pages with these tags.
    """
    return json.dumps({"query": query, "limit": limit, "mode": mode, "tags": tags})


def assistant_text(rendered: str) -> str:
    """The last assistant turn of a rendered conversation (what the model would have sampled)."""
    return rendered.rsplit("<|im_start|>assistant\n", 1)[1]


@pytest.mark.parametrize(("name", "listing"), [("qwen3", "json"), ("qwen3_5", "json"), ("qwen3_coder", "xml")])
async def test_schema_renders_and_parsed_calls_validate(name: str, listing: str) -> None:
    template = ChatTemplate.from_name(name)
    python = PythonTool(pool_size=1, timeout_s=5)  # a real bwrap sandbox, owned by the tool
    tools = [search_docs, calculator, python]
    specs = [t.schema() for t in tools]
    prompt = template.render([Message(role="user", content="hi")], tools=specs, add_generation_prompt=True)
    for spec in specs:
        fn = spec["function"]
        if listing == "json":
            assert json.dumps(spec, ensure_ascii=False) in prompt  # listed verbatim
        else:
            assert fn["name"] in prompt and fn["description"] in prompt
            for pname, prop in fn["parameters"]["properties"].items():
                assert pname in prompt and prop.get("description", "") in prompt
    arguments = {"query": "sandbox limits", "limit": 3, "mode": "exact", "tags": ["a", "b"]}
    history = [Message(role="user", content="hi"),
               Message(role="assistant", content="", tool_calls=[
                   ToolCall("search_docs", arguments), ToolCall("calculator", {"expression": "2 ** 8"}),
                   ToolCall("python", {"code": "import math\nprint(math.comb(5, 2))"})])]
    reply = parse_tool_calls(assistant_text(template.render(history, tools=specs)), template.tool_call_format, tools)
    assert reply.failures == []
    assert [(c.name, c.arguments) for c in reply.calls] == [
        ("search_docs", arguments), ("calculator", {"expression": "2 ** 8"}),
        ("python", {"code": "import math\nprint(math.comb(5, 2))"})]
    by_name = {t.name: t for t in tools}
    outputs = []
    try:
        for call in reply.calls:
            assert validate_call(by_name[call.name], call.arguments) == []
            result = await by_name[call.name](**call.arguments)
            assert not result.is_error, result
            outputs.append(result.content)
    finally:
        await python.close()
    assert outputs[1:] == ["256", "10\n"]


@pytest.mark.parametrize(("fmt", "text"), [
    ("json", '<tool_call>\n{"name": "search_docs", "arguments": {"limit": 2}}\n</tool_call>'),
    ("xml", "<tool_call>\n<function=search_docs>\n<parameter=limit>\n2\n</parameter>\n</function>\n</tool_call>"),
])
async def test_invalid_calls_fail_the_same_way_in_parser_and_tool(fmt: str, text: str) -> None:
    reply = parse_tool_calls(text, fmt, [search_docs])  # type: ignore[arg-type]
    kinds = {f.kind for f in reply.failures}
    assert FailureKind.MISSING_REQUIRED_ARGUMENT in kinds
    result = await search_docs(limit=2)
    assert result.error_kind is FailureKind.MISSING_REQUIRED_ARGUMENT
