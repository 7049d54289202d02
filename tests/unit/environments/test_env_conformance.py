"""``check_environment`` passes a correct environment and names each violation of broken ones."""

from __future__ import annotations

from pathlib import Path

# broken_envs sits next to this file; pytest puts this folder on sys.path (no __init__.py here).
import broken_envs as b  # type: ignore[import-not-found]
import pytest

from agentrl.environments.conformance import check_environment, example_arguments

ROWS = [{"answer": "3"}, {"answer": "4"}]


async def test_a_correct_environment_passes() -> None:
    report = await check_environment(b.GoodEnv, ROWS)
    assert report.ok, report.format()
    assert report.rows_checked == 2 and report.episodes == 8


@pytest.mark.parametrize(("env_cls", "check", "fragment"), [
    (b.SharedStateEnv, "shared_state", "class attributes changed"),
    (b.RowMutatingEnv, "shared_state", "row was modified"),
    (b.StepAfterDoneEnv, "step_after_done", "accepted after the episode was done"),
    (b.UnpicklableEnv, "pickle", "lock ("),
    (b.LeakyEnv, "leak", "sleep 10"),
    (b.OutOfRangeEnv, "reward_range", "reward 5.0 lies outside"),
    (b.RaisingEnv, "exception", "KeyError"),
    (b.EndlessEnv, "contract", "did not end"),
    (b.NotMessagesEnv, "contract", "non-empty list of Message"),
    (b.SyncResetEnv, "contract", "reset() returned list instead of an awaitable: define it as `async def reset"),
    (b.AssistantOpeningEnv, "contract", "system and user messages only"),
])
async def test_each_broken_environment_is_reported(env_cls: type, check: str, fragment: str) -> None:
    report = await check_environment(env_cls, ROWS[:1])
    assert check in report.checks_failed, report.format()
    assert any(fragment in str(v) for v in report.violations if v.check == check), report.format()
    assert report.checks_failed == {check} or env_cls is b.SharedStateEnv, report.format()
    while b.LEAKED:
        proc = b.LEAKED.pop()
        proc.kill()
        proc.wait()


async def test_each_problem_is_reported_once_per_row_with_its_episodes() -> None:
    report = await check_environment(b.RaisingEnv, ROWS[:1])
    assert len(report.violations) == 1, report.format()  # the same KeyError in the tools and failures episodes
    assert report.violations[0].message.endswith("(in the tools, failures episodes)")
    bad_rows = await check_environment(b.TypedRowEnv, [{"answer": "x"}, {"answer": 3}, {"nope": 1}],
                                       row_numbers=[2, 5, 9])
    assert [(v.check, v.line) for v in bad_rows.violations] == [("row", 2), ("row", 9)], bad_rows.format()
    assert "line 2: TypedRowEnv(row) refused the row: ValueError: TypedRowEnv: dataset row does not fit Answer" in bad_rows.format()
    assert bad_rows.episodes == 4  # only the good row ran episodes


async def test_a_tool_that_always_raises_is_a_warning() -> None:
    report = await check_environment(b.AlwaysRaisingToolEnv, ROWS)
    assert report.ok, report.format()
    assert [w.check for w in report.warnings] == ["tool_error"]
    text = report.format()
    assert "1 warning(s)" in text and "warning: [tool_error] tool 'broken' raised on every call (4)" in text
    assert "the backing service is down" in text and "'echo'" not in text


async def test_a_tool_that_returns_none_is_a_warning() -> None:
    report = await check_environment(b.NoneToolEnv, ROWS[:1])
    assert report.ok, report.format()  # a warning, not a violation
    assert [w.check for w in report.warnings] == ["tool_none"], report.format()
    text = report.format()
    assert "warning: [tool_none] tool 'lookup' returned None on 2 of 2 calls (e.g. with {\"key\": \"1\"})" in text
    assert "a forgotten `return`?" in text and "'echo'" not in text  # echo returns its text
    assert not (await check_environment(b.GoodEnv, ROWS[:1])).warnings


