"""Fix the failing test: an agent repairs a small Python package in its own workspace.

Each row (:func:`~agentrl.environments.fix_test_data.make_fix_rows`) is a generated package with an
injected bug and a failing unittest test. The episode gets a workspace
(:mod:`agentrl.tools.workspace`) holding the package, its visible tests and ``run_tests.py``, and the
tools ``bash``, ``python`` (a kernel), ``read_file``, ``write_file``, ``edit_file``, ``list_dir``.
A GRPO group's members fork one prepared workspace.

Reward: the task's **hidden tests**, run after the episode (before the workspace is removed) on the
model's source only, with a pristine harness, through :meth:`Workspace.grade
<agentrl.tools.workspace.Workspace.grade>`: every process the model started is gone first, and the
grader runs where none of them could reach it, from files the model never could write (the grader
program and the hidden tests, read-only at ``/grader``). It copies the package's regular ``.py``
files (no symlinks, nothing else) into a fresh folder and runs the hidden tests on that copy with
``python3 -I`` (no ``PYTHONPATH``, no user site): nothing the model changed outside its package —
the visible tests, ``run_tests.py``, a ``conftest.py``, a ``sitecustomize.py`` — is even read. The
verdict is the grader's own count line (the expected number of tests ran, none failed), carrying a
per-grading nonce, not an exit status. 1.0 when all hidden tests pass, else 0.0
(``reward_info``: tests run, failures, errors). The package's own code runs in the grader's process,
as tests do: what it could do there is the limit of in-process tests (see docs/sandbox.md, "What a
reward may trust").

Options: ``backend`` (``"bwrap"`` or ``"docker"``), ``size_mb`` (the workspace's writable cap).

Example::

    rows = make_fix_rows(4, seed=0)
    env = FixTestEnv(rows[0])
    episode = await run_episode(env, ChatTemplate.from_name("qwen3", tokenizer=tok), client)
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from pydantic import BaseModel, Field

from agentrl.chat.types import Message
from agentrl.environments.base import Environment
from agentrl.environments.policy import EnvLimits, FailurePolicy
from agentrl.rewards.types import Reward
from agentrl.tools.sandbox import SandboxLimits
from agentrl.tools.workspace import WorkspaceSpec
from agentrl.trajectory import Trajectory

__all__ = ["FIX_SPEC", "FIX_SYSTEM_PROMPT", "GRADER_COMMAND", "FixTask", "FixTestEnv", "grader_files"]

FIX_SYSTEM_PROMPT = (
    "You are a software engineer working in a sandbox. The folder /work holds a Python package with a bug. "
    "Use the tools to run the tests (python3 run_tests.py), read and edit files, and fix the package's "
    "source. Hidden tests check the package itself, not the visible tests. When you are done, answer with a "
    "one-line summary and no tool call."
)

FIX_SPEC = WorkspaceSpec(size_mb=32, limits=SandboxLimits(timeout_s=20.0, cpu_s=20, memory_mb=512, tmp_mb=32),
                         kernel_memory_mb=512, cell_timeout_s=20.0)
"""The workspace of a task: empty base, the task's files written in, no setup commands."""


class FixTask(BaseModel):
    """A row of :func:`~agentrl.environments.fix_test_data.make_fix_rows`."""

    task_id: str = Field(min_length=1)
    package: str = Field(pattern=r"^[a-z_][a-z0-9_]*$")
    files: dict[str, str]
    hidden_tests: dict[str, str]
    hidden_count: int = Field(ge=1)
    fix: dict[str, str] = Field(default_factory=dict)


GRADER_COMMAND = "python3 -I -B /grader/grade.py"
"""The command :meth:`FixTestEnv.reward` grades with (the files of :func:`grader_files` at /grader)."""


def grader_files(package: str, tests: dict[str, str], nonce: str) -> dict[str, str]:
    """The grader's files (its program, ``spec.json``, the hidden ``tests`` under ``tests/``) that
    grade ``/work/<package>`` (see the module doc); the program's last output line is
    ``GRADE <nonce> <tests run> <failures> <errors>``."""
    spec = json.dumps({"package": package, "nonce": nonce})
    return {"grade.py": _GRADER, "spec.json": spec, **{f"tests/{name}": text for name, text in tests.items()}}


