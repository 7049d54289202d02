"""Math answer rewards with ``math-verify``, scored on the model's own text only.

The answer is the content of the **last** ``\\boxed{...}`` in the text handed in, and the text
handed in is the model's final assistant message (see :func:`final_answer_text`): never the
prompt, never a tool result. A program that *prints* ``\\boxed{7}`` therefore earns nothing — the
reward-hacking hole of scanning ``prompt + response`` with interpreter output inside it.

Equivalence is decided by ``math_verify.verify`` on both sides parsed as LaTeX, so ``0.5``,
``\\frac{1}{2}`` and ``1/2`` match, and a zero-padded label like ``"073"`` matches ``73``.

Shaping (:class:`MathReward`, all off by default):

- ``no_answer``: the value when the text holds no answer at all (a format penalty);
- ``answer_line``: also accept a last line ``Answer: ...`` when there is no ``\\boxed{}`` (the
  DAPO-Math prompt asks for that form);
- ``tool_bonus`` per *successful* tool call, capped at ``max_tool_bonus`` — failed calls never
  count, so spamming broken code cannot earn reward. Keep shaping small next to ``correct``:
  GRPO's group normalisation rescales every difference between rollouts.

Example::

    MathReward()(r"so it is \\boxed{\\frac{1}{2}}", "0.5").value          # 1.0
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.chat.types import Message
from agentrl.rewards.types import Reward

__all__ = ["MathReward", "extract_answer_line", "extract_boxed", "final_answer_text", "math_answer_reward", "math_equal"]

_BOXED_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if absent."""
    best: tuple[int, str] | None = None
    for cmd in _BOXED_COMMANDS:
        start = text.rfind(cmd + "{")
        while start != -1:
            content = _balanced(text, start + len(cmd))
            if content is not None:
                if best is None or start > best[0]:
                    best = (start, content)
                break
            start = text.rfind(cmd + "{", 0, start)
    return None if best is None else best[1].strip()


def extract_answer_line(text: str) -> str | None:
    """The text after ``Answer:`` on the last line that starts with it (``$`` delimiters dropped); None if absent."""
    for line in reversed(text.splitlines()):
        stripped = line.strip()
        if stripped.lower().startswith("answer:"):
            value = stripped[len("answer:"):].strip().strip("$").strip()
            return value or None
    return None


def _balanced(text: str, open_pos: int) -> str | None:
    depth = 0
    for i in range(open_pos, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_pos + 1: i]
    return None  # unbalanced: the answer was cut off


def math_equal(answer: str, label: str) -> bool:
    """Whether two LaTeX/plain answers are mathematically equal according to ``math_verify``.

    The same two strings are the same answer: they are equal without parsing. Other pairs are
    decided once and remembered (``math_verify`` costs ~0.5 ms a pair, and the members of a group
    mostly give the same few answers to the same label)."""
    a, b = answer.strip(), label.strip()
    if a == b:
        return bool(a)
    return _math_equal(a, b, threading.current_thread() is threading.main_thread())


COMPARE_TIMEOUT_S = 5
"""math_verify's own deadline per parse and per comparison; the pool's is a second longer."""


@functools.lru_cache(maxsize=16384)
def _math_equal(answer: str, label: str, main_thread: bool) -> bool:
    # math_verify times out with SIGALRM, which only works on a main thread; elsewhere (a reward thread,
    # a Ray actor's event loop) the comparison runs in the reward pool, whose worker is killed at the deadline
    if main_thread:
        return _compare(answer, label, timeout=COMPARE_TIMEOUT_S)
    from agentrl.rewards.pool import RewardTimeout, shared_pool

    try:
        return shared_pool().call(_compare_in_worker, answer, label, timeout_s=COMPARE_TIMEOUT_S + 1)
    except RewardTimeout:
        return False  # as math_verify's own timeout answers


def _compare_in_worker(answer: str, label: str) -> bool:
    return _compare(answer, label, timeout=COMPARE_TIMEOUT_S)  # the worker's main thread: SIGALRM works


def _compare(answer: str, label: str, *, timeout: int | None) -> bool:
    from math_verify import parse, verify  # imported lazily: it pulls in sympy

    gold = parse(_as_latex(label), parsing_timeout=timeout)  # type: ignore[arg-type]
    pred = parse(_as_latex(answer), parsing_timeout=timeout)  # type: ignore[arg-type]
    if not gold or not pred:
        return False  # unparsable and not the same string
    return bool(verify(gold, pred, timeout_seconds=timeout))


def _as_latex(text: str) -> str:
    text = text.strip()
    return text if text.startswith("$") else f"${text}$"


def math_answer_reward(response: str, label: str) -> float:
    """1.0 when the last ``\\boxed{}`` of ``response`` equals ``label``, else 0.0 (no box: 0.0):
    :class:`MathReward` with its defaults."""
    return MathReward()(response, label).value


def final_answer_text(messages: Sequence[Message]) -> str:
    """The text of the last assistant message (content only: no reasoning, no tool output).

    This is the only text a math reward should read: it was sampled by the model, it is the
    episode's final word, and tool results live in ``tool`` messages that it never includes.
    """
    for msg in reversed(messages):
        if msg.role == "assistant":
            return _text_of(msg.content)
    return ""


def _text_of(content: str | list[dict[str, Any]] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if part.get("type") == "text")


@dataclass(frozen=True)
class MathReward:
    """Outcome reward for math answers, with optional documented shaping (module doc)."""

    correct: float = 1.0
    incorrect: float = 0.0
    no_answer: float | None = None
    answer_line: bool = False
    tool_bonus: float = 0.0
    max_tool_bonus: float = 0.0

    def __post_init__(self) -> None:
        if self.tool_bonus < 0 or self.max_tool_bonus < 0:
            raise ValueError(f"MathReward: tool_bonus={self.tool_bonus}, max_tool_bonus={self.max_tool_bonus}; "
                             "expected values >= 0")

    @property
    def range(self) -> tuple[float, float]:
        """The smallest and largest value this reward can return."""
        base = [self.correct, self.incorrect] + ([self.no_answer] if self.no_answer is not None else [])
        return min(base), max(base) + self.max_tool_bonus

    def __call__(self, response: str, label: str, *, successful_tool_calls: int = 0) -> Reward:
        """Scores ``response`` (the model's final text) against ``label``."""
        answer = extract_boxed(response)
        if answer is None and self.answer_line:
            answer = extract_answer_line(response)
        if answer is None:
            outcome = self.incorrect if self.no_answer is None else self.no_answer
            parts = {"outcome": outcome}
        else:
            outcome = self.correct if math_equal(answer, label) else self.incorrect
            parts = {"outcome": outcome}
        bonus = min(self.tool_bonus * max(successful_tool_calls, 0), self.max_tool_bonus)
        if bonus:
            parts["tool_bonus"] = bonus
        return Reward(outcome + bonus, parts=parts, info={"answer": answer, "label": label,
                                                          "correct": outcome == self.correct and answer is not None})
