"""``check_environment`` passes a correct environment and names each violation of broken ones."""

from __future__ import annotations

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
