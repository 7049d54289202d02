"""Turn DAPO-Math-17k and AIME-style files into the JSONL rows ``RetoolMathEnv`` trains on.

    python examples/prepare_dapo_math.py data/raw/dapo/data/dapo-math-17k.parquet -o data/retool/dapo_math_17k.jsonl
    python examples/prepare_dapo_math.py data/raw/aime_2024/data/*.parquet -o data/retool/aime_2024.jsonl
    python examples/prepare_dapo_math.py aime_2025.jsonl -o data/retool/aime_2025.jsonl --limit 10

Every output line is ``{"prompt": "<the problem>", "label": "<the reference answer>"}``, the
``MathTask`` row of ``RetoolMathEnv`` (``agentrl.environments``). Two input layouts are read, per row,
from Parquet or JSONL files:

- **DAPO / verl** (``BytedTsinghua-SIA/DAPO-Math-17k``, ``BytedTsinghua-SIA/AIME-2024``): ``prompt`` is
  a list of chat messages ``[{"role": "user", "content": ...}]`` and the answer is
  ``reward_model.ground_truth``. DAPO wraps each problem in an instruction to end with an
  ``Answer:`` line; that wrapper is removed (``--keep-instructions`` keeps it), so the
  environment's own system prompt (``\\boxed{}``) is the only instruction. The file repeats each
  problem many times over; duplicates are dropped.
- **AIME style** (``HuggingFaceH4/aime_2024``, ``Maxwell-Jia/AIME_2024``, MathArena, ...): a problem
  column (``problem``, ``question`` or ``prompt`` as text, any case) and an answer column
  (``answer``, ``label`` or ``ground_truth``); integer answers become text.

``--prompt-field`` / ``--answer-field`` name other columns (dotted for nested ones,
``reward_model.ground_truth``). A row that cannot be converted is reported with its file, row number
(1-based: the JSONL line, the Parquet row) and field; by default any bad row stops the script
(exit status 2) before anything is written, ``--skip-bad-rows`` leaves them out instead. Rows whose
problem text (whitespace collapsed) was seen before are dropped; when the earlier one had another
answer, the first is kept and the conflict is reported. ``--limit N`` stops after N rows written.
The output is written whole or not at all (a temporary file renamed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentrl.environments import MathTask

DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response should be of the "
               "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
PROMPT_FIELDS = ("problem", "question", "prompt")
ANSWER_FIELDS = ("answer", "label", "ground_truth")
PARQUET_BATCH = 4096


class BadRow(ValueError):
    """One row that cannot be converted: where it is, which field, and what is wrong."""

    def __init__(self, path: str, row: int, field_name: str | None, message: str) -> None:
        self.path, self.row, self.field_name = path, row, field_name
        where = f"{path}:{row}" + (f": field {field_name!r}" if field_name else "")
        super().__init__(f"{where}: {message}")


@dataclass
class Report:
    read: int = 0
    written: int = 0
    duplicates: int = 0
    bad: list[BadRow] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


# -- reading ---------------------------------------------------------------------------------------
def read_records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(row number, record)`` of a Parquet or JSONL file; a line that is not JSON is a :class:`BadRow`."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise SystemExit(f"error: {path}: reading Parquet needs pyarrow (pip install pyarrow)") from exc
        number = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH):
            for record in batch.to_pylist():
                number += 1
                yield number, record
    elif suffix in (".jsonl", ".ndjson", ".json"):
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    yield number, BadRow(str(path), number, None, f"not valid JSON ({exc.msg} at column {exc.colno})")
    else:
        raise SystemExit(f"error: {path}: unknown file type {suffix!r}; expected .parquet or .jsonl")


def lookup(record: dict[str, Any], dotted: str) -> Any:
    """``record["a"]["b"]`` for ``"a.b"``; ``KeyError`` naming the missing part."""
    node: Any = record
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(part)
        node = node[part]
    return node


def _find(record: dict[str, Any], names: Sequence[str]) -> str | None:
    by_lower = {k.lower(): k for k in record}
    return next((by_lower[n] for n in names if n in by_lower), None)


# -- one row ---------------------------------------------------------------------------------------
def strip_instructions(text: str) -> str:
    """The problem without DAPO's ``Answer:`` instruction wrapper (text without it is returned as is)."""
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX):]
    if text.endswith(DAPO_SUFFIX):
        text = text[:-len(DAPO_SUFFIX)]
    return text.strip()


def _prompt(value: Any, where: tuple[str, int, str], keep: bool) -> str | list[dict[str, str]]:
    path, row, name = where
    if isinstance(value, str):
        text = value if keep else strip_instructions(value)
        if not text.strip():
            raise BadRow(path, row, name, "empty problem text")
        return text
    if not isinstance(value, list) or not value:
        raise BadRow(path, row, name, f"expected the problem as text or a list of chat messages, got {value!r:.80}")
    messages = []
    for i, msg in enumerate(value):
        if not (isinstance(msg, dict) and isinstance(msg.get("role"), str) and isinstance(msg.get("content"), str)):
            raise BadRow(path, row, f"{name}[{i}]", f"expected {{'role': str, 'content': str}}, got {msg!r:.80}")
        messages.append({"role": msg["role"], "content": msg["content"]})
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise BadRow(path, row, name, f"no user message among roles {[m['role'] for m in messages]}")
    if len(messages) == 1:  # DAPO's single user turn: the problem as plain text
        return _prompt(messages[0]["content"], where, keep)
    if not keep:
        for m in users:
            m["content"] = strip_instructions(m["content"])
    return messages


