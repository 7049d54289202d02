"""The example environment "fix the failing test" on real workspaces: the scripted solver earns 1, a
policy that games the visible tests (rewrites them, the test runner, adds a ``conftest.py``) earns 0,
a group prepares its workspace once, aborted and failed episodes remove theirs; ``agentrl env check``
passes; two training steps of the tiny model run on it (the fake engine's scripted replies; the real
torch trainer, real workspaces, real grading)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentrl.chat import ChatTemplate
from agentrl.environments import FailurePolicy, make_group
from agentrl.environments.fix_test import FixTestEnv
from agentrl.environments.fix_test_data import make_fix_rows, scripted_fix_policy
from agentrl.rollout import AgentConfig, SamplingParams, run_episode
from agentrl.runner.config import RunConfig
from agentrl.testing.policy import FakePolicyClient
from agentrl.testing.runner import build_fake_runner, fake_run_config
from agentrl.testing.tokenizer import build_tokenizer
from agentrl.tools.workspace import Workspaces

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

ROWS = make_fix_rows(4, seed=1)
AGENT = AgentConfig(sampling=SamplingParams(max_new_tokens=200))


def episode(row: dict[str, Any], policy: Any, workspaces: Workspaces, backend: str = "bwrap") -> Any:
    async def go() -> Any:
        tok = build_tokenizer()
        env = FixTestEnv(row, backend=backend)
        assert env.workspace_session is not None
        env.workspace_session._workspaces = workspaces
        ep = await run_episode(env, ChatTemplate.from_name("qwen3", tokenizer=tok), FakePolicyClient(tok, policy),
                               AGENT)
        return ep.trajectory

    return asyncio.run(go())


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_solved_earns_one_gamed_tests_earn_nothing(backend: str, request: pytest.FixtureRequest) -> None:
    options = {"docker": {"docker_host": request.getfixturevalue("docker_host")}} if backend == "docker" else {}
    workspaces = Workspaces(backend_options=options)
    solved = episode(ROWS[0], scripted_fix_policy(ROWS), workspaces, backend)
    assert solved.reward == 1.0, (solved.info, [m.content for m in solved.messages])
    assert solved.info["reward_info"]["tests_run"] == 3
    tool_names = [c.name for m in solved.messages if m.role == "assistant" for c in m.tool_calls]
    assert tool_names == ["bash", "read_file", "python", "edit_file", "bash"]
    assert "OK" in str(solved.messages[-2].content)  # the visible tests pass after the fix
    gamed = episode(ROWS[1], scripted_fix_policy(ROWS, cheat=True), workspaces, backend)
    assert gamed.reward == 0.0 and gamed.info["reward_info"]["failures"] == 1, gamed.info
    declined = episode(ROWS[2], scripted_fix_policy(ROWS, solve=lambda req: False), workspaces, backend)
    assert declined.reward == 0.0
    asyncio.run(workspaces.close())
    assert workspaces.stats["created"] == 3 and workspaces.live == {}


def test_a_group_prepares_one_workspace_and_forks_it() -> None:
    async def go() -> tuple[list[float | None], Any]:
        tok = build_tokenizer()
        template = ChatTemplate.from_name("qwen3", tokenizer=tok)
        workspaces = Workspaces()
        group = make_group(FixTestEnv, ROWS[3], size=4)
        for env in group.envs:
            assert env.workspace_session is not None
            env.workspace_session._workspaces = workspaces
        client = FakePolicyClient(tok, scripted_fix_policy(ROWS))
        episodes = await asyncio.gather(*(run_episode(env, template, client, AGENT) for env in group.envs))
        await workspaces.close()
        return [ep.trajectory.reward for ep in episodes], workspaces

    rewards, workspaces = asyncio.run(go())
    assert rewards == [1.0] * 4
    assert workspaces.stats["prepared"] == 1 and workspaces.stats["created"] == 4
    assert workspaces.leftovers() == {"workspaces": 0}


def test_agentrl_env_check_passes(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in ROWS[:2]))
    out = subprocess.run([sys.executable, "-m", "agentrl.cli.main", "env", "check",
                          "agentrl.environments.fix_test:FixTestEnv", "--data", str(data)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 rows, 8 episodes, 0 violation(s)" in out.stdout, out.stdout


async def test_two_training_steps_run_on_the_tiny_model(tmp_path: Path) -> None:
    """The loop runs: rollouts in workspaces, graded by the hidden tests, trained for 2 steps (a scripted
    engine, so nothing is learned). Half the members (by episode) decline to fix: rewards differ."""
    rows = make_fix_rows(6, seed=2)
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "train.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    raw = fake_run_config(tmp_path, steps=2, groups_per_step=2, group_size=2, checkpoint_every=None).to_dict()
    raw["train"]["max_tokens_per_micro_batch"] = 8192  # an episode with six tool schemas and file contents: ~2k tokens
    config = RunConfig.from_dict(raw)
    policy = scripted_fix_policy(rows, solve=lambda req: int(str(req.routing_key)[-1], 16) % 2 == 0)
    runner, _client = build_fake_runner(config, environment=FixTestEnv, policy=policy, reward=None,
                                       max_new_tokens=200)
    summary = await runner.run()
    assert summary.steps == 2 and summary.policy_version == 2, summary
    episodes = [ep for step in (1, 2) for ep in runner.run_dir.read_trajectories(step)]
    assert len(episodes) == 8
    rewards = [ep.trajectory.reward for ep in episodes]
    assert set(rewards) <= {0.0, 1.0} and rewards.count(1.0) >= 1, rewards
    assert [m["step"] for m in runner.run_dir.read_metrics()] == [1, 2]


def test_aborted_and_failed_episodes_remove_their_workspace() -> None:
    """An episode that is aborted after its first tool call, and one that fails (the failure policy ends it
    on a tool error), leave no workspace once the agent loop has closed them."""

    async def go() -> tuple[list[str], Workspaces]:
        tok = build_tokenizer()
        template = ChatTemplate.from_name("qwen3", tokenizer=tok)
        workspaces = Workspaces()
        ends = []
        aborted = FixTestEnv(ROWS[0])
        failing = FixTestEnv(ROWS[1], failure_policy=FailurePolicy(overrides={"tool_error": "end"}))
        for env in (aborted, failing):
            assert env.workspace_session is not None
            env.workspace_session._workspaces = workspaces
        calls = {"n": 0}

        def after_first_call() -> bool:
            calls["n"] += 1
            return calls["n"] > 1

        ep = await run_episode(aborted, template, FakePolicyClient(tok, scripted_fix_policy(ROWS)), AGENT,
                               should_abort=after_first_call)
        ends.append(ep.trajectory.stop_reason.value)
        broken = scripted_fix_policy(ROWS, solve=lambda req: True)

        def read_missing(req: Any) -> str:  # the second reply reads a file that does not exist: tool_error
            if req.text.count("<tool_response>") == 1:
                return '<tool_call>\n{"name": "read_file", "arguments": {"path": "nope.py"}}\n</tool_call><|im_end|>'
            return broken(req)

        ep = await run_episode(failing, template, FakePolicyClient(tok, read_missing), AGENT)
        ends.append(ep.trajectory.stop_reason.value)
        assert all(e.workspace_session is not None and not e.workspace_session.active for e in (aborted, failing))
        await workspaces.close()
        return ends, workspaces

    ends, workspaces = asyncio.run(go())
    assert ends == ["aborted", "failed"]
    assert workspaces.stats["created"] == 2 and workspaces.stats["removed"] == 2 and workspaces.live == {}
