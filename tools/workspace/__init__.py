"""Workspaces: one episode's stateful sandbox (installed as ``agentrl.tools.workspace``).

A workspace is a folder ``/work`` that keeps its files across an episode's tool calls, a shell and a
Python kernel on it, forked copy-on-write from a prepared state that a GRPO group's members share,
and removed when the episode's reward has run. See ``docs/sandbox.md`` ("Workspaces").

- :class:`WorkspaceSpec`: what a workspace starts from (base folder or image, setup commands) and
  its limits; an environment declares one (``Environment.workspace``);
- :class:`WorkspaceSession`: an episode's handle (created at the first tool call);
  :func:`workspace_tools`: ``bash``, ``python`` (kernel), ``read_file``, ``write_file``,
  ``edit_file``, ``list_dir`` on it;
- :class:`Workspaces`: prepares once, forks per episode (:func:`default_workspaces`: the process's);
- backends: ``bwrap`` (overlay layers in a user namespace, bound into bubblewrap) and ``docker``
  (one container per episode with a size-capped tmpfs ``/work``).

Example::

    spec = WorkspaceSpec(base="my_repo/", setup=("git init -q",), size_mb=128)
    async with Workspaces() as workspaces:
        ws = await workspaces.create(spec, {"task.md": "fix the bug"})
        print((await ws.run("ls")).stdout)
        print((await ws.python("x = 41\\nx + 1")).stdout)     # 42
        await workspaces.remove(ws)
"""

from agentrl.tools.workspace.base import (
    BACKENDS,
    TOOL_NAMES,
    CellResult,
    Prepared,
    Workspace,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceRemovedError,
    WorkspaceSpec,
)
from agentrl.tools.workspace.manager import Workspaces, default_workspaces
from agentrl.tools.workspace.session import (
    Answer,
    WorkspaceReplayError,
    WorkspaceSession,
    answers_from_record,
)
from agentrl.tools.workspace.tools import (
    BashTool,
    EditFileTool,
    KernelPythonTool,
    ListDirTool,
    ReadFileTool,
    WorkspaceTool,
    WriteFileTool,
    workspace_tools,
)

__all__ = [
    "BACKENDS",
    "TOOL_NAMES",
    "Answer",
    "BashTool",
    "CellResult",
    "EditFileTool",
    "KernelPythonTool",
    "ListDirTool",
    "Prepared",
    "ReadFileTool",
    "Workspace",
    "WorkspaceBackend",
    "WorkspaceError",
    "WorkspaceRemovedError",
    "WorkspaceReplayError",
    "WorkspaceSession",
    "WorkspaceSpec",
    "WorkspaceTool",
    "Workspaces",
    "WriteFileTool",
    "answers_from_record",
    "default_workspaces",
    "workspace_tools",
]
