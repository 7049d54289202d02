"""The tools of a workspace: ``bash``, ``python`` (a kernel), ``read_file``, ``write_file``, ``edit_file``, ``list_dir``.

Each tool works on one :class:`~agentrl.tools.workspace.session.WorkspaceSession` (the episode's)
and creates the workspace at its first call. Errors are values, as for every tool: a non-zero exit
or a raised exception is ``tool_error``, a timeout ``tool_timeout``, a failure of the sandbox
``sandbox_error``.

- ``bash``: each call is a new bash process in the workspace; files persist and so does the working
  directory (a ``cd`` carries over to the next call); what a call leaves running ends with it.
- ``python``: cells in the workspace's kernel; variables persist; a cell has ``cell_timeout_s``; a
  kernel that dies (crash, memory cap, a cell that would not stop) is restarted and the result says
  so: every variable is gone.
- file tools: paths relative to ``/work`` (or absolute under it); neither ``..`` nor a symlink leads
  out (the kernel refuses it: ``openat2(RESOLVE_BENEATH)``, inside the sandbox). ``read_file`` shows
  a page (whole lines up to ``max_output_chars``) and says which lines it left out and where to read
  on; ``write_file`` and ``edit_file`` take content up to ``SandboxLimits.max_file_mb`` (more is a
  ``tool_error`` saying so); names that are not UTF-8 are listed with their odd bytes escaped
  (``caf\\xe9.txt``), and that spelling names the file.

Example::

    session = WorkspaceSession(WorkspaceSpec(base="repo/"))
    bash, python, *files = workspace_tools(session)
    await bash(command="ls")
"""

from __future__ import annotations

import copy
import shlex
from typing import Any, ClassVar

from agentrl.chat.types import FailureKind
from agentrl.tools.base import ToolResult, tool_schema, validate_call
from agentrl.tools.builtin import render_exec_result, truncate_middle
from agentrl.tools.sandbox.base import SandboxLimits
from agentrl.tools.workspace.base import ROOT, TOOL_NAMES, WorkspaceError
from agentrl.tools.workspace.session import WorkspaceSession

__all__ = ["BashTool", "EditFileTool", "KernelPythonTool", "ListDirTool", "ReadFileTool", "WorkspaceTool",
           "WriteFileTool", "workspace_tools"]

_STR = {"type": "string"}
_INT = {"type": "integer"}


class WorkspaceTool:
    """Shared parts of the workspace tools: schema validation, the session, output rendering."""

    name = ""
    description = ""
    PARAMETERS: ClassVar[dict[str, Any]] = {}

    def __init__(self, session: WorkspaceSession, *, max_output_chars: int = 4000) -> None:
        self.parameters: dict[str, Any] = copy.deepcopy(type(self).PARAMETERS)
        if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) or max_output_chars < 100:
            raise ValueError(f"{type(self).__name__}(max_output_chars=...): expected an int >= 100, "
                             f"got {max_output_chars!r}")
        self.session = session
        self.max_output_chars = max_output_chars

    def schema(self) -> dict[str, Any]:
        return tool_schema(self)

    async def __call__(self, **arguments: Any) -> ToolResult:
        failures = validate_call(self, arguments)
        if failures:
            return ToolResult.from_failures(failures)

        async def run() -> ToolResult:
            try:
                return await self.run(**arguments)
            except WorkspaceError as exc:
                return ToolResult.error(FailureKind.SANDBOX_ERROR, f"Error: the workspace is unavailable: {exc}")

        return await self.session.call(self.name, run)

    async def run(self, **arguments: Any) -> ToolResult:
        raise NotImplementedError

    async def file_op(self, op: str, **arguments: Any) -> dict[str, Any] | ToolResult:
        ws = await self.session.get()
        data = await ws.file_op(op, **arguments)
        if "error" in data:
            kind = FailureKind.SANDBOX_ERROR if data.get("sandbox_error") else FailureKind.TOOL_ERROR
            return ToolResult.error(kind, f"Error: {data['error']}")
        return data


