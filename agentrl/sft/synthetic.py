"""Synthetic tool-use conversations of the toy arithmetic task, for SFT warm-ups and tests.

:func:`arithmetic_conversations` writes, for each row of
:func:`~agentrl.environments.make_arithmetic_rows`, the conversation the winning policy has with
:class:`~agentrl.environments.ToyArithmeticEnv`: the environment's own opening (system prompt and
question), a call to the real ``calculator`` tool with the expression, the tool's actual output as
the environment words it, and the boxed answer copied from it. With ``direct_rate`` > 0 that share
of the rows answers at once with a wrong number of the same length instead (no tool call), so a
model warmed up on the data calls the tool only part of the time and RL has something to fix.

Example::

    rows = make_arithmetic_rows(256, seed=0)
    save = [json.dumps(c) for c in arithmetic_conversations(rows, seed=0)]
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["arithmetic_conversations"]

_QUESTION = re.compile(r"(-?\d+)\s*\*\s*(-?\d+)")


def arithmetic_conversations(rows: Iterable[Mapping[str, Any]], *, system_prompt: str | None = None,
                             direct_rate: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """One ``{"messages": [...], "tools": [...]}`` conversation per toy arithmetic row (module doc).

    ``system_prompt`` ``None``: the environment's default. Raises ``ValueError`` for a row whose
    question holds no ``a * b`` product or a ``direct_rate`` outside [0, 1].
    """
    from agentrl.environments.arithmetic import SYSTEM_PROMPT
    from agentrl.tools import calculator, tool_schema

    if not 0.0 <= direct_rate <= 1.0:
        raise ValueError(f"direct_rate={direct_rate!r}: expected a share in [0, 1]")
    system = SYSTEM_PROMPT if system_prompt is None else system_prompt
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        question = str(row.get("question", ""))
        match = _QUESTION.search(question)
        if match is None:
            raise ValueError(f"rows[{i}].question={question!r:.80}: expected an 'a * b' product")
        messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        if rng.random() < direct_rate:
            answer = str(calculator.fn(f"{match[1]} * {match[2]}"))
            wrong = answer
            while wrong == answer:
                wrong = str(rng.randint(10 ** (len(answer) - 1), 10 ** len(answer) - 1))
            messages.append({"role": "assistant", "content": f"\\boxed{{{wrong}}}"})
        else:
            expression = f"{match[1]} * {match[2]}"
            result = str(calculator.fn(expression))
            messages += [
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}]},
                {"role": "tool", "content": result, "name": "calculator"},
                {"role": "assistant", "content": f"\\boxed{{{result}}}"},
            ]
        out.append({"messages": messages, "tools": [tool_schema(calculator)]})
    return out
