"""Typed episode errors: each way an episode goes wrong is an ``EpisodeError`` (kind, message, where) in
``Trajectory.errors``; it survives JSONL and pickling, old records' string keys are read into it, the
step report counts errors by kind and the viewer and run index show them."""

from __future__ import annotations

import asyncio
import html
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from agentrl import Episode, load_episodes, save_episodes
from agentrl.chat import ChatTemplate, FailureKind, Message
from agentrl.environments import Environment, FailurePolicy, StepResult
from agentrl.inspect import RunIndex, trajectory_html
from agentrl.rollout.agent import AgentConfig, run_episode
from agentrl.rollout.types import SamplingParams
from agentrl.testing.scripted import ScriptedClient
from agentrl.tools import ToolResult
from agentrl.trajectory import (
    EpisodeError,
    ErrorKind,
    Status,
    StopReason,
    Trajectory,
    TrajectoryError,
    load_jsonl,
    save_jsonl,
    status_for,
)

CALL = ('<think>\nUse code.\n</think>\n\n<tool_call>\n{"name": "%s", "arguments": {"code": "1+1"}}\n'
        "</tool_call><|im_end|>")
ANSWER = "<think>\nDone.\n</think>\n\n\\boxed{2}<|im_end|>"


def _finished(*errors: EpisodeError) -> Trajectory:
    traj = Trajectory.from_prompt([1, 2, 3], vocab_size=50, rollout_id="r", group_id="g")
    traj.append_model([4, 5], [-0.5, -0.25])
    traj.finish(Status.FAILED, StopReason.FAILED)
    traj.errors.extend(errors)
    return traj


ERRORS = (EpisodeError(ErrorKind.TOOL, "failure policy 'end' on tool_error: boom", turn=1, component="calc",
                       tool_call_id="call_0"),
          EpisodeError(ErrorKind.REWARD, "ValueError: no answer", turn=1, component="reward"))


def test_errors_survive_jsonl_and_pickling(tmp_path: Path) -> None:
    traj = _finished(*ERRORS)
    save_jsonl(tmp_path / "t.jsonl", [traj])
    [loaded] = load_jsonl(tmp_path / "t.jsonl")
    assert loaded.errors == list(ERRORS) and loaded.to_dict() == traj.to_dict()
    assert all(type(e.kind) is ErrorKind for e in loaded.errors)
    assert pickle.loads(pickle.dumps(traj)).errors == list(ERRORS)
    episode = Episode(sequences=[traj])
    save_episodes(tmp_path / "e.jsonl", [episode])
    assert load_episodes(tmp_path / "e.jsonl")[0].trajectory.errors == list(ERRORS)
    assert pickle.loads(pickle.dumps(episode)).trajectory.errors == list(ERRORS)


def test_where_and_str_name_the_turn_component_and_call() -> None:
    assert ERRORS[0].where == "turn 1 · calc · call call_0"
    assert str(ERRORS[1]) == "reward error (turn 1 · reward): ValueError: no answer"
    assert EpisodeError(ErrorKind.ENGINE, "down").where == "-"


def test_old_records_with_string_keys_are_read_into_typed_errors(tmp_path: Path) -> None:
    failed = _finished().to_dict()
    del failed["errors"]
    failed["info"] = {"engine_error": "InferenceError: connection refused", "reward_error": "KeyError: 'a'",
                      "forked_because": "kept"}
    truncated = dict(failed, status="truncated", stop_reason="context_budget",
                     info={"endpoint_error": "maximum context length is 512 tokens"})
    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (failed, truncated)))
    a, b = load_jsonl(path)
    assert [(e.kind, e.message, e.component) for e in a.errors] == [
        (ErrorKind.ENGINE, "InferenceError: connection refused", "engine"), (ErrorKind.REWARD, "KeyError: 'a'", "reward")]
    assert a.info == {"forked_because": "kept"}  # the string keys are taken out, the rest stays
    assert [e.kind for e in b.errors] == [ErrorKind.PROMPT_TOO_LONG]  # an engine error of a truncated episode
    counts = RunIndex.of_file(path).error_counts()  # the index reads them without loading the episodes
    assert counts == {"engine": 1, "reward": 1, "prompt_too_long": 1}


def test_a_broken_errors_entry_is_refused_naming_it() -> None:
    record = _finished().to_dict()
    record["errors"] = [{"kind": "gpu", "message": "x"}]
    with pytest.raises(TrajectoryError, match=r"errors entry: .*'gpu' is not a valid ErrorKind"):
        Trajectory.from_dict(record)


def test_every_stop_reason_has_a_terminal_status() -> None:
    for reason in StopReason:
        assert status_for(reason).terminal
    assert status_for(StopReason.CONTEXT_BUDGET) is Status.TRUNCATED
    assert status_for(StopReason.FAILED) is Status.FAILED and status_for(StopReason.ABORTED) is Status.ABORTED


# -- the agent loop records them ---------------------------------------------------------------------
class Calc:
    name = "calc"
    description = "Add."
    parameters: dict[str, Any] = {"type": "object", "properties": {"code": {"type": "string"}},  # noqa: RUF012
                                  "required": ["code"]}

    async def __call__(self, code: str) -> Any:
        return ToolResult.error(FailureKind.TOOL_ERROR, "failed: boom")


class CalcEnv(Environment):
    def __init__(self, task: Any, reward_raises: bool = False, **kw: Any) -> None:
        super().__init__(task, **kw)
        self.register_tool(Calc())
        self.reward_raises = reward_raises

    async def reset(self) -> list[Message]:
        return [Message(role="user", content="1+1?")]

    def reward(self, trajectory: Trajectory) -> float:
        if self.reward_raises:
            raise ValueError("no answer")
        return 0.0