class BashTool(WorkspaceTool):
    name = "bash"
    description = (f"Run a bash command in the workspace ({ROOT}). Files persist between calls and so does the "
                   "working directory (cd carries over); processes started in the background end with the call. "
                   "No network access.")
    PARAMETERS: ClassVar[dict[str, Any]] = {"type": "object", "properties": {"command": {**_STR, "description": "The bash command(s) to run."}},
                  "required": ["command"]}

    async def run(self, **arguments: Any) -> ToolResult:
        ws = await self.session.get()
        cwd = self.session.cwd
        # one line before the command (its own line numbers shift by one); fd 3 reports the directory at exit
        script = (f"cd -- {shlex.quote(cwd)} 2>/dev/null || {{ echo 'note: {cwd} no longer exists; running in "
                  f"{ROOT}' >&2; cd {ROOT}; }}; trap 'printf %s \"$PWD\" >&3' EXIT\n{arguments['command']}\n")
        result = await ws.run(script, timeout_s=self.session.spec.limits.timeout_s)
        new_cwd = str(result.metrics.get("channel") or "")
        if new_cwd.startswith("/") and "\n" not in new_cwd and len(new_cwd) < 1024:
            self.session.cwd = new_cwd
        return render_exec_result(result, self.max_output_chars, self.session.spec.limits.timeout_s)


class KernelPythonTool(WorkspaceTool):
    name = "python"
    description = (f"Run Python code in the workspace's kernel (working directory {ROOT}). Variables, functions and "
                   "imports persist between calls, as in a notebook; the value of the last expression is printed. "
                   "No network access.")
    PARAMETERS: ClassVar[dict[str, Any]] = {"type": "object", "properties": {"code": {**_STR, "description": "The Python code to run."}},
                  "required": ["code"]}

    async def run(self, **arguments: Any) -> ToolResult:
        ws = await self.session.get()
        cell = await ws.python(arguments["code"])
        parts = [cell.stdout] if cell.stdout else []
        if cell.stderr:
            parts.append(("" if not parts or parts[-1].endswith("\n") else "\n") + "[stderr]\n" + cell.stderr)
        body = "".join(parts)
        kind: FailureKind | None = None
        note = ""
        if cell.restarted:
            kind = FailureKind.TOOL_TIMEOUT if cell.timed_out else FailureKind.TOOL_ERROR
            note = f"Error: {cell.restarted}. The kernel was restarted: variables from earlier cells are gone."
        elif cell.timed_out:
            kind = FailureKind.TOOL_TIMEOUT
        elif cell.exception is not None:
            kind = FailureKind.TOOL_ERROR
        if note:
            body += ("" if not body or body.endswith("\n") else "\n") + note
        content = truncate_middle(body, self.max_output_chars)
        metrics = {"duration_s": cell.duration_s, "restarted": bool(cell.restarted), "truncated": cell.truncated}
        if kind is None:
            return ToolResult(content, metrics=metrics)
        return ToolResult(content, is_error=True, error_kind=kind, metrics=metrics)


