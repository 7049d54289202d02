"""Data sources: the three file formats, field mapping, seeded order over epochs, resumable cursor,
bad rows and clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.data import BadRowPolicy, DataConfig, DataError, DataExhausted, DataFormat, DataSource
from agentrl.environments import ToyArithmeticEnv, make_arithmetic_rows

ROWS = [{"problem": f"What is {i} * 3?", "label": str(3 * i), "extra": i} for i in range(1, 21)]
MAPPING = {"question": "problem", "answer": "label"}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(params=["jsonl", "parquet", "hf_disk"])
def dataset(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "jsonl":
        return write_jsonl(tmp_path / "train.jsonl", ROWS)
    if request.param == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "train.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), path)
        return path
    import datasets

    path = tmp_path / "train_ds"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    return path


def test_every_format_reads_the_same_rows_with_the_mapping(dataset: Path) -> None:
    source = DataSource(DataConfig(path=dataset, fields=MAPPING, shuffle=False),
                        validate=ToyArithmeticEnv.task_type.model_validate)
    assert len(source) == 20 and not source.bad_rows
    rows = source.draw(3)
    assert [r.prompt_id for r in rows] == ["1", "2", "3"]
    assert rows[0].data["question"] == "What is 1 * 3?" and rows[0].data["answer"] == "3"
    assert rows[0].data["extra"] == 1  # unmapped columns pass through


def test_order_is_seeded_per_epoch_and_restored_from_state_dict(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    cfg = DataConfig(path=path, seed=7, epochs=3)
    a = DataSource(cfg)
    first = [r.prompt_id for r in a.draw(15)]
    state = a.state_dict()
    rest = [(r.prompt_id, r.epoch) for r in a.draw(30)]
    b = DataSource(cfg)
    b.load_state_dict(json.loads(json.dumps(state)))  # a state survives JSON (checkpoints)
    assert [(r.prompt_id, r.epoch) for r in b.draw(30)] == rest
    assert sorted(first + [p for p, e in rest if e == 0]) == sorted(str(i) for i in range(1, 21))
    epoch0 = [p for p, e in rest if e == 0]
    epoch1 = [p for p, e in rest if e == 1]
    assert len(epoch1) == 20 and first + epoch0 != epoch1  # each epoch is its own permutation
    assert DataSource(cfg).draw(20) != DataSource(DataConfig(path=path, seed=8)).draw(20)


def test_finite_epochs_run_out_with_a_clear_error(tmp_path: Path) -> None:
    source = DataSource(DataConfig(path=write_jsonl(tmp_path / "d.jsonl", ROWS[:5]), epochs=2))
    assert len(source.draw(8)) == 8
    assert len(source.draw(8)) == 2  # the very end
    with pytest.raises(DataExhausted, match="2 epoch"):
        source.draw(1)
    endless = DataSource(DataConfig(path=tmp_path / "d.jsonl", epochs=None))
    assert len(endless.draw(50)) == 50


def test_a_saved_cursor_for_other_data_is_refused(tmp_path: Path) -> None:
    a = DataSource(DataConfig(path=write_jsonl(tmp_path / "a.jsonl", ROWS), seed=1))
    b = DataSource(DataConfig(path=write_jsonl(tmp_path / "b.jsonl", ROWS[:10]), seed=1))
    with pytest.raises(DataError, match="rows=20"):
        b.load_state_dict(a.state_dict())


def test_bad_rows_are_reported_with_file_row_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(ROWS[0]), json.dumps({"problem": "no label"}), "[1, 2]", "{broken",
             json.dumps({"problem": "What?", "label": "seven"}), "", json.dumps(ROWS[1])]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"problem": "caf\xe9", "label": "1"}\n')
    source = DataSource(DataConfig(path=path, fields=MAPPING), validate=ToyArithmeticEnv.task_type.model_validate)
    assert len(source) == 2
    found = {b.row_number: b for b in source.bad_rows}
    assert sorted(found) == [2, 3, 4, 5, 8]
    assert found[2].field == "label" and "missing" in found[2].message
    assert "expected an object" in found[3].message
    assert "not valid JSON" in found[4].message
    assert found[5].field == "answer" and "seven" in found[5].message  # the environment's task_type rejects it
    assert "not valid UTF-8" in found[8].message
    assert str(found[5]).startswith(f"{path}:5: field 'answer'")
    with pytest.raises(DataError, match=r"(?s)5 bad row\(s\).*bad.jsonl:2"):
        DataSource(DataConfig(path=path, fields=MAPPING, bad_rows=BadRowPolicy.FAIL),
                   validate=ToyArithmeticEnv.task_type.model_validate)


def test_empty_small_missing_and_unknown_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        DataSource(DataConfig(path=tmp_path / "missing.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no usable rows"):
        DataSource(DataConfig(path=tmp_path / "empty.jsonl"))
    small = DataSource(DataConfig(path=write_jsonl(tmp_path / "s.jsonl", ROWS[:3])))
    with pytest.raises(DataError, match="3 usable rows, but a step needs 8 prompts"):
        small.require(8)
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="cannot tell the format"):
        DataSource(DataConfig(path=tmp_path / "rows.csv"))
    with pytest.raises(ValueError, match=r"DataConfig.format='csv': expected one of"):
        DataConfig(path="x", format="csv")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epochs=0"):
        DataConfig(path="x", epochs=0)
    assert DataConfig(path="x", format="jsonl").format is DataFormat.JSONL  # type: ignore[arg-type]


def test_from_rows_checks_rows_like_a_file() -> None:
    rows = [*make_arithmetic_rows(4), {"question": "x"}]
    source = DataSource.from_rows(rows, validate=ToyArithmeticEnv.task_type.model_validate)
    assert len(source) == 4 and source.bad_rows[0].row_number == 5 and source.bad_rows[0].field == "answer"
