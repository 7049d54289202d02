"""Per-token channels on a trajectory (agentrl.token_data): appended with their tokens or written later,
all-or-nothing on bad rows, packed on disk, carried by pickling, episodes, batching and packing."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl import Episode, Trajectory
from agentrl.episode import load_episodes, save_episodes
from agentrl.token_data import ROUTED_EXPERTS, TEACHER_LOGPROBS, Alignment, ChannelError, TokenChannel
from agentrl.train.batching import build_training_batch
from agentrl.train.packing import collate
from agentrl.trajectory import SCHEMA_VERSION, ForkReason, Status, StopReason, TrajectoryError

LAYERS, TOP_K = 3, 2


def _routing(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 8, size=(n, LAYERS, TOP_K), dtype=np.uint8)


def _traj(**ids: str) -> Trajectory:
    return Trajectory.from_prompt([1, 2, 3], vocab_size=100, group_id=ids.get("g", "g0"),
                                  rollout_id=ids.get("r", "r0"))


def test_rows_come_with_their_tokens_and_later_and_other_appends_leave_them_absent() -> None:
    t = _traj()
    prompt_rows = _routing(3, 1)
    assert t.write_channel(ROUTED_EXPERTS, 0, prompt_rows) == 0          # the prompt's prefill, after the fact
    turn = _routing(2, 2)
    t.append_model([4, 5], [-0.1, -0.2], channels={ROUTED_EXPERTS: turn})
    t.append_env([6, 7], kind="tool")                                      # absent until the next prefill
    t.append_model([8], [-0.3], channels={TEACHER_LOGPROBS: np.array([-0.7], dtype=np.float32)})
    routing, teacher = t.channels[ROUTED_EXPERTS], t.channels[TEACHER_LOGPROBS]
    assert len(routing) == len(teacher) == len(t.tokens) == 8
    assert routing.present.tolist() == [True] * 5 + [False] * 3
    assert np.array_equal(routing.values[:3], prompt_rows) and np.array_equal(routing.values[3:5], turn)
    assert teacher.present.tolist() == [False] * 7 + [True] and teacher.values[7] == np.float32(-0.7)
    assert routing.alignment is Alignment.POSITION and teacher.alignment is Alignment.TOKEN
    later = _routing(2, 3)
    assert t.write_channel(ROUTED_EXPERTS, 5, later) == 0
    assert routing.spans() == [(0, 7)]
    # a row written again with another value is reported (the caller decides what it means)
    changed = later.copy()
    changed[1, 0, 0] = (int(changed[1, 0, 0]) + 1) % 8
    assert t.write_channel(ROUTED_EXPERTS, 5, changed) == 1
    t.validate()


@pytest.mark.parametrize(("rows", "needle"), [
    (np.zeros((2, LAYERS + 1, TOP_K), dtype=np.uint8), "expected (3, 2) per token"),
    (np.zeros((1, LAYERS, TOP_K), dtype=np.uint8), "1 rows for 2 new tokens"),
    (np.full((2, LAYERS, TOP_K), 300), "do not fit uint8"),
    (np.full((2, LAYERS, TOP_K), 0.5), "floating-point rows for an integer channel"),
])
def test_bad_rows_are_refused_and_append_nothing(rows: np.ndarray, needle: str) -> None:
    t = _traj()
    t.append_model([4], [-0.1], channels={ROUTED_EXPERTS: _routing(1)})
    before = t.to_dict()
    with pytest.raises(TrajectoryError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        t.append_model([5, 6], [-0.1, -0.2], channels={ROUTED_EXPERTS: rows, TEACHER_LOGPROBS: np.zeros(2)})
    assert t.to_dict() == before


def test_a_nan_teacher_logprob_is_refused() -> None:
    t = _traj()
    with pytest.raises(TrajectoryError, match="NaN or an infinity"):
        t.append_model([4], [-0.1], channels={TEACHER_LOGPROBS: np.array([np.nan], dtype=np.float32)})
    assert TEACHER_LOGPROBS not in t.channels and len(t.tokens) == 3


def test_writes_past_the_tokens_are_refused() -> None:
    t = _traj()
    with pytest.raises(TrajectoryError, match=r"positions \[2, 4\); expected positions within \[0, 3\)"):
        t.write_channel(ROUTED_EXPERTS, 2, _routing(2))


def test_packed_on_disk_round_trip_and_bytes_per_token(tmp_path: Path) -> None:
    t = _traj()
    t.write_channel(ROUTED_EXPERTS, 0, _routing(3))
    t.append_model([4, 5], [-0.1, -0.2], channels={ROUTED_EXPERTS: _routing(2, 5)})
    t.append_env([6], kind="tool")
    t.finish(Status.COMPLETED, StopReason.NO_TOOL_CALLS)
    t.reward = 1.0
    record = t.to_dict()
    assert record["schema"] == SCHEMA_VERSION == 2
    packed = record["channels"][ROUTED_EXPERTS]
    assert packed["spans"] == [[0, 5]] and packed["length"] == 6
    import base64
    assert len(base64.b64decode(packed["data"])) == 5 * LAYERS * TOP_K  # one byte per expert id, present rows only
    back = Trajectory.from_dict(json.loads(json.dumps(record)))
    assert back == t and back.channels[ROUTED_EXPERTS].present.tolist() == [True] * 5 + [False]
    # pickling (Ray, worker processes) and copying keep them too
    assert pickle.loads(pickle.dumps(t)) == t and copy.deepcopy(t) == t
    # whole episodes: save_episodes / load_episodes
    fork = Trajectory.from_prompt([1, 9], vocab_size=100, group_id="g0", rollout_id="r0", sequence_index=1,
                                  fork_reason=ForkReason.COMPACTION)
    fork.write_channel(ROUTED_EXPERTS, 0, _routing(2, 7))
    fork.append_model([4], [-0.5], channels={ROUTED_EXPERTS: _routing(1, 8)})
    fork.finish(Status.COMPLETED, StopReason.NO_TOOL_CALLS)
    fork.reward = 1.0
    path = tmp_path / "episodes.jsonl"
    save_episodes(path, [Episode(sequences=[t, fork])])
    [loaded] = load_episodes(path)
    assert loaded.sequences == [t, fork] and loaded.sequences[1].fork_reason is ForkReason.COMPACTION


def test_records_before_channels_still_load_and_newer_schemas_are_refused() -> None:
    t = _traj()
    t.append_model([4], [-0.1])
    old = t.to_dict()
    for key in ("schema", "fork_reason", "channels"):
        old.pop(key, None)
    back = Trajectory.from_dict(old)
    assert back.channels == {} and back.fork_reason is None and back.tokens == t.tokens
    with pytest.raises(TrajectoryError, match="schema 3; this agentrl reads schema 1 to 2"):
        Trajectory.from_dict({**t.to_dict(), "schema": 3})


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda c: c.update(length=9), "channels\\['routed_experts'\\] has 9 rows for 4 tokens"),
    (lambda c: c.update(data=""), "0 data bytes for 4 present rows"),
    (lambda c: c.update(spans=[[2, 1]]), "span|data bytes"),
    (lambda c: c.update(dtype="object"), "dtype='object'"),
])
def test_broken_channel_records_are_refused(edit, needle: str) -> None:  # type: ignore[no-untyped-def]
    t = _traj()
    t.append_model([4], [-0.1])
    t.write_channel(ROUTED_EXPERTS, 0, _routing(4))
    record = json.loads(json.dumps(t.to_dict()))
    edit(record["channels"][ROUTED_EXPERTS])
    with pytest.raises((TrajectoryError, ChannelError), match=needle):
        Trajectory.from_dict(record)


def test_growth_is_amortised_and_rows_survive_it() -> None:
    channel = TokenChannel("uint16", (2,))
    expect = []
    for i in range(300):
        row = np.array([[i, i + 1]], dtype=np.uint16)
        channel.extend(1, row)
        expect.append(row[0])
    assert np.array_equal(channel.values, np.array(expect)) and channel.complete


def test_batching_and_packing_carry_channels_with_their_alignment() -> None:
    episodes = []
    for r, seed in (("r0", 1), ("r1", 2)):
        t = _traj(r=r)
        t.write_channel(ROUTED_EXPERTS, 0, _routing(3, seed))
        t.append_model([4, 5], [-0.1, -0.2], channels={ROUTED_EXPERTS: _routing(2, seed + 10),
                                                        TEACHER_LOGPROBS: np.array([-1.0, -2.0], np.float32)})
        t.finish(Status.COMPLETED, StopReason.NO_TOOL_CALLS)
        t.reward = float(seed)
        episodes.append(Episode(sequences=[t]))
    batch = build_training_batch(episodes)
    assert all(s.channels[ROUTED_EXPERTS] == e.trajectory.channels[ROUTED_EXPERTS]
               for s, e in zip(batch.sequences, episodes, strict=True))
    micro = collate(batch.sequences, [0, 1])
    routing, teacher = micro.channels[ROUTED_EXPERTS], micro.channels[TEACHER_LOGPROBS]
    assert micro.num_tokens == 8 and routing.values.shape == (8, LAYERS, TOP_K) and teacher.values.shape == (8,)
    # routing describes each input position (rows [:-1]); a teacher logprob describes each target (rows [1:])
    first = episodes[0].trajectory
    assert torch.equal(routing.values[:4], torch.from_numpy(first.channels[ROUTED_EXPERTS].values[:4]))
    assert routing.present.tolist() == [True] * 4 + [True] * 4
    assert teacher.present.tolist() == [False, False, True, True] * 2
    assert teacher.values[2:4].tolist() == [-1.0, -2.0]
    assert torch.equal(micro.target_ids[2:4], torch.tensor([4, 5]))  # the positions that predict the scored tokens
