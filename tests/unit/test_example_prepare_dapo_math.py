"""examples/prepare_dapo_math.py: DAPO-Math-17k's Parquet layout (a chat-list ``prompt``, the answer in
``reward_model.ground_truth``, the instruction wrapper, every problem repeated) and AIME-style files
become ``{"prompt", "label"}`` rows that ``RetoolMathEnv``'s data reader accepts; bad rows are named
by file, row and field, and stop the script before anything is written."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentrl.data.source import DataConfig, read_rows
from agentrl.environments import RetoolMathEnv

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "prepare_dapo_math.py"
# DAPO-Math-17k's wrapper around each problem, as its rows carry it
PRE = ("Solve the following math problem step by step. The last line of your response should be of the form "
       "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
SUF = '\n\nRemember to put your answer on its own line after "Answer:".'


@pytest.fixture(scope="module")
def prep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_dapo_math", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def dapo_row(problem: str, answer: str | None, index: int, *, role: str = "user") -> dict[str, Any]:
    """One row with DAPO-Math-17k's columns: data_source, prompt, ability, reward_model, extra_info."""
    return {"data_source": "math_dapo", "prompt": [{"content": PRE + problem + SUF, "role": role}],
            "ability": "MATH", "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"id-{index}"}}


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def run(*args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_dapo_parquet_layout_is_unwrapped_and_deduplicated(tmp_path: Path, prep: ModuleType) -> None:
    problems = [("What is $2^{10}$?", "1024"), ("Find $x$ if $3x + 1 = 10$.", "3"), ("How many primes are below 20?", "8")]
    rows = [dapo_row(p, a, i) for i, (p, a) in enumerate(problems)] * 3  # the file repeats each problem
    rows.append(dapo_row("What is  $2^{10}$? ", "1000", 99))  # the same problem (spacing aside), another answer
    table = pa.Table.from_pylist(rows)
    assert table.schema.field("prompt").type == pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
    assert table.schema.field("reward_model").type.get_field_index("ground_truth") >= 0
    source = write_parquet(tmp_path / "dapo-math-17k.parquet", rows)

    got, report = prep.convert([source])
    assert got == [{"prompt": p, "label": a} for p, a in problems]
    assert (report.read, report.duplicates, report.bad) == (10, 7, [])
    assert len(report.conflicts) == 1 and f"{source}:10: field 'label': '1000'" in report.conflicts[0]
    assert f"{source}:1 has '1024'" in report.conflicts[0]

    kept, _ = prep.convert([source], keep_instructions=True, limit=2)
    assert [r["prompt"] for r in kept] == [PRE + p + SUF for p, _ in problems[:2]]

    out = tmp_path / "train.jsonl"
    done = run(source, "-o", out, "--limit", 2)
    assert done.returncode == 0, done.stderr
    assert "wrote 2 rows" in done.stdout
    good, bad = read_rows(DataConfig(path=out), RetoolMathEnv.task_type.model_validate)  # what the run reads
    assert bad == [] and [d for _, d in good] == got[:2]


def test_aime_style_files_with_other_column_names(tmp_path: Path, prep: ModuleType) -> None:
    jsonl = tmp_path / "aime.jsonl"
    jsonl.write_text(json.dumps({"ID": "2024-I-1", "Problem": "Find $1 + 1$.", "Solution": "...", "Answer": 2}) + "\n"
                     + "\n" + json.dumps({"ID": "2024-I-2", "Problem": "Find $2 + 2$.", "Answer": "004"}) + "\n")
    parquet = write_parquet(tmp_path / "aime_2025.parquet", [{"problem_idx": 1, "problem": "Find $3 + 3$.", "answer": 6}])
    got, report = prep.convert([jsonl, parquet])
    assert got == [{"prompt": "Find $1 + 1$.", "label": "2"}, {"prompt": "Find $2 + 2$.", "label": "004"},
                   {"prompt": "Find $3 + 3$.", "label": "6"}]
    assert report.bad == []
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"q": "Find $5 - 1$.", "meta": {"final": "4"}}) + "\n")
    got, _ = prep.convert([other], prompt_field="q", answer_field="meta.final")
    assert got == [{"prompt": "Find $5 - 1$.", "label": "4"}]


def test_bad_rows_are_named_and_nothing_is_written(tmp_path: Path, prep: ModuleType) -> None:
    rows = [dapo_row("What is $1 + 2$?", "3", 0), dapo_row("What is $5 + 5$?", None, 1),
            dapo_row("What is $7 - 2$?", "5", 2, role="system"), dapo_row("What is $4 \\cdot 4$?", "16", 3)]
    source = write_parquet(tmp_path / "bad.parquet", rows)
    _, report = prep.convert([source])
    assert [str(b) for b in report.bad] == [
        f"{source}:2: field 'reward_model.ground_truth': expected the answer as text or a number, got None",
        f"{source}:3: field 'prompt': no user message among roles ['system']"]
    out = tmp_path / "out.jsonl"
    done = run(source, "-o", out)
    assert done.returncode == 2
    assert f"error: {source}:2: field 'reward_model.ground_truth'" in done.stderr
    assert "error: 2 bad row(s); nothing written" in done.stderr
    assert not out.exists()
    done = run(source, "-o", out, "--skip-bad-rows")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["label"] for line in out.read_text().splitlines()] == ["3", "16"]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"problem": "Find $1$.", "answer": "1"}\n{"problem": "oops"\n{"question": "Find $2$."}\n')
    _, report = prep.convert([broken])
    assert str(report.bad[0]).startswith(f"{broken}:2: not valid JSON")
    assert str(report.bad[1]).startswith(f"{broken}:3: no answer column: expected one of ['answer', 'label', "
                                         "'ground_truth']")
