"""Reading call attempts out of XML (qwen3_coder / Qwen3.5) call blocks (internal to the parser).

The rules are those of SGLang's ``qwen3_coder`` parser, so that a call runs here exactly when it
would run in serving, with the same argument text:

- a block is ``<tool_call>`` up to the first ``</tool_call>``; only complete blocks are read,
  unless the turn has none, in which case everything from the first call tag to the end is read
  as one block (an unterminated last block, or ``<function=...>`` without its wrapper);
- a function is ``<function=`` up to the first ``</function>`` (or the end of the block); its name
  is the text up to the first ``>``, kept as written;
- a parameter is ``<parameter=`` up to the first ``</parameter>``, the next ``<parameter=`` or the
  end of the function; its name is the text up to the first ``>``, its value the rest with one
  framing newline dropped on each side. A value that runs to the end of a function that itself
  ends in a newline stops before that newline (a regex ``$``).

Every departure from the clean format is still reported: as a tolerated defect of the call when
SGLang runs the call anyway, as a fatal one when it does not.
"""

from __future__ import annotations

from agentrl.chat._attempts import SHOW, Attempt, Defect
from agentrl.chat._scan import (
    CALL_CLOSE,
    CALL_OPEN,
    FUNCTION_CLOSE,
    FUNCTION_OPEN,
    PARAMETER_CLOSE,
    PARAMETER_OPEN,
    Finder,
    Region,
)
from agentrl.chat.types import FailureKind

K = FailureKind