class ReadFileTool(WorkspaceTool):
    name = "read_file"
    description = (f"Read a text file of the workspace (path relative to {ROOT}, or absolute under it). A long file "
                   "is shown a page at a time; the note at the end says how to read on.")
    PARAMETERS: ClassVar[dict[str, Any]] = {"type": "object", "properties": {
        "path": {**_STR, "description": "The file to read."},
        "start_line": {**_INT, "description": "First line to show (1-based; default 1)."},
        "max_lines": {**_INT, "description": "How many lines to show at most (default: as many as fit a page)."}},
        "required": ["path"]}

    async def run(self, **arguments: Any) -> ToolResult:
        # the page and its note fit max_output_chars; the program's answer fits the sandbox's output cap
        budget = max(50, min(self.max_output_chars - NOTE_CHARS, self.session.spec.limits.max_output_bytes // 8))
        data = await self.file_op("read", path=arguments["path"], start_line=arguments.get("start_line", 1),
                                  max_lines=arguments.get("max_lines", 0), max_chars=budget)
        if isinstance(data, ToolResult):
            return data
        return ToolResult(page_text(data, budget))


NOTE_CHARS = 160


def page_text(data: dict[str, Any], budget: int) -> str:
    """A ``read`` page of ``_fsops`` as the model sees it: the lines, then a note saying what was left
    out and how to read on."""
    content, first, last, total = str(data["content"]), int(data["first"]), int(data["last"]), data.get("lines")
    of = f"{total}" if isinstance(total, int) else "more than can be counted"
    if not content:
        if first > 1:
            return f"(start_line {first} is past the end: the file has {of} lines)"
        return "(empty file)"
    notes = []
    if data.get("cut_line"):
        notes.append(f"line {first} is longer than {budget} characters: only its start is shown")
    if not isinstance(total, int) or last < total:
        notes.append(f"lines {first}-{last} of {of} shown; read on with start_line={last + 1}")
    elif first > 1:
        notes.append(f"lines {first}-{last} of {total} shown")
    if not notes:
        return content
    return content + ("" if content.endswith("\n") else "\n") + f"[{'; '.join(notes)}]"


def _too_big(text: str, limits: SandboxLimits, what: str) -> ToolResult | None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size <= limits.max_file_mb << 20:
        return None
    return ToolResult.error(FailureKind.TOOL_ERROR, f"Error: {what} is {size} bytes; a file may hold at most "
                                                    f"{limits.max_file_mb} MiB here (max_file_mb)")


class WriteFileTool(WorkspaceTool):
    name = "write_file"
    description = f"Create or overwrite a file in the workspace ({ROOT}); missing folders are created."
    PARAMETERS: ClassVar[dict[str, Any]] = {"type": "object", "properties": {
        "path": {**_STR, "description": "The file to write."},
        "content": {**_STR, "description": "The whole new content of the file."}}, "required": ["path", "content"]}

    async def run(self, **arguments: Any) -> ToolResult:
        refused = _too_big(arguments["content"], self.session.spec.limits, "content")
        if refused is not None:
            return refused
        data = await self.file_op("write", path=arguments["path"], content=arguments["content"])
        if isinstance(data, ToolResult):
            return data
        return ToolResult(f"Wrote {data['bytes']} bytes to {arguments['path']}.")


class EditFileTool(WorkspaceTool):
    name = "edit_file"
    description = ("Replace text in a workspace file: old_text must occur exactly once (include enough context), "
                   "unless replace_all is true.")
    PARAMETERS: ClassVar[dict[str, Any]] = {"type": "object", "properties": {
        "path": {**_STR, "description": "The file to edit."},
        "old_text": {**_STR, "description": "The exact text to replace."},
        "new_text": {**_STR, "description": "The text to put in its place."},
        "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."}},
        "required": ["path", "old_text", "new_text"]}

    async def run(self, **arguments: Any) -> ToolResult:
        refused = _too_big(arguments["new_text"], self.session.spec.limits, "new_text")
        if refused is not None:
            return refused
        data = await self.file_op("edit", path=arguments["path"], old=arguments["old_text"], new=arguments["new_text"],
                                  replace_all=bool(arguments.get("replace_all", False)))
        if isinstance(data, ToolResult):
            return data
        n = data["replacements"]
        return ToolResult(f"Replaced {n} occurrence{'s' if n != 1 else ''} in {arguments['path']}.")


class ListDirTool(WorkspaceTool):
    name = "list_dir"
    description = f"List a folder of the workspace (default {ROOT}); folders end with '/'."
    PARAMETERS: ClassVar[dict[str, Any]] = {"type": "object", "properties": {
        "path": {**_STR, "description": "The folder (default: the workspace root)."},
        "depth": {**_INT, "description": "How many levels to show (1-4, default 1)."}}, "required": []}

    async def run(self, **arguments: Any) -> ToolResult:
        data = await self.file_op("list", path=arguments.get("path", "."), depth=arguments.get("depth", 1))
        if isinstance(data, ToolResult):
            return data
        lines = list(data["entries"]) + (["(more entries not shown)"] if data.get("cut") else [])
        return ToolResult(truncate_middle("\n".join(lines) or "(empty folder)", self.max_output_chars))


TOOLS: dict[str, type[WorkspaceTool]] = {"bash": BashTool, "python": KernelPythonTool, "read_file": ReadFileTool,
                                         "write_file": WriteFileTool, "edit_file": EditFileTool, "list_dir": ListDirTool}


def workspace_tools(session: WorkspaceSession, names: tuple[str, ...] = TOOL_NAMES, *,
                    max_output_chars: int = 4000) -> list[WorkspaceTool]:
    """The tools ``names`` (default: all six) on ``session``, in that order."""
    unknown = sorted(set(names) - set(TOOLS))
    if unknown:
        raise ValueError(f"workspace_tools: unknown tool name(s) {unknown}; expected names from {TOOL_NAMES}")
    return [TOOLS[name](session, max_output_chars=max_output_chars) for name in names]
