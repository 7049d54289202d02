"""Hostile data: files that are not UTF-8, empty or all bad; duplicated ids; prompts far beyond the
context; a dataset that changes under a resumed run. Each gives a message naming the file, row, field
or value and what was expected, and no prompt is lost or trained twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentrl.chat import ChatTemplate
from agentrl.data import DataConfig, DataError, DataSource
from agentrl.environments import ToyArithmeticEnv, make_arithmetic_rows
from agentrl.rollout import AgentConfig, SamplingParams
from agentrl.rollout.scheduler import Scheduler, SchedulerConfig
from agentrl.testing.policy import FakePolicyClient, PolicyRequest

VALIDATE = ToyArithmeticEnv.task_type.model_validate


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def template(tok: Any) -> ChatTemplate:
    return ChatTemplate.from_name("qwen3", tokenizer=tok)


def answer(req: PolicyRequest) -> str:
    return "The answer is \\boxed{1}.<|im_end|>"


def test_a_file_that_is_not_utf8_at_all_names_the_file_line_and_encoding_problem(tmp_path: Path) -> None:
    path = tmp_path / "utf16.jsonl"
    path.write_bytes("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(3)).encode("utf-16"))
    with pytest.raises(DataError) as info:
        DataSource(DataConfig(path=path), validate=VALIDATE)
    message = str(info.value)
    assert "no usable rows" in message and f"{path}:1" in message and "not valid UTF-8" in message


def test_an_empty_file_and_a_file_of_blank_lines_are_refused_with_the_path(tmp_path: Path) -> None:
    for name, content in (("empty.jsonl", b""), ("blank.jsonl", b"\n \n\t\n")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match=rf"{name}: the dataset has no usable rows$"):
            DataSource(DataConfig(path=tmp_path / name))


def test_a_utf8_bom_and_crlf_line_ends_do_not_lose_the_first_row(tmp_path: Path) -> None:
    rows = make_arithmetic_rows(3)
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"".join(orjson.dumps(r) + b"\r\n" for r in rows))
    source = DataSource(DataConfig(path=path, shuffle=False), validate=VALIDATE)
    assert not source.bad_rows, [str(b) for b in source.bad_rows]
    assert [r.data["question"] for r in source.draw(3)] == [r["question"] for r in rows]


def test_duplicated_ids_and_duplicated_rows_are_distinct_prompts(tmp_path: Path) -> None:
    # prompt ids are row numbers, so an "id" column that repeats (or a row copied twice) loses nothing:
    # each line is its own prompt, trained once per epoch
    row = make_arithmetic_rows(1)[0]
    path = write_rows(tmp_path / "dups.jsonl", [{**row, "id": "same"} for _ in range(4)])
    source = DataSource(DataConfig(path=path, seed=1), validate=VALIDATE)
    drawn = source.draw(4)
    assert sorted(r.prompt_id for r in drawn) == ["1", "2", "3", "4"]
    assert {r.data["id"] for r in drawn} == {"same"}


async def test_a_prompt_far_beyond_the_context_fails_its_group_once_with_a_clear_reason(
        tok: Any, template: ChatTemplate) -> None:
    rows = make_arithmetic_rows(6, seed=0)
    rows[1]["question"] = "What is 3 * 4? " + "very long " * 2000
    seen: list[str] = []

    def policy(req: PolicyRequest) -> str:
        seen.append(req.rid)
        return answer(req)

    client = FakePolicyClient(tok, policy)
    sched = Scheduler(ToyArithmeticEnv, template, client, DataSource.from_rows(rows, shuffle=False),
                      SchedulerConfig(groups_per_step=3, group_size=2, member_retries=2),
                      agent=AgentConfig(sampling=SamplingParams(max_new_tokens=32), context_length=1024))
    batch = await sched.collect()
    report = batch.report
    report.check()
    assert report.trained == 3 and report.failed == {"prompt_too_long": 1}
    assert "2" not in [g.prompt_id for g in batch.groups]  # never trained as an empty episode
    assert report.members_regenerated == 0  # a row that cannot fit is not tried again
    example = report.failure_examples["prompt_too_long"]
    assert example.startswith("prompt 2: sample 2:") and "tokens and the context holds 1024" in example, example
    assert len(seen) == 3 * 2  # only the rows that fit reached the engine


async def test_a_dataset_changed_under_a_resumed_run_is_refused_naming_the_rows(tmp_path: Path, tok: Any,
                                                                               template: ChatTemplate) -> None:
    rows = make_arithmetic_rows(200, seed=0)
    path = write_rows(tmp_path / "train.jsonl", rows)
    config = DataConfig(path=path, seed=3)
    source = DataSource(config, validate=VALIDATE)
    sched = Scheduler(ToyArithmeticEnv, template, FakePolicyClient(tok, answer), source,
                      SchedulerConfig(groups_per_step=2, group_size=2), agent=AgentConfig())
    await sched.collect()
    state = orjson.loads(orjson.dumps(sched.state_dict()))  # as a checkpoint holds it
    await sched.shutdown()

    same = DataSource(config, validate=VALIDATE)
    same.load_state_dict(state["data"])  # the unchanged file resumes
    edited = [dict(r) for r in rows]
    edited[149]["question"] = "What is 1 * 1?"  # row 150 edited in place: same number of rows
    write_rows(path, edited)
    changed = DataSource(config, validate=VALIDATE)
    before = changed.state_dict()
    with pytest.raises(DataError, match=r"the data changed since the cursor was saved: the same 200 usable rows, "
                                        r"but rows 147-150 differ") as info:
        changed.load_state_dict(state["data"])
    assert str(path) in str(info.value) and changed.state_dict() == before  # nothing changed
    shuffled = list(reversed(rows))  # reordered rows: the same content under other prompt ids
    write_rows(path, shuffled)
    with pytest.raises(DataError, match="the data changed"):
        DataSource(config, validate=VALIDATE).load_state_dict(state["data"])
    legacy = {k: v for k, v in state["data"].items() if k != "fingerprint"}  # saved before fingerprints
    DataSource(config, validate=VALIDATE).load_state_dict(legacy)
