"""The docs' smolagents harness (``examples/byo_agent.py``) trained for 2 steps on the tiny Qwen3: the
real runner, the real torch trainer, the proxy, smolagents' own ``ToolCallingAgent`` in worker
threads, against the deterministic fake engine (its ~1,800-token system prompt does not fit the
shared CPU engine's 1,024-token context). Also measures the fork rate of smolagents' conversations."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentrl.environments import make_arithmetic_rows
from agentrl.runner import RunCallback, RunConfig
from agentrl.testing import build_tiny_model
from agentrl.testing.policy import PolicyRequest
from agentrl.testing.runner import build_fake_runner
from agentrl.trajectory import SegmentKind

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]


def smol_policy(request: PolicyRequest) -> str:
    """Multiply with the tool, then hand the observed result to final_answer (what ToolCallingAgent expects)."""
    text = request.text
    a, b = re.findall(r"What is (\d+) \* (\d+)\?", text)[-1]
    observed = re.findall(r"Observation:\n(-?\d+)", text)
    if observed:
        call = {"name": "final_answer", "arguments": {"answer": observed[-1]}}
    else:
        call = {"name": "multiply_numbers", "arguments": {"a": int(a), "b": int(b)}}
    return "<tool_call>\n" + orjson.dumps(call).decode().replace('":', '": ').replace(',"', ', "') + \
        "\n</tool_call><|im_end|>"


async def test_the_smolagents_example_trains_two_steps_on_the_tiny_model(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    from examples.byo_agent import smol_agent

    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in make_arithmetic_rows(8, seed=0)))
    config = RunConfig.from_dict({
        "model": {"path": str(build_tiny_model()), "dtype": "float32"},
        "data": {"train": {"path": str(data), "seed": 0}},
        "environment": {"name": "examples.byo_agent:smol_agent"},
        "rollout": {"sampling": {"max_new_tokens": 64}, "scheduler": {"groups_per_step": 2, "group_size": 2}},
        "train": {"steps": 2, "optimizer": {"lr": 1e-3}, "max_tokens_per_micro_batch": 8192},
        "logging": {"run_dir": str(tmp_path / "run")},
        "checkpoint": {"every_steps": None},
    })
    seen: list[Any] = []

    class Keep(RunCallback):
        async def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
            seen.append(metrics)

    runner, _engine = build_fake_runner(config, environment=smol_agent, policy=smol_policy, reward=None,
                                       callbacks=[Keep()])
    summary = await runner.run()
    assert summary.steps == 2 and len(seen) == 2
    assert [m["rollout/reward_mean"] for m in seen] == [1.0, 1.0]
    episodes = [ep for step in (1, 2) for ep in runner.run_dir.read_trajectories(step)]
    assert len(episodes) == 8
    for episode in episodes:
        episode.validate()
        assert episode.trajectory.info["answer"] in {"476216", "464280", *(r["answer"] for r in make_arithmetic_rows(8))}
        assert sum(t.num_model_turns for t in episode.sequences) == 2  # the call, then final_answer
        assert episode.trajectory.metrics["proxy/recognised/call_ids_in_text"] == 1  # calls came back as text
    requests = sum(ep.trajectory.metrics["proxy/requests"] for ep in episodes)
    forks = sum(ep.trajectory.metrics.get("proxy/forks", 0) for ep in episodes)
    print(f"smolagents: {requests:.0f} requests, {forks:.0f} forks, fork rate "
          f"{forks / (requests - len(episodes)):.2f} per follow-up request; trainable tokens "
          f"{sum(ep.num_trainable_tokens for ep in episodes)}; model segments "
          f"{sum(len(t.segments_of(SegmentKind.MODEL)) for ep in episodes for t in ep.sequences)}")
    sys.modules.pop("examples.byo_agent", None)
