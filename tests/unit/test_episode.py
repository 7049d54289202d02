"""An Episode (every forked sequence) is what gets saved, loaded and batched; nothing trainable is lost."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentrl import Episode, TrajectoryError, load_episodes, save_episodes
from agentrl.chat import ChatTemplate, Message, ToolCallFailure
from agentrl.environments import Environment, StepResult
from agentrl.rollout import AgentConfig, SamplingParams, run_episode
from agentrl.runner.rundir import RunDirectory
from agentrl.testing.scripted import ScriptedClient
from agentrl.train import build_training_batch
from agentrl.trajectory import StopReason, Trajectory, iter_records

ANSWER = "<think>\nDone.\n</think>\n\n\\boxed{1024}<|im_end|>"


class FollowUpEnv(Environment):
    """A second user question after the first answer: Qwen3 strips the earlier reasoning, so the episode forks."""

    async def reset(self) -> list[Message]:
        return [Message(role="user", content="2**10?")]

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        self._begin_step()
        if self.turns == 1:
            return StepResult(messages=[Message(role="user", content="And 2**11?")], info={"turn": 1})
        return self._finish(StepResult(), StopReason.ENV_DONE)

    def reward(self, trajectory: Trajectory) -> float:
        return float(self.task["r"])


async def _episodes(tok: Any, n: int = 2) -> list[Episode]:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    config = AgentConfig(sampling=SamplingParams(max_new_tokens=64), vocab_size=len(tok) + 2)
    return [await run_episode(FollowUpEnv({"r": i}), template, ScriptedClient(tok, [ANSWER, ANSWER]), config,
                              group_id="g") for i in range(n)]


async def test_a_forked_episode_round_trips_through_jsonl(tok: Any, tmp_path: Path) -> None:
    episodes = await _episodes(tok)
    assert [len(e.sequences) for e in episodes] == [2, 2]
    path = tmp_path / "rollouts.jsonl"
    assert save_episodes(path, episodes) == 2
    loaded = load_episodes(path)
    assert [e.to_dict() for e in loaded] == [e.to_dict() for e in episodes]
    assert loaded[0].env_info == [{"turn": 1}] and loaded[1].sequences[0].sequence_index == 0
    assert save_episodes(path, episodes[:1], append=True) == 1 and len(load_episodes(path)) == 3


async def test_batching_episodes_keeps_every_sequences_trainable_tokens(tok: Any) -> None:
    episodes = await _episodes(tok)
    batch = build_training_batch(episodes)
    assert len(batch.sequences) == 4 and batch.num_rollouts == 2
    assert batch.num_trainable_tokens == sum(e.num_trainable_tokens for e in episodes)
    only_last = build_training_batch([e.trajectory for e in episodes])
    assert only_last.num_trainable_tokens < batch.num_trainable_tokens  # what saving `.trajectory` used to lose


async def test_broken_episode_records_are_refused_naming_the_line(tok: Any, tmp_path: Path) -> None:
    (first, second) = await _episodes(tok)
    mixed = Episode(sequences=[first.sequences[0], second.sequences[1]])
    with pytest.raises(TrajectoryError, match=r"sequences\[1\]: rollout/group id"):
        mixed.validate()
    record = first.to_dict()
    record["sequences"][1]["sequence_index"] = 5
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(first.to_dict()) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(TrajectoryError, match=r"bad.jsonl:2: sequences\[1\].sequence_index = 5; expected 1"):
        load_episodes(path)
    with pytest.raises(TrajectoryError, match="expected an object with a 'sequences' list"):
        Episode.from_dict({"tokens": [1]})


async def test_load_episodes_reads_a_run_folder_and_gzipped_files(tok: Any, tmp_path: Path) -> None:
    episodes = await _episodes(tok, 3)
    want = [e.to_dict() for e in episodes]
    run = RunDirectory(tmp_path / "run", config_hash="abc")
    run.write_trajectories(2, episodes[1:])  # written out of order: read back in step order
    run.write_trajectories(1, episodes[:1])
    assert [e.to_dict() for e in load_episodes(tmp_path / "run")] == want  # the header lines are skipped
    assert [e.to_dict() for e in load_episodes(tmp_path / "run" / "trajectories")] == want
    assert [e.to_dict() for e in load_episodes(run.trajectory_path(2))] == want[1:]
    plain = tmp_path / "rollouts.jsonl"
    save_episodes(plain, episodes)
    packed = tmp_path / "rollouts.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert [e.to_dict() for e in load_episodes(packed)] == want


def test_load_episodes_names_what_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "empty_run" / "trajectories").mkdir(parents=True)
    with pytest.raises(TrajectoryError, match=r"empty_run: no trajectories/step_\*.jsonl.gz files in it"):
        load_episodes(tmp_path / "empty_run")
    misnamed = tmp_path / "rollouts.jsonl"
    misnamed.write_bytes(gzip.compress(b'{"sequences": []}\n'))
    with pytest.raises(TrajectoryError, match=r"rollouts.jsonl:1: not UTF-8 text \(a gzipped file needs a name "
                                              r"ending in .gz\)"):
        load_episodes(misnamed)
    torn = tmp_path / "torn.jsonl.gz"
    whole = gzip.compress(b"".join(b'{"step": %d}\n' % i for i in range(5000)))
    torn.write_bytes(whole[:len(whole) // 2])  # a copy cut short
    with pytest.raises(TrajectoryError, match=r"torn.jsonl.gz: not a complete gzip file \(EOFError"):
        list(iter_records(torn, dict))
