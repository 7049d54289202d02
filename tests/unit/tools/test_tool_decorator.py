"""@tool: schemas from hints and docstrings, validation before the call, errors and timeouts as values."""

from __future__ import annotations

import asyncio
import enum
import time
from typing import Literal

import pytest

import agentrl.tools
from agentrl.chat.types import FailureKind
from agentrl.tools import FunctionTool, Tool, ToolResult, calculator, tool, tool_schema


class Unit(enum.Enum):
    CELSIUS = "celsius"
    KELVIN = "kelvin"


@tool
def weather(city: str, days: int = 1, unit: Unit = Unit.CELSIUS, detailed: bool | None = None,
            tags: list[str] | None = None, mode: Literal["fast", "exact"] = "fast") -> dict[str, object]:
    """Forecast for a city.

    More text that is part of the description.

    Args:
        city: The city name,
            possibly with a country.
        days (int): How many days.
        unit: Temperature unit.
    """
    return {"city": city, "days": days}


def test_schema_from_hints_and_google_docstring() -> None:
    assert isinstance(weather, FunctionTool) and isinstance(weather, Tool)
    assert weather.name == "weather"
    assert weather.description == "Forecast for a city.\n\nMore text that is part of the description."
    params = weather.parameters
    assert params["required"] == ["city"]
    props = params["properties"]
    assert props["city"] == {"type": "string", "description": "The city name, possibly with a country."}
    assert props["days"] == {"type": "integer", "description": "How many days.", "default": 1}
    assert props["unit"] == {"type": "string", "enum": ["celsius", "kelvin"], "description": "Temperature unit.",
                             "default": "celsius"}
    assert props["detailed"] == {"type": "boolean"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["mode"] == {"enum": ["fast", "exact"], "type": "string", "default": "fast"}
    assert tool_schema(weather) == weather.schema() == {
        "type": "function", "function": {"name": "weather", "description": weather.description, "parameters": params}}


def test_sphinx_docstring_and_overrides() -> None:
    @tool(name="lookup.v2", description="Custom.", timeout_s=None)
    async def lookup(key: str, n: float) -> str:
        """Ignored summary.

        :param key: The key.
        :param float n: A number.
        """
        return key * int(n)

    assert lookup.name == "lookup.v2" and lookup.description == "Custom." and lookup.timeout_s is None
    assert lookup.parameters["properties"] == {"key": {"type": "string", "description": "The key."},
                                               "n": {"type": "number", "description": "A number."}}


@pytest.mark.parametrize(("fn_src", "match"), [
    ("def f(x): pass", r"f\(x\): missing type hint"),
    ("def f(*args: int): pass", r"named arguments only"),
    ("def f(x: bytes): pass", r"f\(x\): unsupported type hint"),
    ("def f(x: dict[int, str]): pass", r"JSON objects have string keys"),
])
def test_undescribable_functions_are_rejected(fn_src: str, match: str) -> None:
    ns: dict[str, object] = {}
    exec(fn_src, ns)
    with pytest.raises(TypeError, match=match):
        tool(ns["f"])  # type: ignore[arg-type]


def test_bad_name_and_timeout_are_rejected() -> None:
    with pytest.raises(ValueError, match="name"):
        tool(name="has space")(lambda: None)
    with pytest.raises(ValueError, match="timeout_s"):
        tool(timeout_s=0)(lambda: None)


async def test_validation_before_the_call_gives_typed_errors() -> None:
    calls: list[str] = []

    @tool
    def echo(text: str, times: int = 1) -> str:
        """Echo."""
        calls.append(text)
        return text * times

    missing = await echo(times=2)
    assert missing.is_error and missing.error_kind is FailureKind.MISSING_REQUIRED_ARGUMENT
    assert "'text'" in missing.content
    wrong = await echo(text="a", times="3")
    assert wrong.is_error and wrong.error_kind is FailureKind.INVALID_ARGUMENT_TYPE and "times" in wrong.content
    assert calls == []
    ok = await echo(text="ab", times=2)
    assert ok == ToolResult("abab", metrics=ok.metrics) and not ok.is_error
    assert (await weather(city="Oslo")).content == '{"city": "Oslo", "days": 1}'


async def test_exceptions_and_timeouts_become_error_values() -> None:
    @tool
    def boom(x: int) -> int:
        """Fails."""
        raise ValueError("bad " + "x" * 2000)

    @tool(timeout_s=0.2)
    async def slow_async() -> str:
        """Sleeps."""
        await asyncio.sleep(5)
        return "never"

    @tool(timeout_s=0.2)
    def slow_sync() -> str:
        """Sleeps in a thread."""
        time.sleep(3)
        return "late"

    @tool
    async def explicit() -> ToolResult:
        """Returns its own result."""
        return ToolResult.error(FailureKind.SANDBOX_ERROR, "custom")

    r = await boom(x=1)
    assert r.is_error and r.error_kind is FailureKind.TOOL_ERROR
    assert r.content.startswith("Error: ValueError: bad x") and len(r.content) < 600
    for t in (slow_async, slow_sync):
        start = time.monotonic()
        r = await t()
        assert r.error_kind is FailureKind.TOOL_TIMEOUT and "timed out after 0.2 s" in r.content
        assert time.monotonic() - start < 2.5  # cut at the timeout, well before the 3 s or 5 s sleep ends
    assert (await explicit()).error_kind is FailureKind.SANDBOX_ERROR


async def test_sync_tools_do_not_block_the_event_loop() -> None:
    @tool
    def busy(seconds: float) -> str:
        """Blocks its thread."""
        time.sleep(seconds)
        return "done"

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        for _ in range(20):
            await asyncio.sleep(0.01)
            ticks += 1

    result, _ = await asyncio.gather(busy(seconds=0.3), tick())
    assert result.content == "done" and ticks == 20


@pytest.mark.parametrize(("expr", "value"), [
    ("(3 + 4) * 12 / 7", "12"), ("2 ** 10", "1024"), ("-7 // 2", "-4"), ("sqrt(16) + abs(-2)", "6"),
    ("1 / 3", str(1 / 3)), ("round(pi, 2)", "3.14"), ("10 % 4", "2"),
])
async def test_calculator(expr: str, value: str) -> None:
    r = await calculator(expression=expr)
    assert not r.is_error and r.content == value


@pytest.mark.parametrize("expr", ["__import__('os')", "open('x')", "9 ** 9 ** 9", "1 +", "x", "(1).real", "1 / 0"])
async def test_calculator_rejects_everything_else(expr: str) -> None:
    r = await calculator(expression=expr)
    assert r.is_error and r.error_kind is FailureKind.TOOL_ERROR and r.content.startswith("Error: ")


def test_public_surface() -> None:
    assert sorted(agentrl.tools.__all__) == sorted([
        "FunctionTool", "PythonTool", "Tool", "ToolResult", "calculator", "function_parameters",
        "render_exec_result", "tool", "tool_schema", "truncate_middle", "validate_call"])
    for name in agentrl.tools.__all__:
        assert hasattr(agentrl.tools, name)
