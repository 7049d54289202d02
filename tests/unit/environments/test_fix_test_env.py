""""Fix the failing test" without a sandbox: the generated tasks (deterministic, one bug each that the
visible and the hidden tests catch and the recorded fix repairs), the row type, the grader's verdict
line, the scripted policy's moves, and the workspace declaration of ``Environment``."""

from __future__ import annotations

import io
import json
import pickle
import sys
import types
import unittest
from typing import Any

import pytest

from agentrl.chat.types import Message
from agentrl.environments import Environment
from agentrl.environments.fix_test import GRADER_COMMAND, FixTask, FixTestEnv, _grade_line, grader_files
from agentrl.environments.fix_test_data import make_fix_rows, scripted_fix_policy
from agentrl.tools.workspace import TOOL_NAMES, WorkspaceSpec
from agentrl.trajectory import Trajectory


def run_tests(files: dict[str, str], test_file: str, package: str) -> unittest.TestResult:
    """Imports the package from ``files`` in memory and runs one test module's tests."""
    modules = {}
    for path, source in files.items():
        if path.startswith(package + "/") and path.endswith(".py"):
            name = path[:-3].replace("/", ".").removesuffix(".__init__")
            modules[name] = source
    saved = {k: sys.modules.get(k) for k in [*modules, package]}
    try:
        for name in sorted(modules, key=len):
            module = types.ModuleType(name)
            module.__path__ = []  # type: ignore[attr-defined]  # a package, for "from pkg.core import ..."
            sys.modules[name] = module
        for name in sorted(modules, key=lambda n: n != f"{package}.core"):
            exec(compile(modules[name], name, "exec"), sys.modules[name].__dict__)
        test_module = types.ModuleType("t")
        exec(compile(test_file, "t", "exec"), test_module.__dict__)
        suite = unittest.defaultTestLoader.loadTestsFromModule(test_module)
        return unittest.TextTestRunner(stream=io.StringIO()).run(suite)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_rows_are_deterministic_and_valid() -> None:
    rows = make_fix_rows(10, seed=4)
    assert rows == make_fix_rows(10, seed=4) and rows != make_fix_rows(10, seed=5)
    assert len({r["package"] for r in rows}) == 10 and len({r["task_id"] for r in rows}) == 10
    for row in rows:
        task = FixTask.model_validate(row)
        assert task.fix["path"] in task.files and task.files[task.fix["path"]].count(task.fix["old"]) == 1
        assert not any(name.startswith("test_hidden") for name in task.files)  # hidden tests stay out


@pytest.mark.parametrize("row", make_fix_rows(8, seed=0), ids=lambda r: r["task_id"])
def test_each_task_fails_with_the_bug_and_passes_with_the_fix(row: dict[str, Any]) -> None:
    pkg, fix = row["package"], row["fix"]
    hidden = row["hidden_tests"]["test_hidden.py"]
    buggy = run_tests(row["files"], row["files"]["tests/test_core.py"], pkg)
    assert len(buggy.failures) + len(buggy.errors) == 1 and buggy.testsRun == 3
    assert not run_tests(row["files"], hidden, pkg).wasSuccessful()
    fixed = dict(row["files"])
    fixed[fix["path"]] = fixed[fix["path"]].replace(fix["old"], fix["new"])
    assert run_tests(fixed, fixed["tests/test_core.py"], pkg).wasSuccessful()
    result = run_tests(fixed, hidden, pkg)
    assert result.wasSuccessful() and result.testsRun == row["hidden_count"]


@pytest.mark.parametrize(("bad", "field"), [({"package": "Not-A-Name"}, "package"), ({"hidden_count": 0}, "hidden_count"),
                                            ({"files": "x"}, "files")])
def test_bad_rows_name_the_field(bad: dict[str, Any], field: str) -> None:
    row = {**make_fix_rows(1)[0], **bad}
    with pytest.raises(ValueError, match=f"field {field}"):
        FixTestEnv(row)


def test_grade_line_needs_the_nonce() -> None:
    assert _grade_line("noise\nGRADE abc 3 0 0\n", "abc") == (3, 0, 0)
    assert _grade_line("GRADE forged 3 0 0\n", "abc") is None
    assert _grade_line("GRADE abc 3 0 0\nGRADE abc three 0 0", "abc") is None
    files = grader_files("pkg", {"test_hidden.py": "x"}, "n0nce")
    assert sorted(files) == ["grade.py", "spec.json", "tests/test_hidden.py"] and "/grader/grade.py" in GRADER_COMMAND
    assert json.loads(files["spec.json"]) == {"package": "pkg", "nonce": "n0nce"}
    compile(files["grade.py"], "grade.py", "exec")


class Req:
    def __init__(self, text: str) -> None:
        self.text = text
        self.routing_key = "0"


def test_scripted_policy_moves() -> None:
    rows = make_fix_rows(2, seed=0)
    policy = scripted_fix_policy(rows)
    head = f"Task {rows[1]['task_id']}."
    moves = [policy(Req(head + "<tool_response>" * n)) for n in range(6)]
    assert ['"bash"' in moves[0], '"read_file"' in moves[1], '"python"' in moves[2], '"edit_file"' in moves[3],
            '"bash"' in moves[4], moves[5].startswith("Done")] == [True] * 6
    assert policy(Req("Task fix-99-9999.")).startswith("I cannot tell")
    cheat = scripted_fix_policy(rows, cheat=True)
    assert '"run_tests.py"' in cheat(Req(head + "<tool_response>" * 3))


def test_environment_declares_a_workspace_with_its_tools() -> None:
    env = FixTestEnv(make_fix_rows(1)[0], backend="docker", size_mb=16)
    assert env.workspace_session is not None and env.workspace_session.spec.backend == "docker"
    assert env.workspace_session.spec.size_mb == 16
    assert [s["function"]["name"] for s in env.tool_specs()] == list(TOOL_NAMES)
    copy = pickle.loads(pickle.dumps(env))  # fresh: picklable, with its own session shared by its tools
    assert copy.workspace_session is not None and copy.workspace_session.spec == env.workspace_session.spec
    assert all(getattr(t, "session", None) is copy.workspace_session for t in copy.tool_map.values())
    assert env.workspace_files() == make_fix_rows(1)[0]["files"]


class Plain(Environment):
    async def reset(self) -> list[Message]:
        return [Message(role="user", content="hi")]

    def reward(self, trajectory: Trajectory) -> float:
        return 0.0


class Declared(Plain):
    workspace = WorkspaceSpec(tools=("bash", "read_file"))


def test_the_declaration_hook() -> None:
    assert Plain({}).workspace_session is None and Plain({}).tool_specs() == []
    env = Declared({})
    assert [s["function"]["name"] for s in env.tool_specs()] == ["bash", "read_file"]
    env.begin_replay([], [])  # nothing recorded: a no-op

    class Broken(Plain):
        workspace = "repo/"  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"Broken\.workspace: expected a WorkspaceSpec or None, got str"):
        Broken({})
