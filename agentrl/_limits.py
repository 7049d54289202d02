"""Value limits declared once, on a frozen dataclass's field types, and checked from both sides.

A runtime config (``SchedulerConfig``, ``SamplingParams``...) writes its simple limits into its field
annotations with :mod:`annotated_types` markers::

    @dataclass(frozen=True)
    class SchedulerConfig:
        group_size: Annotated[int, Ge(1)] = 8
        max_staleness: Annotated[int, Ge(0)] | None = None

        def __post_init__(self) -> None:
            check_limits(self)          # SchedulerConfig(group_size=0): "...group_size=0: expected an int >= 1"

pydantic reads the same markers when a run config validates the dataclass (the error then names the
key, ``rollout.scheduler.group_size``), so a limit is never written twice. Only ``Ge``, ``Gt``,
``Le`` and ``Lt`` on ``int`` and ``float`` fields are checked here; anything else stays in the
dataclass's own ``__post_init__``. A field that is ``None`` where its type allows it passes.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from annotated_types import Ge, Gt, Le, Lt

__all__ = ["check_limits"]


@dataclasses.dataclass(frozen=True)
class _Rule:
    name: str
    kind: type  # int or float
    nullable: bool
    low: float | None = None  # the bound, and whether it is allowed (``Ge``) or not (``Gt``)
    low_in: bool = True
    high: float | None = None
    high_in: bool = True

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, int if self.kind is int else (int, float)):
            return False
        if isinstance(value, float) and math.isnan(value):
            return False
        low, high = self.low, self.high
        return ((low is None or (value >= low if self.low_in else value > low))
                and (high is None or (value <= high if self.high_in else value < high)))

    @property
    def expected(self) -> str:
        what = "an int" if self.kind is int else "a number"
        low, high = self.low, self.high
        if low is not None and high is not None:
            text = f"{what} in {'[' if self.low_in else '('}{_num(low)}, {_num(high)}{']' if self.high_in else ')'}"
        elif low is not None:
            text = f"{what} {'>=' if self.low_in else '>'} {_num(low)}"
        elif high is not None:
            text = f"{what} {'<=' if self.high_in else '<'} {_num(high)}"
        else:
            text = what
        return f"None or {text}" if self.nullable else text


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _rule(name: str, hint: Any) -> _Rule | None:
    nullable = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = len(rest) < len(typing.get_args(hint))
        if len(rest) != 1:
            return None
        hint = rest[0]
    if typing.get_origin(hint) is not typing.Annotated:
        return None
    base, *marks = typing.get_args(hint)
    if base not in (int, float):
        return None
    rule = _Rule(name, base, nullable)
    for mark in marks:
        if isinstance(mark, Ge | Gt):
            low = float(mark.ge if isinstance(mark, Ge) else mark.gt)  # type: ignore[arg-type]
            rule = dataclasses.replace(rule, low=_exact(low), low_in=isinstance(mark, Ge))
        elif isinstance(mark, Le | Lt):
            high = float(mark.le if isinstance(mark, Le) else mark.lt)  # type: ignore[arg-type]
            rule = dataclasses.replace(rule, high=_exact(high), high_in=isinstance(mark, Le))
    return rule


def _exact(bound: float) -> float:
    """An integral bound as an int, so it reads ``>= 1`` and compares exactly with ints."""
    return int(bound) if bound.is_integer() else bound


_RULES: dict[type, tuple[_Rule, ...]] = {}


def _rules(cls: type) -> tuple[_Rule, ...]:
    rules = _RULES.get(cls)
    if rules is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        found = (_rule(f.name, hints[f.name]) for f in dataclasses.fields(cls))
        rules = _RULES[cls] = tuple(r for r in found if r is not None)
    return rules


def check_limits(obj: Any) -> None:
    """Raises ``ValueError("Class.field=value: expected ...")`` for the first field of the dataclass
    ``obj`` whose value is outside the limits (or not of the number kind) its annotation declares."""
    for rule in _rules(type(obj)):
        value = getattr(obj, rule.name)
        if not rule.accepts(value):
            raise ValueError(f"{type(obj).__name__}.{rule.name}={value!r}: expected {rule.expected}")
