"""Workspace parts without a sandbox: the spec's and the task files' validation, path confinement of the
file tools' program (``openat2(RESOLVE_BENEATH)`` on real folders), the session's replay bookkeeping,
the kernel tool's rendering, and the manager's one-preparation-per-group rule (on a fake backend)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import pickle
import re
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentrl.chat.types import FailureKind, Message
from agentrl.tools.sandbox import ExecResult, SandboxLimits
from agentrl.tools.workspace import (
    Answer,
    CellResult,
    KernelPythonTool,
    Prepared,
    Workspace,
    WorkspaceBackend,
    WorkspaceReplayError,
    Workspaces,
    WorkspaceSession,
    WorkspaceSpec,
    answers_from_record,
    workspace_tools,
)
from agentrl.tools.workspace.base import files_key, task_files
from agentrl.tools.workspace.programs import PROGRAM_DIR


def _program(name: str) -> types.ModuleType:
    """A workspace program (stdlib only), loaded from its file: its folder must not join sys.path (it holds
    a ``docker.py``)."""
    spec = importlib.util.spec_from_file_location(name, PROGRAM_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_resolve = _program("_resolve")
_fsops = _program("_fsops")


# -- the spec ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("changes", "message"), [
    ({"backend": "podman"}, "WorkspaceSpec.backend: expected one of ('bwrap', 'docker'), got 'podman'"),
    ({"base": "/no/such/folder"}, "WorkspaceSpec.base: expected an existing folder, got '/no/such/folder'"),
    ({"setup": "make"}, "WorkspaceSpec.setup: expected a tuple of non-empty bash commands, got 'make'"),
    ({"setup": ("ok", " ")}, "WorkspaceSpec.setup: expected a tuple of non-empty bash commands"),
    ({"size_mb": 0}, "WorkspaceSpec.size_mb: expected a positive integer, got 0"),
    ({"size_mb": True}, "WorkspaceSpec.size_mb: expected a positive integer, got True"),
    ({"cell_timeout_s": -1}, "WorkspaceSpec.cell_timeout_s: expected a positive number, got -1"),
    ({"env": {"1BAD": "x"}}, "WorkspaceSpec.env: expected NAME=value string pairs"),
    ({"tools": ("bash", "shell")}, "WorkspaceSpec.tools: expected names from"),
    ({"limits": {"timeout_s": 1}}, "WorkspaceSpec.limits: expected SandboxLimits, got dict"),
])
def test_spec_errors_name_field_value_and_expectation(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        WorkspaceSpec(**changes)
    assert message in str(err.value)


def test_spec_normalises_and_compares(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    spec = WorkspaceSpec(base=str(link), env={"A": "1"}, setup=["true"])  # type: ignore[arg-type]
    assert spec.base == str(tmp_path.resolve()) and spec.env == (("A", "1"),) and spec.setup == ("true",)
    assert spec == WorkspaceSpec(base=str(tmp_path), env=(("A", "1"),), setup=("true",))
    assert pickle.loads(pickle.dumps(spec)) == spec


@pytest.mark.parametrize("path", ["/etc/x", "../x", "a/../../x", "a//b", "./a", "", "a/\0"])
def test_task_files_refuse_paths_outside_or_ambiguous(path: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"workspace files: path {path!r}")):
        task_files({path: "x"})


def test_task_files_and_key() -> None:
    files = task_files({"a/b.py": "print(1)", "c.bin": b"\x00"})
    assert files == {"a/b.py": b"print(1)", "c.bin": b"\x00"}
    spec = WorkspaceSpec()
    assert files_key(spec, files) == files_key(spec, dict(reversed(files.items())))
    assert files_key(spec, files) != files_key(spec, {**files, "c.bin": b"\x01"})
    assert files_key(spec, files) != files_key(spec.replace(setup=("true",)), files)


# -- path confinement of the file tools ----------------------------------------------------------
@pytest.mark.parametrize(("path", "expected"), [
    ("a/b", "a/b"), ("/work/a/b", "a/b"), ("/work", "."), ("./a/./b/", "a/b"), ("a/../b", "b"), (".", "."),
])
def test_relative_paths(path: str, expected: str) -> None:
    assert _fsops.relative(path) == expected


@pytest.mark.parametrize("path", ["/etc/passwd", "/workshop/x", "..", "a/../../b", "/work/../etc"])
def test_relative_refuses_paths_outside(path: str) -> None:
    with pytest.raises(_fsops.OpError, match="outside the workspace"):
        _fsops.relative(path)


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace root with escapes planted: absolute and relative symlinks out, a symlinked folder."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "ok.txt").write_text("line1\nline2\nline3\n")
    (root / "abs").symlink_to(outside / "secret.txt")
    (root / "rel").symlink_to("../outside/secret.txt")
    (root / "dir").symlink_to(outside)
    (root / "inner").symlink_to("ok.txt")
    return root, outside


def op(root: Path, name: str, **arguments: Any) -> dict[str, Any]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return _fsops.OPS[name](fd, **arguments)  # type: ignore[no-any-return]
    except _fsops.OpError as exc:
        return {"error": str(exc)}
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["abs", "rel", "dir/secret.txt"])
def test_symlinks_out_of_the_root_are_refused_for_reading(tree: tuple[Path, Path], name: str) -> None:
    root, _ = tree
    assert "leads outside the workspace" in op(root, "read", path=name)["error"]


@pytest.mark.parametrize("name", ["abs", "rel", "dir/new.txt", "dir/secret.txt"])
def test_symlinks_out_of_the_root_are_refused_for_writing(tree: tuple[Path, Path], name: str) -> None:
    root, outside = tree
    result = op(root, "write", path=name, content="pwned")
    assert "error" in result, result
    assert (outside / "secret.txt").read_text() == "secret" and sorted(os.listdir(outside)) == ["secret.txt"]


def test_file_operations_inside_the_root(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    assert op(root, "read", path="inner")["content"] == "line1\nline2\nline3\n"  # a symlink that stays inside
    assert op(root, "read", path="ok.txt", start_line=2, max_lines=1)["content"] == "line2\n"
    assert op(root, "write", path="new/deep/f.txt", content="x") == {"bytes": 1}
    assert (root / "new/deep/f.txt").read_text() == "x"
    assert op(root, "edit", path="ok.txt", old="line2", new="LINE2") == {"replacements": 1}
    assert "occurs 2 times" in op(root, "edit", path="ok.txt", old="line", new="L")["error"]  # line1, line3
    assert "not found" in op(root, "edit", path="ok.txt", old="nope", new="x")["error"]
    listing = op(root, "list", path=".", depth=2)["entries"]
    assert "new/" in listing and "new/deep/" in listing and any(e.startswith("abs -> ") for e in listing)
    (root / "bin").write_bytes(b"\x00\x01")
    assert "binary file" in op(root, "read", path="bin")["error"]
    os.mkfifo(root / "fifo")
    assert "not a regular file" in op(root, "read", path="fifo")["error"]  # never blocks on a FIFO


def test_open_beneath_refuses_magic_links(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    (root / "proc").symlink_to("/proc/self/root")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(_resolve.Escape):
            _resolve.open_beneath(fd, "proc/etc/passwd", os.O_RDONLY)
    finally:
        os.close(fd)


def test_fsops_main_prints_one_json_object(tree: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = tree
    _fsops.main({"op": "read", "path": "../x"}, root=str(root))
    assert json.loads(capsys.readouterr().out) == {"error": "path '../x' leads outside the workspace ('..' above "
                                                            "/work)"}


# -- the session: replay bookkeeping, pickling ---------------------------------------------------
class FakeWorkspace(Workspace):
    def __init__(self, spec: WorkspaceSpec, digests: list[str]) -> None:
        super().__init__(spec, "fake")
        self.digests = digests
        self.cells: list[str] = []

    async def run(self, command: str, *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
                  workdir: str = "/work") -> ExecResult:
        return ExecResult(stdout=f"ran {command}", stderr="", exit_code=0)

    async def python(self, code: str, *, timeout_s: float | None = None) -> CellResult:
        self.cells.append(code)
        return CellResult(stdout="fresh output\n", stderr="")

    async def file_op(self, op: str, **arguments: Any) -> dict[str, Any]:
        return {}

    async def digest(self, ignore: tuple[str, ...] = ()) -> str:
        return self.digests.pop(0)

    async def snapshot(self) -> bytes:
        return b""

    async def remove(self) -> None:
        self._removed = True


class FakeBackend(WorkspaceBackend):
    name = "bwrap"

    def __init__(self, digests: list[str] | None = None) -> None:
        self.prepares = 0
        self.released = 0
        self.digests = digests or []

    async def prepare(self, spec: WorkspaceSpec, files: Mapping[str, bytes], key: str) -> Prepared:
        self.prepares += 1
        await asyncio.sleep(0.01)
        return Prepared(key, spec, handle=None)

    async def fork(self, prepared: Prepared) -> Workspace:
        return FakeWorkspace(prepared.spec, list(self.digests))

    async def restore(self, prepared: Prepared, snapshot: bytes) -> Workspace:
        return await self.fork(prepared)

    async def release(self, prepared: Prepared) -> None:
        self.released += 1

    async def close(self) -> None:
        pass


def workspaces_with(backend: FakeBackend, **options: Any) -> Workspaces:
    wss = Workspaces(**options)
    wss._backends["bwrap"] = backend
    return wss


def test_a_group_prepares_once_and_its_state_goes_with_its_last_fork() -> None:
    async def go() -> tuple[int, int, int]:
        backend = FakeBackend()
        wss = workspaces_with(backend)
        wss._bind_loop()
        wss._backends["bwrap"] = backend
        spec = WorkspaceSpec()
        forks = await asyncio.gather(*(wss.create(spec, {"row.txt": "same row"}) for _ in range(8)))
        other = await wss.create(spec, {"row.txt": "another row"})
        for ws in [*forks, other]:
            await wss.remove(ws)
        return backend.prepares, backend.released, len(wss.live)

    assert asyncio.run(go()) == (2, 2, 0)


def test_keep_prepared_keeps_unused_states_for_the_next_group() -> None:
    async def go() -> tuple[int, int]:
        backend = FakeBackend()
        wss = workspaces_with(backend, keep_prepared=1)
        wss._bind_loop()
        wss._backends["bwrap"] = backend
        for _ in range(3):
            await wss.remove(await wss.create(WorkspaceSpec(), {"a": "1"}))
        return backend.prepares, backend.released

    assert asyncio.run(go()) == (1, 0)


def session_on(backend: FakeBackend) -> WorkspaceSession:
    wss = workspaces_with(backend)
    return WorkspaceSession(WorkspaceSpec(), {"a.txt": "a"}, workspaces=wss)


def test_a_fresh_session_pickles_a_live_one_refuses() -> None:
    async def go() -> None:
        backend = FakeBackend(["d"])
        session = session_on(backend)
        session.workspaces._bind_loop()
        session.workspaces._backends["bwrap"] = backend
        copy = pickle.loads(pickle.dumps(session))
        assert copy.spec == session.spec and not copy.active
        await session.get()
        with pytest.raises(TypeError, match="live workspace cannot be pickled"):
            pickle.dumps(session)
        await session.remove()
        assert not session.active

    asyncio.run(go())


def test_replayed_calls_run_again_and_answer_with_the_record() -> None:
    async def go() -> None:
        backend = FakeBackend(["aaaa", "bbbb", "cccc"])
        session = session_on(backend)
        session.workspaces._bind_loop()
        session.workspaces._backends["bwrap"] = backend
        python = KernelPythonTool(session)
        session.begin_replay([Answer("python", "recorded 1"), Answer("python", "recorded error", "tool_error")],
                             ["aaaa", "bbbb"])
        first = await python(code="x = 1")
        info: dict[str, Any] = {}
        await session.after_step(info)
        second = await python(code="y = 2")
        assert (first.content, first.is_error) == ("recorded 1", False)
        assert (second.content, second.error_kind) == ("recorded error", FailureKind.TOOL_ERROR)
        ws = session.workspace
        assert isinstance(ws, FakeWorkspace) and ws.cells == ["x = 1", "y = 2"]  # both ran for real
        assert info == {"workspace": {"digest": "aaaa"}}
        with pytest.raises(WorkspaceReplayError, match="digest bbbb where the record has cccc"):
            session._digests = ["cccc"]
            await session.after_step({})
        live = await python(code="z = 3")  # the record is used up: live results from now on
        assert live.content == "fresh output\n" and session.replayed == 2

    asyncio.run(go())


def test_replay_refuses_a_call_of_another_tool() -> None:
    async def go() -> None:
        backend = FakeBackend(["d"])
        session = session_on(backend)
        session.workspaces._bind_loop()
        session.workspaces._backends["bwrap"] = backend
        bash = workspace_tools(session, ("bash",))[0]
        session.begin_replay([Answer("python", "x")], [])
        with pytest.raises(WorkspaceReplayError, match="called 'bash' where the record has 'python'"):
            await bash(command="ls")

    asyncio.run(go())


def test_answers_from_record_pairs_tool_messages_with_failures_in_call_order() -> None:
    messages = [Message(role="user", content="q"),
                Message(role="tool", content="out 1", name="bash", tool_call_id="call_0"),
                Message(role="tool", content="4", name="calculator", tool_call_id="call_1"),
                Message(role="tool", content="Error: boom", name="python", tool_call_id="call_0")]
    info = [{"calls": [{"name": "bash", "failure": None}, {"name": "calculator", "failure": None}],
             "workspace": {"digest": "d1"}},
            {"calls": [{"name": "python", "failure": "tool_error"}], "workspace": {"digest": "d2"}}]
    answers, digests = answers_from_record(messages, info, ("bash", "python"))
    assert answers == [Answer("bash", "out 1", None), Answer("python", "Error: boom", "tool_error")]
    assert digests == ["d1", "d2"]


def test_kernel_results_tell_the_model_about_a_restart() -> None:
    async def go() -> list[Any]:
        backend = FakeBackend(["d"])
        session = session_on(backend)
        session.workspaces._bind_loop()
        session.workspaces._backends["bwrap"] = backend
        tool = KernelPythonTool(session)
        ws = await session.get()
        assert isinstance(ws, FakeWorkspace)
        results = []
        for cell in (CellResult("", "", exception="KernelDied", restarted="the kernel died (killed by SIGKILL)"),
                     CellResult("", "", timed_out=True, restarted="the cell did not stop at its time limit of 1 s"),
                     CellResult("partial\n", "Traceback...\n", exception="ZeroDivisionError")):
            async def fixed(code: str, *, timeout_s: float | None = None, cell: CellResult = cell) -> CellResult:
                return cell
            ws.python = fixed  # type: ignore[method-assign]
            results.append(await tool(code="x"))
        return results

    died, stuck, raised = asyncio.run(go())
    assert died.error_kind is FailureKind.TOOL_ERROR and "variables from earlier cells are gone" in died.content
    assert stuck.error_kind is FailureKind.TOOL_TIMEOUT and "kernel was restarted" in stuck.content
    assert raised.error_kind is FailureKind.TOOL_ERROR and raised.content == "partial\n[stderr]\nTraceback...\n"


def test_tool_schemas_and_argument_validation() -> None:
    session = WorkspaceSession(WorkspaceSpec(limits=SandboxLimits()))
    tools = workspace_tools(session)
    assert [t.name for t in tools] == ["bash", "python", "read_file", "write_file", "edit_file", "list_dir"]
    for t in tools:
        assert t.schema()["function"]["parameters"]["type"] == "object"
    result = asyncio.run(tools[3](path="a.txt"))  # write_file without content: refused before any workspace
    assert result.is_error and "content" in result.content and session.workspace is None
    with pytest.raises(ValueError, match=r"unknown tool name\(s\) \['shell'\]"):
        workspace_tools(session, ("shell",))


def test_public_names_are_pinned_and_resolve() -> None:
    import agentrl.tools.workspace as workspace

    assert sorted(workspace.__all__) == sorted([
        "BACKENDS", "TOOL_NAMES", "Answer", "BashTool", "CellResult", "EditFileTool", "KernelPythonTool",
        "ListDirTool", "Prepared", "ReadFileTool", "Workspace", "WorkspaceBackend", "WorkspaceError",
        "WorkspaceRemovedError", "WorkspaceReplayError", "WorkspaceSession", "WorkspaceSpec", "WorkspaceTool",
        "Workspaces", "WriteFileTool", "answers_from_record", "default_workspaces", "workspace_tools"])
    assert all(getattr(workspace, name, None) is not None for name in workspace.__all__)
