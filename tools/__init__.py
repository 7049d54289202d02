"""Tools the model can call, and the sandboxes that run code tools (installed as ``agentrl.tools``).

- :class:`Tool` protocol, :class:`ToolResult`, the :func:`tool` decorator (schema from type hints
  and the docstring), :func:`tool_schema` (the OpenAI function dict the chat templates render);
- built-in tools: :class:`PythonTool` (sandboxed interpreter) and :data:`calculator`;
- :mod:`agentrl.tools.sandbox`: ``create_sandbox(backend="bwrap" | "docker" | "local")``;
- :mod:`agentrl.tools.workspace`: an episode's stateful workspace (files, shell, Python kernel),
  forked for a group, removed with the episode.
"""

from agentrl.tools.base import (
    FunctionTool,
    Tool,
    ToolResult,
    function_parameters,
    tool,
    tool_schema,
    validate_call,
)
from agentrl.tools.builtin import PythonTool, calculator, render_exec_result, truncate_middle

__all__ = [
    "FunctionTool",
    "PythonTool",
    "Tool",
    "ToolResult",
    "calculator",
    "function_parameters",
    "render_exec_result",
    "tool",
    "tool_schema",
    "truncate_middle",
    "validate_call",
]
