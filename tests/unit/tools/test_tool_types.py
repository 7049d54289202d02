"""@tool with rich parameter types: pydantic models, dataclasses, datetimes, sets, nested generics;
unexpected arguments, stray docstring entries and forward references."""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Any

import pydantic
import pytest

from agentrl.chat.schema import validate_arguments
from agentrl.chat.types import FailureKind
from agentrl.tools import tool


class Point(pydantic.BaseModel):
    x: float
    y: float = 0.0


class Route(pydantic.BaseModel):
    title: str  # a property called "title" survives the removal of pydantic's title keywords
    stops: list[Point]


@dataclasses.dataclass
class Window:
    start: datetime.datetime
    hours: int


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


SEEN: list[dict[str, Any]] = []


@tool
def plan(route: Route, window: Window, when: datetime.date, tags: set[str], weights: list[dict[str, float]],
         color: Color = Color.RED, pair: tuple[int, str] | None = None) -> str:
    """Plan a trip.

    Args:
        route: Where to go.
        window: When to go.
        when: The day.
        tags: Labels.
        weights: Per-stop weights.
        color: Paint.
        pair: Anything.
    """
    SEEN.append({"route": route, "window": window, "when": when, "tags": tags, "weights": weights,
                 "color": color, "pair": pair})
    return "ok"


GOOD = {"route": {"title": "home", "stops": [{"x": 1, "y": 2}, {"x": 3}]},
        "window": {"start": "2026-01-02T03:04:05", "hours": 2}, "when": "2026-01-02", "tags": ["a", "b"],
        "weights": [{"a": 1.5}, {"b": 2}], "color": "blue", "pair": [1, "x"]}


def test_rich_types_have_schemas_the_model_can_read() -> None:
    params = plan.parameters
    props = params["properties"]
    assert props["route"]["description"] == "Where to go." and props["route"]["required"] == ["title", "stops"]
    assert props["route"]["properties"]["title"] == {"type": "string"}
    assert props["route"]["properties"]["stops"] == {"type": "array", "items": {"$ref": "#/$defs/Point"}}
    assert params["$defs"] == {"Point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {
        "type": "number", "default": 0.0}}, "required": ["x"]}}  # nested models hoisted, no title keywords
    assert props["window"]["properties"]["start"] == {"type": "string", "format": "date-time"}
    assert props["when"] == {"type": "string", "format": "date", "description": "The day."}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "uniqueItems": True,
                             "description": "Labels."}
    assert props["weights"]["items"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["color"] == {"type": "string", "enum": ["red", "blue"], "description": "Paint.", "default": "red"}
    assert props["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]


async def test_values_arrive_as_instances() -> None:
    SEEN.clear()
    result = await plan(**GOOD)
    assert not result.is_error, result.content
    got = SEEN[-1]
    assert got["route"] == Route(title="home", stops=[Point(x=1, y=2), Point(x=3)])
    assert got["window"] == Window(start=datetime.datetime(2026, 1, 2, 3, 4, 5), hours=2)
    assert got["when"] == datetime.date(2026, 1, 2) and got["tags"] == {"a", "b"}
    assert got["color"] is Color.BLUE and got["pair"] == (1, "x") and got["weights"] == [{"a": 1.5}, {"b": 2}]


@pytest.mark.parametrize(("change", "argument", "needle"), [
    ({"route": {"title": "t", "stops": [{"y": 1}]}}, "route", "x"),
    ({"window": {"start": "not a time", "hours": 1}}, "window", "start"),
    ({"when": "yesterday"}, "when", "when"),
    ({"weights": [{"a": "heavy"}]}, "weights", "weights"),
    ({"tags": ["a", "a"]}, "tags", "tags"),
])
async def test_bad_values_are_invalid_argument_failures_before_the_call(change: dict[str, Any], argument: str,
                                                                        needle: str) -> None:
    SEEN.clear()
    result = await plan(**{**GOOD, **change})
    assert result.is_error and result.error_kind is FailureKind.INVALID_ARGUMENT_TYPE, result.content
    assert needle in result.content and SEEN == []
    # the parser checks the same schema (its $defs included) before a call ever reaches the tool
    if argument != "window" and argument != "when":
        assert validate_arguments("plan", {**GOOD, **change}, plan.parameters)


async def test_an_unexpected_argument_is_an_invalid_argument_failure() -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    result = await echo(text="a", loud=True)
    assert result.is_error and result.error_kind is FailureKind.INVALID_ARGUMENT_TYPE
    assert "argument 'loud': got True, expected no such argument (allowed: text)" in result.content


def test_docstring_entries_for_missing_parameters_fail_at_decoration() -> None:
    def search(query: str) -> str:
        """Search.

        Args:
            query: What to look for.
            limit: How many results.
        """
        return query

    with pytest.raises(TypeError, match=r"@tool search: the docstring describes 'limit', which search\(\) does not take"):
        tool(search)


def test_forward_references_resolve_or_fail_clearly() -> None:
    class Local(pydantic.BaseModel):
        n: int

    @tool
    def uses_local(item: Local) -> str:  # a string annotation (future import) naming a local class
        """Uses a local model."""
        return str(item.n)

    assert uses_local.parameters["properties"]["item"] == {"type": "object", "properties": {"n": {"type": "integer"}},
                                                           "required": ["n"]}

    def dangling(item: NoSuchThing) -> str:  # type: ignore[name-defined]  # noqa: F821
        """Refers to nothing."""
        return ""

    with pytest.raises(TypeError, match=r"@tool dangling: cannot resolve the type hint 'NoSuchThing'"):
        tool(dangling)
