"""Trajectory: the two mutators, their invariants, terminal statuses and lossless JSONL round trips."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl import Trajectory
from agentrl.chat.types import Message, ToolCall
from agentrl.trajectory import (
    SegmentKind,
    Status,
    StopReason,
    TrajectoryError,
    load_jsonl,
    save_jsonl,
)

VOCAB = 100


def _traj() -> Trajectory:
    return Trajectory.from_prompt([1, 2, 3], messages=[Message(role="user", content="hi")], vocab_size=VOCAB,
                                  group_id="g0", rollout_id="r0")


def test_append_model_and_env_keep_alignment() -> None:
    t = _traj()
    t.append_model([4, 5], [-0.5, -1.0], weight_version="7", finish_reason="stop", message_index=1)
    t.append_env([6, 7, 8], kind="tool", message_index=2)
    t.append_model([9], [-0.1])
    assert t.tokens == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert t.loss_mask == [1, 1, 0, 0, 0, 1]
    assert t.logprobs == [-0.5, -1.0, 0.0, 0.0, 0.0, -0.1]
    assert [(s.kind, s.start, s.end, s.trainable, s.turn) for s in t.segments] == [
        (SegmentKind.PROMPT, 0, 3, False, 0), (SegmentKind.MODEL, 3, 5, True, 1),
        (SegmentKind.TOOL, 5, 8, False, 1), (SegmentKind.MODEL, 8, 9, True, 2)]
    assert t.segments[1].weight_version == "7" and t.segments[1].finish_reason == "stop"
    assert t.status is Status.RUNNING and t.num_trainable_tokens == 3
    t.validate()


@pytest.mark.parametrize(("ids", "lps", "needle"), [
    ([4, 5], [-0.1], "2 token ids but 1 logprobs"),
    ([4], [math.nan], "logprobs[0] = nan"),
    ([4], [math.inf], "logprobs[0] = inf"),
    ([4], [0.5], "expected a finite value <= 0"),
    ([VOCAB], [-0.1], f"token_ids[0] = {VOCAB}"),
    ([-1], [-0.1], "token_ids[0] = -1"),
])
def test_append_model_rejects_bad_input_and_changes_nothing(ids: list[int], lps: list[float], needle: str) -> None:
    t = _traj()
    before = t.to_dict()
    with pytest.raises(TrajectoryError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        t.append_model(ids, lps)
    assert t.to_dict() == before


def test_append_env_rejects_trainable_kinds() -> None:
    t = _traj()
    for kind in ("model", "prompt", "bogus"):
        with pytest.raises(TrajectoryError, match="expected one of tool, user, scaffold"):
            t.append_env([4], kind=kind)


def test_no_append_after_terminal_and_first_terminal_wins() -> None:
    t = _traj()
    t.append_model([4], [-0.2])
    assert t.finish(Status.TRUNCATED, StopReason.CONTEXT_BUDGET)
    assert not t.finish(Status.COMPLETED, StopReason.NO_TOOL_CALLS)
    assert (t.status, t.stop_reason) == (Status.TRUNCATED, StopReason.CONTEXT_BUDGET)
    with pytest.raises(TrajectoryError, match="already truncated"):
        t.append_model([5], [-0.1])
    with pytest.raises(TrajectoryError, match="already truncated"):
        t.append_env([5], kind="tool")
    with pytest.raises(TrajectoryError, match="expected a terminal status"):
        _traj().finish(Status.RUNNING)


def test_empty_turn_appends_nothing() -> None:
    t = _traj()
    assert t.append_model([], []) is None
    assert t.append_env([], kind="scaffold") is None
    assert len(t.segments) == 1 and t.response_length == 0


def test_empty_prompt_rejected() -> None:
    with pytest.raises(TrajectoryError, match="empty prompt"):
        Trajectory.from_prompt([])


def test_load_rejects_broken_records(tmp_path: Path) -> None:
    t = _traj()
    t.append_model([4, 5], [-0.5, -1.0])
    good = t.to_dict()
    bad_mask = dict(good, loss_mask=[1])
    bad_segment = dict(good, segments=[good["segments"][0], dict(good["segments"][1], trainable=False)])
    bad_gap = dict(good, segments=[good["segments"][0], dict(good["segments"][1], start=4)])
    for record, needle in [(bad_mask, "len(loss_mask)=1"), (bad_segment, "disagrees with loss_mask"),
                           (bad_gap, "expected a non-empty response segment starting at 3")]:
        with pytest.raises(TrajectoryError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            Trajectory.from_dict(record)
    path = tmp_path / "bad.jsonl"
    path.write_text('{"tokens": [1]}\n')
    with pytest.raises(TrajectoryError, match=r"bad.jsonl:1"):
        load_jsonl(path)


# -- property tests over random episodes -----------------------------------------------------

_logprob = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False, allow_infinity=False)
_turn = st.one_of(
    st.tuples(st.just("model"), st.lists(st.tuples(st.integers(0, VOCAB - 1), _logprob), min_size=0, max_size=8)),
    st.tuples(st.sampled_from(["tool", "user", "scaffold"]),
              st.lists(st.tuples(st.integers(0, VOCAB - 1), st.just(0.0)), min_size=0, max_size=8)),
)


@settings(max_examples=300, deadline=None)
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10), turns=st.lists(_turn, max_size=12),
       end=st.sampled_from([None, *[s for s in Status if s.terminal]]))
def test_random_episodes_keep_invariants_and_round_trip(prompt: list[int], turns: list[tuple[str, list[tuple[int, float]]]],
                                                        end: Status | None, tmp_path_factory: pytest.TempPathFactory) -> None:
    t = Trajectory.from_prompt(prompt, messages=[Message(role="user", content="q ü")], vocab_size=VOCAB,
                               rollout_id="r", group_id="g")
    expected_mask: list[int] = []
    for kind, pairs in turns:
        ids = [p[0] for p in pairs]
        if kind == "model":
            t.append_model(ids, [p[1] for p in pairs], weight_version="v1")
            expected_mask += [1] * len(ids)
        else:
            t.append_env(ids, kind=kind)
            expected_mask += [0] * len(ids)
        t.validate()
    t.messages.append(Message(role="assistant", content="", tool_calls=[ToolCall("calc", {"x": [1, None]}, id="c0")]))
    if end is not None:
        t.finish(end, StopReason.FAILED)
    assert len(t.tokens) == t.prompt_length + len(t.loss_mask) == t.prompt_length + len(t.logprobs)
    assert t.loss_mask == expected_mask
    assert sum(s.length for s in t.segments) == len(t.tokens)
    back = Trajectory.from_dict(t.to_dict())
    assert back == t
    assert pickle.loads(pickle.dumps(t)) == t
    path = tmp_path_factory.mktemp("jsonl") / "t.jsonl"
    save_jsonl(path, [t, t])
    assert load_jsonl(path) == [t, t]


def test_a_lone_surrogate_from_an_environment_is_saved_as_the_replacement_character(tmp_path: Path) -> None:
    t = _traj()
    t.append_model([4], [-0.5])
    t.info["unsent_messages"] = [{"role": "tool", "content": "bytes \udcff decoded with surrogateescape"}]
    t.finish(Status.COMPLETED, StopReason.ENV_DONE)
    save_jsonl(tmp_path / "t.jsonl", [t, _traj()])
    first, second = load_jsonl(tmp_path / "t.jsonl")
    assert first.info["unsent_messages"][0]["content"] == "bytes \ufffd decoded with surrogateescape"
    first.info = t.info = {}
    assert first.to_dict() == t.to_dict() and second.to_dict() == _traj().to_dict()


def test_checked_ids_are_checked_once_and_trusted_by_from_prompt() -> None:
    from agentrl.trajectory import CheckedIds

    ids = CheckedIds([5, 0, 9])
    assert ids == (5, 0, 9) and ids.max_id == 9 and CheckedIds([]).max_id == -1
    with pytest.raises(ValueError, match=r"ids\[1\] = -1; expected a plain int >= 0"):
        CheckedIds([3, -1])
    with pytest.raises(ValueError, match=r"ids\[0\] = 2.0"):
        CheckedIds([2.0])  # type: ignore[list-item]
    traj = Trajectory.from_prompt(ids, vocab_size=10)
    assert traj.tokens == [5, 0, 9] and type(traj.tokens) is list
    traj.tokens.append(1)  # the trajectory owns its list; the shared ids are untouched
    assert ids == (5, 0, 9)
    with pytest.raises(TrajectoryError, match=r"prompt_ids\[2\] = 9; expected an id in \[0, 9\)"):
        Trajectory.from_prompt(ids, vocab_size=9)  # the vocabulary bound is still checked
