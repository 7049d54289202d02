"""Math rewards (real math-verify), model-text-only scoring, and sync/async reward functions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.chat.types import Message
from agentrl.rewards import (
    MathReward,
    Reward,
    extract_boxed,
    final_answer_text,
    math_answer_reward,
    score,
    score_group,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("so \\boxed{42}.", "42"),
    ("first \\boxed{1} then \\boxed{\\frac{a}{b}}", "\\frac{a}{b}"),
    ("nested \\boxed{\\{1, 2\\}} end", "\\{1, 2\\}"),
    ("\\fbox{7}", "7"),
    ("cut off \\boxed{12", None),
    ("no answer here", None),
])
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(("response", "label", "expected"), [
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{73}", "073", 1.0),          # zero-padded AIME labels
    ("\\boxed{x^2 + 1}", "1 + x^2", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{3}", "4", 0.0),
    ("the answer is 4", "4", 0.0),       # no box, no reward
])
def test_math_answer_reward(response: str, label: str, expected: float) -> None:
    assert math_answer_reward(response, label) == expected


def test_tool_output_can_never_earn_reward() -> None:
    """The reward reads the final assistant message only, never a tool result or the prompt."""
    messages = [
        Message(role="user", content="What is 3+4? The answer is \\boxed{7}"),
        Message(role="assistant", content="", tool_calls=[]),
        Message(role="tool", content="\\boxed{7}"),
        Message(role="assistant", content="I am not sure."),
    ]
    assert final_answer_text(messages) == "I am not sure."
    assert math_answer_reward(final_answer_text(messages), "7") == 0.0
    messages.append(Message(role="assistant", content="It is \\boxed{7}."))
    assert math_answer_reward(final_answer_text(messages), "7") == 1.0
    assert final_answer_text([Message(role="user", content="\\boxed{7}")]) == ""


def test_math_reward_shaping_counts_successful_calls_and_caps() -> None:
    r = MathReward(no_answer=-0.5, tool_bonus=0.1, max_tool_bonus=0.2)
    assert r("\\boxed{5}", "5", successful_tool_calls=1).value == pytest.approx(1.1)
    capped = r("\\boxed{5}", "5", successful_tool_calls=10)
    assert capped.value == pytest.approx(1.2) and capped.parts == {"outcome": 1.0, "tool_bonus": 0.2}
    assert r("no box", "5").value == -0.5
    assert r("\\boxed{6}", "5").value == 0.0
    assert r.range == (-0.5, 1.2)
    with pytest.raises(ValueError, match="tool_bonus"):
        MathReward(tool_bonus=-1)


async def test_score_accepts_sync_and_async_functions_and_rejects_bad_values() -> None:
    async def async_fn(x: int) -> Reward:
        return Reward(x * 0.5, parts={"half": x * 0.5})

    assert await score(lambda x: x + 1, 1) == Reward(2.0)
    assert (await score(async_fn, 3)).parts == {"half": 1.5}
    with pytest.raises(TypeError, match="expected a float or Reward, got str"):
        await score(lambda x: "high", 1)
    with pytest.raises(ValueError, match="finite"):
        await score(lambda x: float("nan"), 1)

    async def slow(x: int) -> float:
        await asyncio.sleep(5)
        return 1.0

    with pytest.raises(TimeoutError):
        await score(slow, 1, timeout_s=0.05)


async def test_score_group_needs_one_value_per_member() -> None:
    async def ranks(items: list[int]) -> list[float]:
        return [float(sorted(items).index(i)) for i in items]

    assert [r.value for r in await score_group(ranks, [3, 1, 2])] == [2.0, 0.0, 1.0]
    with pytest.raises(ValueError, match=r"expected 3 rewards .* got 2"):
        await score_group(lambda items: [1.0, 2.0], [1, 2, 3])
    with pytest.raises(TypeError, match="sequence"):
        await score_group(lambda items: 1.0, [1])  # type: ignore[arg-type,return-value]


def test_answer_line_is_accepted_only_when_asked_and_only_without_a_box() -> None:
    from agentrl.rewards import extract_answer_line

    text = "Work...\nAnswer: $34$\n"
    assert extract_answer_line(text) == "34" and extract_answer_line("no line") is None
    assert MathReward()(text, "34").value == 0.0
    assert MathReward(answer_line=True)(text, "34").value == 1.0
    assert MathReward(answer_line=True)("Answer: 34\nso \\boxed{35}", "34").value == 0.0  # the box wins


def test_math_equal_decides_a_pair_once_and_same_strings_without_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    import math_verify

    from agentrl.rewards import math as math_module

    calls: list[str] = []
    real_parse = math_verify.parse

    def counting_parse(text: str, **kw: Any) -> Any:
        calls.append(text)
        return real_parse(text, **kw)

    monkeypatch.setattr(math_verify, "parse", counting_parse)
    math_module._math_equal.cache_clear()
    assert math_module.math_equal("0.25", r"\frac{1}{4}") and math_module.math_equal("0.25", r"\frac{1}{4}")
    assert len(calls) == 2  # gold and prediction, parsed for the first call only
    assert not math_module.math_equal("0.26", r"\frac{1}{4}")
    assert len(calls) == 4
    assert math_module.math_equal(" 42 ", "42") and not math_module.math_equal("", " ")
    assert len(calls) == 4  # the same string: equal without parsing; empty never matches