async def test_a_correct_reward_function_passes_and_is_called_on_every_episode() -> None:
    report = await check_environment(b.GoodEnv, ROWS[:1], reward=b.reward_ok)
    assert report.ok, report.format()
    # tools x2 and failures: the whole conversation and its first reply; answer: one reply only
    assert report.reward_calls == 7
    assert "reward broken_envs:reward_ok called 7 times" in report.format()


@pytest.mark.parametrize(("fn", "fragment"), [
    (b.reward_none_without_answer, "the reward function returned None; expected a number (score an answer it "
                                   "cannot read too, e.g. 0.0) on the episode cut after its first reply (last "
                                   "assistant text 'Let me use the tools.')"),
    (b.reward_raises, "the reward function raised KeyError: 'label' (at tests/unit/environments/broken_envs.py:170 "
                      "in reward_raises) on the episode (last assistant text 'The answer is \\\\boxed{0}.')"),
    (b.reward_nan, "the reward function returned nan; expected a finite number on the episode"),
], ids=["none", "raises", "nan"])
async def test_a_broken_reward_function_is_reported_with_the_text(fn: object, fragment: str) -> None:
    report = await check_environment(b.GoodEnv, ROWS[:1], reward=fn)  # type: ignore[arg-type]
    assert report.checks_failed == {"reward_fn"}, report.format()
    assert any(fragment in v.message for v in report.violations), report.format()


async def test_verbose_keeps_every_scripted_episode() -> None:
    report = await check_environment(b.GoodEnv, ROWS[:1], verbose=True, row_numbers=[7])
    assert [t.splitlines()[0] for t in report.transcripts] == [
        f"--- line 7, {s} episode" for s in ("tools", "tools", "failures", "reference")]
    assert report.transcripts[0].splitlines()[1:] == [  # each turn, readable: what was sent, what came back
        "    reset:   user: Say 3.",
        '    reply 1: assistant: Let me use the tools. [calls: echo({"text": "1"})]',
        "    step 1:  tool: 1",
        "    reply 2: assistant: The answer is \\boxed{0}.",
        "    step 2:  (no messages) -> done (no_tool_calls)",
        "    reward:  0"]
    assert report.transcripts[3].splitlines()[-1] == "    reward:  1"  # the reference reply wins
    assert report.format().startswith("--- line 7, tools episode")


def test_shared_state_also_shows_as_diverging_episodes() -> None:
    import asyncio

    b.SharedStateEnv.history.clear()
    report = asyncio.run(check_environment(b.SharedStateEnv, ROWS[:1]))
    assert any("different transcripts" in v.message for v in report.violations)


def test_example_arguments_fill_required_fields() -> None:
    schema = {"type": "object", "required": ["code", "n", "mode", "flag"],
              "properties": {"code": {"type": "string"}, "n": {"type": "integer"},
                             "mode": {"type": "string", "enum": ["a", "b"]}, "flag": {"type": "boolean"},
                             "opt": {"type": "number"}}}
    assert example_arguments(schema) == {"code": "print(1)", "n": 1, "mode": "a", "flag": True}


def test_agentrls_own_reaper_is_not_an_episodes_process(tmp_path: Path) -> None:
    """The reaper agentrl starts for this process (a workspace, a server) outlives any episode by design:
    it is never counted as an episode's process (no leak, no shared_processes warning)."""
    import os

    import psutil

    from agentrl._reaper import reap_path_with_this_process, unreap_path
    from agentrl.environments import conformance

    folder = tmp_path / "kept"
    folder.mkdir()
    reap_path_with_this_process(str(folder))  # starts this process's reaper if none runs
    try:
        reapers = [p.pid for p in psutil.Process(os.getpid()).children() if "agentrl._reaper" in " ".join(p.cmdline())]
        assert reapers  # it runs, as this process's child
        assert not {pid for pid, _ in conformance._descendants()} & set(reapers)
    finally:
        unreap_path(str(folder))