async def _run(tok: Any, env: Environment, script: list[str], **config: Any) -> Episode:
    template = ChatTemplate.from_name("qwen3", tokenizer=tok)
    return await run_episode(env, template, ScriptedClient(tok, script),
                             AgentConfig(sampling=SamplingParams(max_new_tokens=64), **config))


@pytest.mark.parametrize(("tool", "failure", "kind"), [("calc", "tool_error", ErrorKind.TOOL),
                                                        ("nope", "unknown_tool", ErrorKind.PARSE)])
async def test_failure_policy_end_is_a_typed_error_naming_the_call(tok: Any, tool: str, failure: str,
                                                                   kind: ErrorKind) -> None:
    env = CalcEnv({}, failure_policy=FailurePolicy(overrides={failure: "end"}))
    ep = await _run(tok, env, [CALL % tool])
    assert (ep.status, ep.stop_reason) == (Status.FAILED, StopReason.FAILED)
    [error] = ep.trajectory.errors
    calls = ep.trajectory.messages[-1].tool_calls  # a call to an unknown tool is a parse failure: never made
    assert (error.kind, error.turn, error.component) == (kind, 1, tool)
    assert error.tool_call_id == (calls[0].id if calls else None) and (error.tool_call_id is not None) == bool(calls)
    assert error.message.startswith(f"failure policy 'end' on {failure}: ")


async def test_a_reward_that_raises_is_a_typed_error_scored_by_the_policy(tok: Any) -> None:
    """The default policy scores it 0.0 (the error on record, the text kept); ``drop_group`` leaves it
    unscored for the scheduler to drop its group. Never a reason to resample the episode."""
    error = EpisodeError(ErrorKind.REWARD, "ValueError: no answer", turn=1, component="reward")
    ep = await _run(tok, CalcEnv({}, reward_raises=True), [ANSWER])
    assert ep.status is Status.COMPLETED and ep.reward == 0.0 and ep.trajectory.metrics["reward_failed"] == 1.0
    assert ep.trajectory.errors == [error]
    assert ep.trajectory.errors[0].origin == "tests/unit/test_episode_errors.py:127 in CalcEnv.reward"  # where it raised
    dropped = await _run(tok, CalcEnv({}, reward_raises=True), [ANSWER], reward_failure="drop_group")
    assert dropped.reward is None and dropped.trajectory.errors == [error]


async def test_an_environment_hook_past_its_soft_deadline_ends_the_episode_with_an_env_error(tok: Any) -> None:
    class Stalls(CalcEnv):
        async def step(self, reply: Message, failures: Any = ()) -> StepResult:
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

    t0 = asyncio.get_running_loop().time()
    ep = await _run(tok, Stalls({}), [CALL % "calc"], env_timeout_s=0.3)
    assert asyncio.get_running_loop().time() - t0 < 5
    [error] = ep.trajectory.errors
    assert (ep.status, error.kind, error.component) == (Status.FAILED, ErrorKind.ENV, "step")
    assert "step() ran past its deadline of 0.3 s (rollout.agent.env_timeout_s)" in error.message


async def test_an_environment_failing_without_saying_why_gets_an_env_error(tok: Any) -> None:
    class Quits(CalcEnv):
        async def step(self, reply: Message, failures: Any = ()) -> StepResult:
            return StepResult(done=True, stop_reason=StopReason.FAILED, failures=[FailureKind.TOOL_TIMEOUT])

    ep = await _run(tok, Quits({}), [CALL % "calc"])
    [error] = ep.trajectory.errors
    assert (error.kind, error.component) == (ErrorKind.ENV, "step") and "failures: tool_timeout" in error.message


async def test_an_environment_message_no_tokenizer_can_encode_is_a_bridge_error(tok: Any, tmp_path: Path) -> None:
    class Surrogates(CalcEnv):  # text decoded with errors="surrogateescape" holds lone surrogates
        async def step(self, reply: Message, failures: Any = ()) -> StepResult:
            self._begin_step()
            return StepResult(messages=[Message(role="user", content="bytes \udcff here")])

    ep = await _run(tok, Surrogates({}), [ANSWER])
    [error] = ep.trajectory.errors
    assert (ep.status, error.kind, error.component, error.turn) == (Status.FAILED, ErrorKind.BRIDGE, "bridge", 1)
    assert "lone surrogate '\\udcff'" in error.message
    save_episodes(tmp_path / "e.jsonl", [ep])
    assert load_episodes(tmp_path / "e.jsonl")[0].to_dict() == ep.to_dict()


def test_the_viewer_shows_each_error_with_its_kind_and_where() -> None:
    page = trajectory_html(_finished(*ERRORS))
    for error in ERRORS:
        assert error.kind.value in page and html.escape(error.where) in page and html.escape(error.message) in page


def test_the_index_filters_and_counts_by_error_kind(tmp_path: Path) -> None:
    ok = Trajectory.from_prompt([1, 2], vocab_size=50, rollout_id="ok")
    ok.append_model([3], [-0.1])
    ok.finish(Status.COMPLETED, StopReason.NO_TOOL_CALLS)
    save_episodes(tmp_path / "e.jsonl", [Episode([_finished(*ERRORS)]), Episode([ok])])
    index = RunIndex.of_file(tmp_path / "e.jsonl")
    assert index.error_counts() == {"tool": 1, "reward": 1}
    assert [r.rollout_id for r in index.filter(error=ErrorKind.TOOL)] == ["r"]
    assert [r.rollout_id for r in index.filter(error="any")] == ["r"] and len(index.filter(error="engine")) == 0