def _label(value: Any, path: str, row: int, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise BadRow(path, row, name, f"expected the answer as text or a number, got {value!r:.80}")
    text = str(value).strip()
    if not text:
        raise BadRow(path, row, name, "empty answer")
    return text


def convert_record(record: Any, path: str, row: int, *, prompt_field: str | None = None,
                   answer_field: str | None = None, keep_instructions: bool = False) -> dict[str, Any]:
    """One ``{"prompt", "label"}`` row from a record of either layout; :class:`BadRow` when it cannot be."""
    if isinstance(record, BadRow):
        raise record
    if not isinstance(record, dict):
        raise BadRow(path, row, None, f"expected an object with named fields, got {type(record).__name__}")
    p_name = prompt_field or _find(record, PROMPT_FIELDS)
    if answer_field is not None:
        a_name: str | None = answer_field
    elif isinstance(record.get("reward_model"), dict):
        a_name = "reward_model.ground_truth"
    else:
        a_name = _find(record, ANSWER_FIELDS)
    for name, what, options in ((p_name, "problem", PROMPT_FIELDS), (a_name, "answer", ANSWER_FIELDS)):
        if name is None:
            raise BadRow(path, row, None, f"no {what} column: expected one of {list(options)} (any case), or "
                                          f"--{'prompt' if what == 'problem' else 'answer'}-field; the row has "
                                          f"{sorted(record)[:12]}")
    assert p_name is not None and a_name is not None
    values = []
    for name in (p_name, a_name):
        try:
            values.append(lookup(record, name))
        except KeyError as exc:
            raise BadRow(path, row, name, f"missing ({exc.args[0]!r} not found); the row has {sorted(record)[:12]}") \
                from None
    out = {"prompt": _prompt(values[0], (path, row, p_name), keep_instructions),
           "label": _label(values[1], path, row, a_name)}
    try:
        MathTask.model_validate(out)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise BadRow(path, row, p_name if err["loc"][:1] == ("prompt",) else a_name, err["msg"]) from None
    return out


# -- whole files -----------------------------------------------------------------------------------
def dedup_key(prompt: str | list[dict[str, str]]) -> str:
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt if m["role"] == "user")
    return re.sub(r"\s+", " ", text).strip()


def convert(inputs: Sequence[Path], *, limit: int | None = None, prompt_field: str | None = None,
            answer_field: str | None = None, keep_instructions: bool = False) -> tuple[list[dict[str, Any]], Report]:
    """The distinct rows of ``inputs`` in order (at most ``limit``) and what happened to the others."""
    report = Report()
    rows: list[dict[str, Any]] = []
    seen: dict[str, tuple[str, str, int]] = {}  # problem -> (label, file, row) of its first occurrence
    for path in inputs:
        for number, record in read_records(path):
            if limit is not None and len(rows) >= limit:
                return rows, report
            report.read += 1
            try:
                out = convert_record(record, str(path), number, prompt_field=prompt_field,
                                     answer_field=answer_field, keep_instructions=keep_instructions)
            except BadRow as bad:
                report.bad.append(bad)
                continue
            key = dedup_key(out["prompt"])
            if key in seen:
                report.duplicates += 1
                label, first_file, first_row = seen[key]
                if label != out["label"]:
                    report.conflicts.append(f"{path}:{number}: field 'label': {out['label']!r}, but the same problem "
                                            f"at {first_file}:{first_row} has {label!r} (kept that one)")
                continue
            seen[key] = (out["label"], str(path), number)
            rows.append(out)
    return rows, report


def write_jsonl(rows: Sequence[dict[str, Any]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", type=Path, help="Parquet or JSONL files, read in this order")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the JSONL file to write")
    parser.add_argument("--limit", type=int, help="stop after this many rows written")
    parser.add_argument("--prompt-field", help="the problem column (dotted for nested fields)")
    parser.add_argument("--answer-field", help="the answer column (dotted, e.g. reward_model.ground_truth)")
    parser.add_argument("--keep-instructions", action="store_true", help="keep DAPO's 'Answer:' instruction wrapper")
    parser.add_argument("--skip-bad-rows", action="store_true", help="leave bad rows out instead of stopping")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit={args.limit}: expected a positive number of rows")
    for path in args.inputs:
        if not path.is_file():
            print(f"error: {path}: no such file", file=sys.stderr)
            return 2
    rows, report = convert(args.inputs, limit=args.limit, prompt_field=args.prompt_field,
                           answer_field=args.answer_field, keep_instructions=args.keep_instructions)
    for line in report.conflicts[:20]:
        print(f"warning: {line}", file=sys.stderr)
    if report.bad:
        for bad in report.bad[:20]:
            print(f"{'skipped' if args.skip_bad_rows else 'error'}: {bad}", file=sys.stderr)
        more = len(report.bad) - 20
        if more > 0:
            print(f"... and {more} more bad rows", file=sys.stderr)
        if not args.skip_bad_rows:
            print(f"error: {len(report.bad)} bad row(s); nothing written (fix them, map the columns with "
                  "--prompt-field/--answer-field, or pass --skip-bad-rows)", file=sys.stderr)
            return 2
    if not rows:
        print("error: no rows to write", file=sys.stderr)
        return 2
    write_jsonl(rows, args.output)
    print(f"wrote {len(rows)} rows to {args.output} (read {report.read}; {report.duplicates} duplicates dropped, "
          f"{len(report.conflicts)} with another answer; {len(report.bad)} bad rows skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
