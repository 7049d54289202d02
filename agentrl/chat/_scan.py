"""Locating reasoning blocks and tool-call blocks in a completion (internal to the parsers).

The scan is a single left-to-right pass that cuts the text into regions: ``think`` (reasoning),
``call`` (a ``<tool_call>`` block) and ``function`` (an XML ``<function=...>`` written without
its ``<tool_call>`` wrapper). Whatever lies between regions is content. Blocks end where SGLang's
parsers end them (``qwen25``: at the first ``\n</tool_call>`` after ``<tool_call>\n``;
``qwen3_coder``: at the first ``</tool_call>``), so the parser sees the calls SGLang sees. Marker
look-ups go through :class:`Finder`, which caches the next occurrence of each marker so that
hostile inputs with thousands of markers still scan in linear time.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
# The qwen25 (JSON) framing: SGLang only reads blocks written exactly so.
JSON_OPEN = "<tool_call>\n"
JSON_CLOSE = "\n</tool_call>"
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
    # JSON only: False when ``<tool_call>`` is not followed by a newline (SGLang ignores the block).
    framed: bool = True


def turn_end(text: str) -> int:
    """Index of the first end-of-turn marker (``<|im_end|>``, ``<|endoftext|>``), or ``len(text)``."""
    ends = [i for i in (text.find(m) for m in STOP_MARKERS) if i != -1]
    return min(ends, default=len(text))


def _first(finder: Finder, markers: tuple[str, ...], pos: int) -> int:
    hits = [i for i in (finder.next(m, pos) for m in markers) if i != -1]
    return min(hits, default=-1)


def _to_close(finder: Finder, kind: str, start: int, opener: str, closer: str) -> Region:
    """``opener`` at ``start`` up to the first ``closer`` after it, else (unclosed) to the end of the text."""
    body_start = start + len(opener)
    close = finder.next(closer, body_start)
    if close == -1:
        return Region(kind, start, len(finder.text), body_start, len(finder.text), False)
    return Region(kind, start, close + len(closer), body_start, close, True)


def _think(finder: Finder, start: int) -> Region:
    return _to_close(finder, "think", start, THINK_OPEN, THINK_CLOSE)


def _json_block(finder: Finder, start: int) -> Region:
    """A qwen25 block: ``<tool_call>\\n`` up to the first ``\\n</tool_call>``, as SGLang's regex reads it.

    Unclosed (no such closer anywhere after it), it runs to the next ``<tool_call>`` or the end. A
    ``<tool_call>`` without its newline is not a block for SGLang; it runs to its ``</tool_call>``
    (or the next ``<tool_call>``) and is marked unframed.
    """
    text = finder.text
    if text.startswith(JSON_OPEN, start):
        body_start = start + len(JSON_OPEN)
        close = finder.next(JSON_CLOSE, body_start)
        if close != -1:
            return Region("call", start, close + len(JSON_CLOSE), body_start, close, True)
        nxt = finder.next(CALL_OPEN, body_start)
        end = nxt if nxt != -1 else len(text)
        return Region("call", start, end, body_start, end, False)
    body_start = start + len(CALL_OPEN)
    close = finder.next(CALL_CLOSE, body_start)
    nxt = finder.next(CALL_OPEN, body_start)
    if close != -1 and (nxt == -1 or close < nxt):
        return Region("call", start, close + len(CALL_CLOSE), body_start, close, True, framed=False)
    end = nxt if nxt != -1 else len(text)
    return Region("call", start, end, body_start, end, False, framed=False)


def _xml_block(finder: Finder, start: int) -> Region:
    """A qwen3_coder block: ``<tool_call>`` up to the first ``</tool_call>``, else to the end."""
    return _to_close(finder, "call", start, CALL_OPEN, CALL_CLOSE)


def _bare_function(finder: Finder, start: int) -> Region:
    body_start = start + len(FUNCTION_OPEN)
    close = finder.next(FUNCTION_CLOSE, body_start)
    stop = _first(finder, (CALL_OPEN, FUNCTION_OPEN), body_start)
    if close != -1 and (stop == -1 or close < stop):
        return Region("function", start, close + len(FUNCTION_CLOSE), body_start, close, True)
    end = stop if stop != -1 else len(finder.text)
    return Region("function", start, end, body_start, end, False)


def scan(text: str, xml: bool) -> list[Region]:
    """Cuts ``text`` (already cut at the end of the turn) into think and call regions, in order.

    - A ``</think>`` with no ``<think>`` before it means the completion started inside the
      reasoning block (Qwen3.5's generation prompt ends with ``<think>\\n``): everything before
      it is reasoning, tool-call tags included.
    - ``<think>`` opens reasoning up to ``</think>``, or to the end when the block never closes.
    - ``<tool_call>`` opens a call block, ended as SGLang's parser for the format ends it (see
      :func:`_json_block`, :func:`_xml_block`); tags inside a block belong to the block.
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
            region = _think(finder, start)
        elif text.startswith(CALL_OPEN, start):
            region = _xml_block(finder, start) if xml else _json_block(finder, start)
        else:
            region = _bare_function(finder, start)
        regions.append(region)
        pos = region.end
