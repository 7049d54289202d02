"""Locating reasoning blocks and tool-call blocks in a completion (internal to the parsers).

The scan is a single left-to-right pass that cuts the text into regions: ``think`` (reasoning),
``call`` (a ``<tool_call>`` block) and ``function`` (an XML ``<function=...>`` written without
its ``<tool_call>`` wrapper). Whatever lies between regions is content. Marker look-ups go
through :class:`Finder`, which caches the next occurrence of each marker so that hostile inputs
with thousands of markers still scan in linear time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
# End-of-turn markers: nothing after the first one belongs to the turn.
STOP_MARKERS = ("<|im_end|>", "<|endoftext|>")


class Finder:
    """Next occurrence of a marker at or after a position.

    Contract: for each marker, successive queries use non-decreasing ``pos`` (a scan only moves
    forward); that is what makes the cache valid and the scan linear.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self._cache: dict[str, tuple[int, int]] = {}

    def next(self, marker: str, pos: int, end: int | None = None) -> int:
        """Index of the first ``marker`` at or after ``pos`` that ends by ``end``; -1 if none."""
        hit = self._cache.get(marker)
        if hit is None or pos < hit[0] or (hit[1] != -1 and hit[1] < pos):
            hit = (pos, self.text.find(marker, pos))
            self._cache[marker] = hit
        found = hit[1]
        if found == -1 or (end is not None and found + len(marker) > end):
            return -1
        return found


@dataclass(frozen=True)
class Region:
    """One region of the completion: ``text[start:end]`` whole, ``text[body_start:body_end]`` inside the tags."""

    kind: str  # "think" | "call" | "function"
    start: int
    end: int
    body_start: int
    body_end: int
    closed: bool


def turn_end(text: str) -> int:
    """Index of the first end-of-turn marker (``<|im_end|>``, ``<|endoftext|>``), or ``len(text)``."""
    ends = [i for i in (text.find(m) for m in STOP_MARKERS) if i != -1]
    return min(ends, default=len(text))


def _first(finder: Finder, markers: tuple[str, ...], pos: int) -> int:
    hits = [i for i in (finder.next(m, pos) for m in markers) if i != -1]
    return min(hits, default=-1)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def _region(finder: Finder, kind: str, start: int, opener: str, closer: str,
            interrupters: tuple[str, ...], json_body: bool = False) -> Region:
    """The region opened at ``start``: up to ``closer``, or, unclosed, up to an interrupter or the end.

    With ``json_body``, an interrupter inside a body that is a whole JSON object up to the closer
    (a ``<tool_call>`` inside a string argument) does not interrupt, as with the engines' regex.
    """
    body_start = start + len(opener)
    close = finder.next(closer, body_start)
    stop = _first(finder, interrupters, body_start)
    if close != -1 and (stop == -1 or close < stop or (json_body and _is_json_object(finder.text[body_start:close]))):
        return Region(kind, start, close + len(closer), body_start, close, True)
    end = stop if stop != -1 else len(finder.text)
    return Region(kind, start, end, body_start, end, False)


def scan(text: str, xml: bool) -> list[Region]:
    """Cuts ``text`` (already cut at the end of the turn) into think and call regions, in order.

    - A ``</think>`` with no ``<think>`` before it means the completion started inside the
      reasoning block (Qwen3.5's generation prompt ends with ``<think>\\n``): everything before
      it is reasoning, tool-call tags included.
    - ``<think>`` opens reasoning up to ``</think>``, or to the end when the block never closes.
    - ``<tool_call>`` opens a call up to ``</tool_call>``; a second ``<tool_call>`` before the
      closer ends the first one unterminated, unless (JSON format) the whole body up to the closer
      is a JSON object, i.e. the tag sits inside a string argument.
    - In XML mode, a bare ``<function=`` outside any block opens a wrapper-less call up to
      ``</function>`` (or the next ``<tool_call>``/``<function=``, or the end).
    """
    finder = Finder(text)
    regions: list[Region] = []
    pos = 0
    first_close = finder.next(THINK_CLOSE, 0)
    first_open = finder.next(THINK_OPEN, 0)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        pos = first_close + len(THINK_CLOSE)
        regions.append(Region("think", 0, pos, 0, first_close, True))
    openers = (THINK_OPEN, CALL_OPEN, FUNCTION_OPEN) if xml else (THINK_OPEN, CALL_OPEN)
    while True:
        start = _first(finder, openers, pos)
        if start == -1:
            return regions
        if text.startswith(THINK_OPEN, start):
            region = _region(finder, "think", start, THINK_OPEN, THINK_CLOSE, ())
        elif text.startswith(CALL_OPEN, start):
            region = _region(finder, "call", start, CALL_OPEN, CALL_CLOSE, (CALL_OPEN,), json_body=not xml)
        else:
            region = _region(finder, "function", start, FUNCTION_OPEN, FUNCTION_CLOSE, (CALL_OPEN, FUNCTION_OPEN))
        regions.append(region)
        pos = region.end
