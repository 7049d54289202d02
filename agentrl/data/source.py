"""Prompt data sources: JSONL, Parquet and Hugging Face ``save_to_disk`` folders, with a field
mapping, seeded shuffling over epochs and a resumable cursor.

A :class:`DataSource` reads its file once, checks every row up front and then hands out rows in a
fixed order: epoch ``e`` is a permutation of the good rows drawn from ``(seed, e)``, so the order
depends on nothing but the config. :meth:`DataSource.state_dict` / :meth:`DataSource.load_state_dict`
save and restore the cursor: a resumed run draws the same prompts in the same order.

Bad rows (a line that is not valid UTF-8 or not JSON, a row that is not an object, a field the
mapping names but the row lacks, a row the environment's ``task_type`` rejects) are found when the
source is built, each reported with the file, the row number (JSONL: the line number) and the field.
``bad_rows="skip"`` (default) leaves them out and counts them; ``"fail"`` raises :class:`DataError`
listing them. Either way a bad row never reaches a training step.

Example::

    source = DataSource(DataConfig(path="train.jsonl", fields={"question": "problem"}, seed=1),
                        validate=ToyArithmeticEnv.task_type.model_validate)
    rows = source.draw(8)          # DataRow(prompt_id, row_number, epoch, data)
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import orjson
from annotated_types import Ge
from pydantic import ValidationError

from agentrl._limits import check_limits

__all__ = ["BadRow", "BadRowPolicy", "DataConfig", "DataError", "DataExhausted", "DataFormat", "DataRow",
           "DataSource", "first_rows", "read_rows"]


class DataError(ValueError):
    """A data source cannot be used as configured (missing file, empty, too small, bad rows under ``fail``)."""


class DataExhausted(DataError):
    """Every epoch of a finite data source has been drawn."""


class DataFormat(str, Enum):
    AUTO = "auto"
    JSONL = "jsonl"
    PARQUET = "parquet"
    HF_DISK = "hf_disk"


class BadRowPolicy(str, Enum):
    SKIP = "skip"
    FAIL = "fail"


@dataclass(frozen=True)
class DataConfig:
    """Where the prompts are and how to read them.

    - ``fields``: ``{name the environment reads: column in the file}``; mapped columns are added
      under their new name, the other columns pass through unchanged;
    - ``epochs``: how many passes (``None``: endless);
    - ``split``: the split of a ``DatasetDict`` folder (``None``: the folder must hold one dataset
      or exactly one split).
    """

    path: str | os.PathLike[str]
    format: DataFormat = DataFormat.AUTO
    fields: Mapping[str, str] = field(default_factory=dict)
    shuffle: bool = True
    seed: int = 0
    epochs: Annotated[int, Ge(1)] | None = 1
    bad_rows: BadRowPolicy = BadRowPolicy.SKIP
    split: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", _enum(DataFormat, self.format, "format"))
        object.__setattr__(self, "bad_rows", _enum(BadRowPolicy, self.bad_rows, "bad_rows"))
        check_limits(self)
        if not os.fspath(self.path):
            raise ValueError(f"DataConfig.path={self.path!r}: expected a file or folder")
        for name, column in self.fields.items():
            if not isinstance(name, str) or not isinstance(column, str) or not name or not column:
                raise ValueError(f"DataConfig.fields: {name!r} -> {column!r}; expected non-empty strings")


def _enum(cls: type[Enum], value: Any, name: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"DataConfig.{name}={value!r}: expected one of {[m.value for m in cls]}") from None


@dataclass(frozen=True)
class BadRow:
    """A row left out: where it is and what is wrong with it."""

    path: str
    row_number: int
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.row_number}"
        return f"{where}: field {self.field!r}: {self.message}" if self.field else f"{where}: {self.message}"


@dataclass(frozen=True)
class DataRow:
    """One prompt as drawn: ``prompt_id`` is stable across runs (the row number in its file)."""

    prompt_id: str
    row_number: int
    epoch: int
    data: dict[str, Any]


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any, BadRow | None]]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):  # editors on Windows write one; it is no data
                raw = raw[len(codecs.BOM_UTF8):]
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield lineno, None, BadRow(str(path), lineno, None, f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            try:
                yield lineno, orjson.loads(text), None
            except orjson.JSONDecodeError as exc:
                yield lineno, None, BadRow(str(path), lineno, None, f"not valid JSON ({exc})")


def _table_rows(path: Path, fmt: DataFormat, split: str | None) -> Iterator[tuple[int, Any, BadRow | None]]:
    if fmt is DataFormat.PARQUET:
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
    else:
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            names = list(loaded)
            if split is None and len(names) != 1:
                raise DataError(f"{path}: a DatasetDict with splits {names}; set DataConfig.split to one of them")
            key = split if split is not None else names[0]
            if key not in loaded:
                raise DataError(f"{path}: DataConfig.split={key!r}; expected one of {names}")
            loaded = loaded[key]
        records = loaded.to_list()
    for i, rec in enumerate(records, start=1):
        yield i, rec, None


def _detect(path: Path, fmt: DataFormat) -> DataFormat:
    if fmt is not DataFormat.AUTO:
        return fmt
    if path.is_dir():
        return DataFormat.HF_DISK
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return DataFormat.JSONL
    if suffix in (".parquet", ".pq"):
        return DataFormat.PARQUET
    raise DataError(f"{path}: cannot tell the format from the name; set DataConfig.format to one of "
                    f"{[m.value for m in DataFormat if m is not DataFormat.AUTO]}")


def _check_row(path: str, number: int, record: Any, fields: Mapping[str, str],
               validate: Callable[[dict[str, Any]], object] | None) -> tuple[dict[str, Any] | None, BadRow | None]:
    if not isinstance(record, dict):
        return None, BadRow(path, number, None, f"expected an object (a mapping of fields), got {type(record).__name__}")
    data = dict(record)
    for name, column in fields.items():
        if column not in record:
            return None, BadRow(path, number, column, f"missing (mapped to {name!r}); the row has {sorted(record)[:12]}")
        data[name] = record[column]
    if validate is not None:
        try:
            validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or None
            return None, BadRow(path, number, loc, f"{err['msg']} (got {err.get('input')!r:.80})")
        except (ValueError, TypeError) as exc:
            return None, BadRow(path, number, None, str(exc))
    return data, None


def read_rows(config: DataConfig, validate: Callable[[dict[str, Any]], object] | None = None,
              limit: int | None = None) -> tuple[list[tuple[int, dict[str, Any]]], list[BadRow]]:
    """Every good row as ``(row_number, data)`` and every bad row of ``config.path`` (only the first
    ``limit`` records when given)."""
    path = Path(config.path)
    if not path.exists():
        raise DataError(f"DataConfig.path={os.fspath(config.path)!r}: no such file or folder")
    fmt = _detect(path, config.format)
    reader = _jsonl_rows(path) if fmt is DataFormat.JSONL else _table_rows(path, fmt, config.split)
    good: list[tuple[int, dict[str, Any]]] = []
    bad: list[BadRow] = []
    for number, record, problem in itertools.islice(reader, limit):
        data = None
        if problem is None:
            data, problem = _check_row(str(path), number, record, config.fields, validate)
        if problem is not None:
            bad.append(problem)
        elif data is not None:
            good.append((number, data))
    return good, bad


def first_rows(config: DataConfig, n: int, validate: Callable[[dict[str, Any]], object] | None = None,
               ) -> tuple[list[tuple[int, dict[str, Any]]], list[BadRow]]:
    """The good and bad rows among the first ``n`` records of ``config.path`` (what a dry run checks
    without reading a whole JSONL file)."""
    return read_rows(config, validate, limit=n)


_CHUNKS = 64  # a saved cursor holds one fingerprint per chunk of rows: a change is located to its chunk


def _chunk_bounds(n: int, i: int) -> tuple[int, int]:
    return n * i // _CHUNKS, n * (i + 1) // _CHUNKS


def _fingerprint(good: Sequence[tuple[int, dict[str, Any]]]) -> list[str]:
    """One short hash per chunk of the good rows (row number and data), in file order."""
    out = []
    for i in range(_CHUNKS):
        lo, hi = _chunk_bounds(len(good), i)
        digest = hashlib.blake2b(digest_size=8)
        for number, data in good[lo:hi]:
            digest.update(orjson.dumps([number, data], option=orjson.OPT_SORT_KEYS, default=str))
        out.append(digest.hexdigest())
    return out


class DataSource:
    """Rows of one file in a seeded order over epochs; see the module doc.

    ``rows`` may be given instead of a file (tests, generated tasks): ``DataSource.from_rows(...)``.
    """

    def __init__(self, config: DataConfig, *, validate: Callable[[dict[str, Any]], object] | None = None) -> None:
        self.config = config
        good, bad = read_rows(config, validate)
        self._init(good, bad, str(config.path))

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]], *, shuffle: bool = True, seed: int = 0,
                  epochs: int | None = 1, validate: Callable[[dict[str, Any]], object] | None = None,
                  name: str = "<rows>", bad_rows: BadRowPolicy | str = BadRowPolicy.SKIP) -> DataSource:
        """A source over in-memory rows (numbered from 1), checked like a file's."""
        self = cls.__new__(cls)
        self.config = DataConfig(path=name, shuffle=shuffle, seed=seed, epochs=epochs, bad_rows=BadRowPolicy(bad_rows))
        good: list[tuple[int, dict[str, Any]]] = []
        bad: list[BadRow] = []
        for i, row in enumerate(rows, start=1):
            data, problem = _check_row(name, i, row, {}, validate)
            if problem is not None:
                bad.append(problem)
            else:
                assert data is not None
                good.append((i, data))
        self._init(good, bad, name)
        return self

    def _init(self, good: list[tuple[int, dict[str, Any]]], bad: list[BadRow], name: str) -> None:
        self.name = name
        self.bad_rows = bad
        if bad and self.config.bad_rows is BadRowPolicy.FAIL:
            listed = "\n  ".join(str(b) for b in bad[:20])
            more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
            raise DataError(f"{name}: {len(bad)} bad row(s) (bad_rows='fail'):\n  {listed}{more}")
        if not good:
            why = f"; all {len(bad)} rows are bad, the first: {bad[0]}" if bad else ""
            raise DataError(f"{name}: the dataset has no usable rows{why}")
        self._numbers = [n for n, _ in good]
        self._data = [d for _, d in good]
        self._fingerprint = _fingerprint(good)
        self._epoch = 0
        self._position = 0
        self._order = self._permutation(0)
        self.drawn = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def epoch(self) -> int:
        return self._epoch

    def require(self, n: int, what: str = "a step") -> None:
        """Raises :class:`DataError` unless one epoch holds at least ``n`` rows."""
        if len(self) < n:
            skipped = f" ({len(self.bad_rows)} bad rows skipped)" if self.bad_rows else ""
            raise DataError(f"{self.name}: {len(self)} usable rows{skipped}, but {what} needs {n} prompts")

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self._data)))
        if self.config.shuffle:
            random.Random(f"{self.config.seed}:{epoch}").shuffle(order)
        return order

    def exhausted(self) -> bool:
        epochs = self.config.epochs
        return epochs is not None and self._epoch >= epochs

    def draw(self, n: int) -> list[DataRow]:
        """The next ``n`` rows (crossing into the next epoch when needed); fewer at the very end.

        Raises :class:`DataExhausted` when nothing is left.
        """
        out: list[DataRow] = []
        while len(out) < n and not self.exhausted():
            if self._position >= len(self._order):
                self._epoch += 1
                self._position = 0
                if self.exhausted():
                    break
                self._order = self._permutation(self._epoch)
            i = self._order[self._position]
            self._position += 1
            number = self._numbers[i]
            out.append(DataRow(prompt_id=str(number), row_number=number, epoch=self._epoch,
                               data=orjson.loads(orjson.dumps(self._data[i]))))
        if not out and n > 0:
            raise DataExhausted(f"{self.name}: all {self.config.epochs} epoch(s) have been drawn")
        self.drawn += len(out)
        return out

    def row(self, prompt_id: str) -> dict[str, Any]:
        """The data of the row with ``prompt_id`` (a fresh copy), e.g. to rebuild a buffered episode."""
        try:
            i = self._numbers.index(int(prompt_id))
        except ValueError:
            raise KeyError(f"{self.name}: no usable row with prompt_id {prompt_id!r}") from None
        return dict(orjson.loads(orjson.dumps(self._data[i])))

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "position": self._position, "drawn": self.drawn, "rows": len(self),
                "seed": self.config.seed, "shuffle": self.config.shuffle, "fingerprint": list(self._fingerprint)}

    def _changed_rows(self, saved: list[str]) -> str:
        """The row numbers of the chunks whose fingerprints differ, as ``rows 1-64, 129-192`` (first few)."""
        if len(saved) != len(self._fingerprint):
            return "their fingerprint layout"
        spans = []
        for i, (a, b) in enumerate(zip(saved, self._fingerprint, strict=True)):
            if a != b:
                lo, hi = _chunk_bounds(len(self._numbers), i)
                first, last = self._numbers[lo], self._numbers[hi - 1]
                spans.append(f"{first}" if first == last else f"{first}-{last}")
        shown = ", ".join(spans[:4]) + (f" and {len(spans) - 4} more ranges" if len(spans) > 4 else "")
        return f"row{'s' if len(spans) > 1 or '-' in shown else ''} {shown}"

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a cursor saved by :meth:`state_dict`; refuses one saved for other data or order."""
        for key in ("rows", "seed", "shuffle"):
            mine = len(self) if key == "rows" else getattr(self.config, key)
            if state.get(key) != mine:
                raise DataError(f"{self.name}: the saved cursor has {key}={state.get(key)!r} but this source has "
                                f"{mine!r}; it was saved for other data or another order")
        saved = state.get("fingerprint")  # absent in cursors saved before it was recorded
        if saved is not None and list(saved) != self._fingerprint:
            raise DataError(f"{self.name}: the data changed since the cursor was saved: the same {len(self)} usable "
                            f"rows, but {self._changed_rows(list(saved))} differ; a resumed run would train other "
                            "prompts under the saved prompt ids. Expected the data the run started with (restore "
                            "the file, or start a new run)")
        self._epoch = int(state["epoch"])
        self._position = int(state["position"])
        self.drawn = int(state.get("drawn", 0))
        self._order = self._permutation(self._epoch)
