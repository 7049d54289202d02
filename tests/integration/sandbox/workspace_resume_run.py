"""One side of the workspace resume test (``test_workspace_resume.py``), run as its own process.

    python workspace_resume_run.py save STATE_FILE     # step 1 cuts the slow task short; saves; waits to be killed
    python workspace_resume_run.py resume STATE_FILE   # loads the state, collects a step, prints its report

"fix the failing test" on the fake engine with the scripted solver: the slow task's final answer is
slow, so step 1 ends with its group buffered after the fix was made in its workspaces. The resumed run
replays the group (the recorded tool calls run again on fresh forks) and finishes it: the hidden tests
pass only if the fix is in the rebuilt workspace. ``resume`` prints ``replaying`` when a replay starts
(and, with ``STALL_REPLAY=1``, ``stalled`` after the first replayed step, then waits to be killed).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from agentrl.chat import ChatTemplate, Message, ToolCallFailure
from agentrl.data import DataSource
from agentrl.environments import StepResult
from agentrl.environments.fix_test import FixTestEnv
from agentrl.environments.fix_test_data import make_fix_rows, scripted_fix_policy
from agentrl.rollout import AgentConfig, SamplingParams
from agentrl.rollout.scheduler import Scheduler, SchedulerConfig
from agentrl.testing.policy import FakePolicyClient, PolicyRequest
from agentrl.testing.tokenizer import build_tokenizer
from agentrl.tools.workspace import default_workspaces
from agentrl.trajectory import Trajectory

ROWS = make_fix_rows(2, seed=3)
SLOW = ROWS[0]["task_id"]
TASK = re.compile(r"Task (fix-\d+-\d+)")


def delay(req: PolicyRequest) -> float:
    """The slow task's last turn (its answer, after the fix and the test run) takes ~1 s; all else is quick."""
    slow = TASK.findall(req.text)[:1] == [SLOW] and req.text.count("<tool_response>") >= 5
    return 0.08 if slow else 0.0005


class Announced(FixTestEnv):
    """Says when a replay starts; with ``STALL_REPLAY`` set, stops for a minute after the first replayed step
    (its workspace exists by then), where the test kills the process."""

    def begin_replay(self, sequences: Sequence[Trajectory], env_info: Sequence[Mapping[str, Any]]) -> None:
        print("replaying", flush=True)
        self.stall = bool(os.environ.get("STALL_REPLAY"))
        super().begin_replay(sequences, env_info)

    async def step(self, reply: Message, failures: Sequence[ToolCallFailure] = ()) -> StepResult:
        result = await super().step(reply, failures)
        if getattr(self, "stall", False):
            print("stalled", flush=True)
            await asyncio.sleep(60)
        return result


def scheduler() -> Scheduler:
    tok = build_tokenizer()
    client = FakePolicyClient(tok, scripted_fix_policy(ROWS), token_delay_s=delay)
    config = SchedulerConfig(groups_per_step=1, group_size=2, over_sampling=1.0, partial_rollout=True)
    return Scheduler(Announced, ChatTemplate.from_name("qwen3", tokenizer=tok), client,
                     DataSource.from_rows(ROWS, shuffle=False), config,
                     agent=AgentConfig(sampling=SamplingParams(max_new_tokens=200)))


async def save(path: str) -> None:
    sched = scheduler()
    batch = await sched.collect()
    state = sched.state_dict()
    buffered = [g["row"]["task_id"] for g in state["buffer"]]
    with open(path, "wb") as f:
        f.write(orjson.dumps(state))
    print(json.dumps({"saved": True, "buffered": buffered, "pid": os.getpid(),
                      "trained": [ep.trajectory.reward for ep in batch.episodes()],
                      "workspaces": default_workspaces().leftovers()}), flush=True)
    await asyncio.sleep(600)  # killed here, with the buffered episodes' workspaces alive


async def resume(path: str) -> None:
    sched = scheduler()
    with open(path, "rb") as f:
        sched.load_state_dict(orjson.loads(f.read()))
    batch = await sched.collect()
    episodes = [ep for g in batch.groups for ep in g.episodes]
    print(json.dumps({"restored": batch.report.members_restored, "mismatch": batch.report.restored_mismatch, "problems": batch.report.restore_problems,
                      "rewards": [[TASK.findall(str(ep.trajectory.messages[1].content))[0], ep.trajectory.reward]
                                  for ep in episodes],
                      "replayed_calls": [len([m for m in ep.trajectory.messages if m.role == "tool"]) for ep in episodes]}),
          flush=True)
    await default_workspaces().close()


if __name__ == "__main__":
    asyncio.run(save(sys.argv[2]) if sys.argv[1] == "save" else resume(sys.argv[2]))