def _unframe(value: str) -> str:
    """Drops exactly one framing newline on each side; never more (code keeps its whitespace)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _stray(att: Attempt, text: str, start: int, end: int, where: str) -> None:
    stray = text[start:end].strip()
    if stray:
        att.tolerated.append((K.MALFORMED_XML, f"text outside {where}: {stray!r:.{SHOW}}"))


def _value_end(text: str, finder: Finder, start: int, end: int) -> tuple[int, bool]:
    """Where a value starting at ``start`` ends inside ``text[:end]``, and whether ``</parameter>`` ends it."""
    close = finder.next(PARAMETER_CLOSE, start, end)
    nxt = finder.next(PARAMETER_OPEN, start, end)
    dollar = end - 1 if end - 1 >= start and text[end - 1] == "\n" else end
    stop = min([c for c in (close, nxt) if c != -1] + [dollar])
    return stop, stop == close


def _parameter(att: Attempt, text: str, finder: Finder, p: int, end: int) -> int:
    """Reads the parameter that starts at ``p``; returns where reading goes on."""
    start = p + len(PARAMETER_OPEN)
    stop, closed = _value_end(text, finder, start, end)
    after = stop + len(PARAMETER_CLOSE) if closed else stop
    gt = finder.next(">", start, stop)
    if gt == -1:
        kind = K.UNTERMINATED if stop == len(text) else K.MALFORMED_XML
        att.tolerated.append((kind, f"parameter header not closed by '>': {text[p:stop]!r:.{SHOW}} "
                                    "(the parameter is dropped, as SGLang drops it)"))
        return after
    name = text[start:gt]
    value = _unframe(text[gt + 1:stop])
    if not name.strip() or name != name.strip() or "<" in name or "\n" in name:
        att.tolerated.append((K.MALFORMED_XML, f"odd parameter name {name!r:.{SHOW}} (kept as written, as SGLang "
                                               "keeps it)"))
    if not closed:
        att.tolerated.append((K.UNTERMINATED, f"<parameter={name:.{SHOW}}> has no closing </parameter>"))
    # A drifted end marker ("</parameter1>", "</parameter_function>", a truncated "</parameter") stays
    # in the value: SGLang 0.5.23, the pinned version, keeps it. Newer SGLang strips one that ends an
    # unclosed value (its test_qwen3_coder_detector "MalformedParameterEnd" cases); follow it when the
    # pin moves.
    broken = value.find("</parameter")
    if broken != -1:
        att.tolerated.append((K.MALFORMED_XML, f"<parameter={name:.{SHOW}}> is closed by a broken tag "
                                               f"{value[broken:broken + 40]!r}; the tag stays in the value, "
                                               "as SGLang 0.5.23 keeps it"))
    if name in att.arguments:
        att.tolerated.append((K.MALFORMED_XML, f"parameter {name!r:.{SHOW}} given twice; the last value is used"))
    att.arguments[name] = value
    return after


def _function(text: str, finder: Finder, start: int, end: int) -> tuple[Attempt, int]:
    """Reads the ``<function=NAME>...`` that starts at ``start`` inside ``text[:end]``; returns it and where it ends."""
    name_start = start + len(FUNCTION_OPEN)
    close = finder.next(FUNCTION_CLOSE, name_start, end)
    body_end = close if close != -1 else end
    after = close + len(FUNCTION_CLOSE) if close != -1 else end
    att = Attempt(span=(start, after), xml=True)
    gt = finder.next(">", name_start, body_end)
    if gt == -1:
        kind = K.UNTERMINATED if body_end == len(text) else K.MALFORMED_XML
        att.fatal.append((kind, f"function header not closed by '>': {text[start:body_end]!r:.{SHOW}}"))
        return att, after
    name = text[name_start:gt]
    if not name.strip():
        att.fatal.append((K.EMPTY_CALL, "call has an empty function name"))
        return att, after
    if "<" in name or "\n" in name:
        att.fatal.append((K.MALFORMED_XML, f"bad function name {name!r:.{SHOW}}"))
        return att, after
    att.name = name
    if close == -1:
        att.tolerated.append((K.UNTERMINATED, f"<function={name:.{SHOW}}> has no closing </function>"))
    pos = gt + 1
    while True:
        p = finder.next(PARAMETER_OPEN, pos, body_end)
        _stray(att, text, pos, p if p != -1 else body_end, "<parameter=...>")
        if p == -1:
            return att, after
        pos = _parameter(att, text, finder, p, body_end)


def _functions(text: str, finder: Finder, start: int, end: int) -> tuple[list[Attempt], list[str]]:
    """Every function in ``text[start:end]``, and the stray text found between them."""
    attempts: list[Attempt] = []
    strays: list[str] = []
    pos = start
    while True:
        f = finder.next(FUNCTION_OPEN, pos, end)
        stray = text[pos:f if f != -1 else end].replace(CALL_OPEN, "").replace(CALL_CLOSE, "").strip()
        if stray:
            strays.append(stray)
        if f == -1:
            return attempts, strays
        att, pos = _function(text, finder, f, end)
        attempts.append(att)


def _tile(attempts: list[Attempt], start: int, end: int, defects: list[Defect]) -> list[Attempt]:
    """Spans tile ``[start, end)``: the first call starts at ``start``, the last ends at ``end``."""
    starts = [start] + [a.span[0] for a in attempts[1:]]
    ends = [a.span[0] for a in attempts[1:]] + [end]
    for att, s, e in zip(attempts, starts, ends, strict=True):
        att.span = (s, e)
    attempts[-1].tolerated.extend(defects)
    return attempts


def block_attempts(text: str, finder: Finder, region: Region) -> list[Attempt]:
    """The calls of one complete ``<tool_call>...</tool_call>`` block (SGLang accepts several)."""
    attempts, strays = _functions(text, finder, region.body_start, region.body_end)
    if not attempts:
        att = Attempt(span=(region.start, region.end), xml=True)
        if not text[region.body_start:region.body_end].strip():
            att.fatal.append((K.EMPTY_CALL, "<tool_call> block is empty"))
        else:
            att.fatal.append((K.MALFORMED_XML, "no <function=NAME> inside <tool_call>"))
        return [att]
    defects = [(K.MALFORMED_XML, f"text outside <function=...>: {s!r:.{SHOW}}") for s in strays]
    return _tile(attempts, region.start, region.end, defects)


def dropped_attempt(text: str, region: Region, reason: str) -> Attempt:
    """A block or wrapper-less function SGLang does not read (``reason`` says why)."""
    att = Attempt(span=(region.start, region.end), xml=True)
    body = text[region.body_start:region.body_end]
    if region.kind == "function":
        att.fatal.append((K.MALFORMED_XML, f"<function=...> outside a <tool_call> block: {reason}"))
    elif not body.strip():
        att.fatal.append((K.UNTERMINATED, "<tool_call> has no closing </tool_call>"))
    elif FUNCTION_OPEN not in body:
        att.fatal.append((K.MALFORMED_XML, "no <function=NAME> inside <tool_call>"))
        att.fatal.append((K.UNTERMINATED, "<tool_call> has no closing </tool_call>"))
    else:
        att.fatal.append((K.UNTERMINATED, f"<tool_call> has no closing </tool_call>: {reason}"))
    return att


def fallback_attempts(text: str, finder: Finder, start: int, first_block: int) -> list[Attempt]:
    """A turn with no complete block: SGLang reads every function from ``start`` to the end.

    ``first_block`` is where the first (unterminated) ``<tool_call>`` starts; functions before it
    are wrapper-less. Returns an empty list when there is no function to read.
    """
    attempts, strays = _functions(text, finder, start, len(text))
    if not attempts:
        return []
    for att in attempts:
        if att.span[0] < first_block:
            att.tolerated.append((K.MALFORMED_XML, "<function=...> outside a <tool_call> block"))
    defects: list[Defect] = [(K.UNTERMINATED, "<tool_call> has no closing </tool_call>")]
    defects += [(K.MALFORMED_XML, f"text outside <function=...>: {s!r:.{SHOW}}") for s in strays]
    return _tile(attempts, start, len(text), defects)