_GRADER = r'''
import io, json, os, shutil, sys, tempfile, unittest
with open("/grader/spec.json") as f:
    spec = json.load(f)
root = tempfile.mkdtemp(prefix="grade-", dir="/tmp")
source = os.path.join("/work", spec["package"])
for folder, dirs, files in os.walk(source):
    dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d)) and d != "__pycache__"]
    target = os.path.join(root, spec["package"], os.path.relpath(folder, source))
    os.makedirs(target, exist_ok=True)
    for name in files:
        path = os.path.join(folder, name)
        if name.endswith(".py") and os.path.isfile(path) and not os.path.islink(path):
            shutil.copyfile(path, os.path.join(target, name))
os.chdir(root)
sys.path[:0] = [root, "/grader/tests"]  # the copy of the package; the hidden tests, read-only
suite = unittest.defaultTestLoader.discover("/grader/tests", pattern="test_hidden*.py", top_level_dir="/grader/tests")
result = unittest.TextTestRunner(stream=io.StringIO()).run(suite)
sys.stdout.write(f"\nGRADE {spec['nonce']} {result.testsRun} {len(result.failures)} {len(result.errors)}\n")
'''


class FixTestEnv(Environment):
    """Fix the failing test; see the module doc."""

    task_type = FixTask
    default_limits = EnvLimits(max_turns=12, max_tool_calls=16)
    default_failure_policy = FailurePolicy()
    workspace = FIX_SPEC

    def __init__(self, task: Any, *, backend: str = "bwrap", size_mb: int | None = None,
                 system_prompt: str = FIX_SYSTEM_PROMPT, limits: EnvLimits | None = None,
                 failure_policy: FailurePolicy | None = None) -> None:
        # set before super().__init__, which reads workspace_spec()
        self._spec = FIX_SPEC.replace(backend=backend, **({"size_mb": size_mb} if size_mb is not None else {}))
        super().__init__(task, limits=limits, failure_policy=failure_policy)
        self.system_prompt = system_prompt

    def workspace_spec(self) -> WorkspaceSpec:
        return self._spec

    def workspace_files(self) -> dict[str, str]:
        return dict(self.task.files)

    async def reset(self) -> list[Message]:
        task = self.task
        return [Message(role="system", content=self.system_prompt),
                Message(role="user", content=f"Task {task.task_id}. The package `{task.package}` in /work has a "
                                             "failing test. Find the bug in its source and fix it.")]

    async def reward(self, trajectory: Trajectory) -> Reward:
        assert self.workspace_session is not None
        task = self.task
        nonce = secrets.token_hex(8)
        ws = await self.workspace_session.get()  # created now if the model never used a tool
        result = await ws.grade(GRADER_COMMAND, files=grader_files(task.package, task.hidden_tests, nonce),
                                timeout_s=60.0)
        counts = _grade_line(result.stdout, nonce)
        info = {"grader_exit": result.exit_code, "grader_timed_out": result.timed_out}
        if counts is None:
            return Reward(0.0, parts={"hidden_tests": 0.0}, info={**info, "grader": "no verdict",
                                                                   "stderr": result.stderr[-300:]})
        run, failures, errors = counts
        passed = result.ok and run == task.hidden_count and failures == 0 and errors == 0
        value = 1.0 if passed else 0.0
        return Reward(value, parts={"hidden_tests": value},
                      info={**info, "tests_run": run, "failures": failures, "errors": errors})


def _grade_line(stdout: str, nonce: str) -> tuple[int, int, int] | None:
    for line in reversed(stdout.splitlines()):
        parts = line.split()
        if len(parts) == 5 and parts[0] == "GRADE" and parts[1] == nonce:
            try:
                return int(parts[2]), int(parts[3]), int(parts[4])
            except ValueError:
                return None
    return None
