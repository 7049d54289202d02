"""Built-in tools: ``python`` (a sandboxed code interpreter) and ``calculator`` (pure arithmetic).

:class:`PythonTool` runs the model's code in a :class:`~agentrl.tools.sandbox.Sandbox` (a default
bwrap sandbox when none is given, which the tool then owns and closes). The tool message holds
stdout, then stderr under a ``[stderr]`` header; the value of a final bare expression is printed,
as in a notebook. Output longer than ``max_output_chars`` keeps its head and tail around a visible
``[... N characters truncated ...]`` marker. Errors are values: a non-zero exit is ``tool_error``
(with the traceback), a timeout is ``tool_timeout``, a failure of the sandbox itself is
``sandbox_error``; partial output is kept in every case.

Example::

    async with PythonTool() as python:
        result = await python(code="import math\\nmath.factorial(5)")
        result.content   # "120\\n"
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from types import TracebackType
from typing import Any

from agentrl.chat.types import FailureKind
from agentrl.tools.base import ToolResult, tool, tool_schema, validate_call
from agentrl.tools.fleet.errors import ExecutorUnavailableError
from agentrl.tools.sandbox import ExecResult, Sandbox, create_sandbox

__all__ = ["PythonTool", "calculator", "render_exec_result", "truncate_middle"]


def truncate_middle(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and tail around a marker."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters truncated ...]\n"
    head = (limit * 2) // 3
    return text[:head] + marker + text[len(text) - (limit - head):]


def render_exec_result(result: ExecResult, limit: int, timeout_s: float) -> ToolResult:
    """The tool message for one execution (see the module doc for the format and error kinds)."""
    parts = [result.stdout] if result.stdout else []
    if result.stderr:
        parts.append(("" if not parts or parts[-1].endswith("\n") else "\n") + "[stderr]\n" + result.stderr)
    body = "".join(parts)
    metrics = {"duration_s": result.duration_s, "exit_code": result.exit_code, "timed_out": result.timed_out,
               "killed_reason": result.killed_reason, "truncated": result.truncated,
               "output_chars": len(body)}
    kind: FailureKind | None = None
    note = ""
    if result.killed_reason == "sandbox_error":
        kind, note = FailureKind.SANDBOX_ERROR, "Error: the sandbox failed; the code may not have run."
    elif result.timed_out:
        kind, note = FailureKind.TOOL_TIMEOUT, f"Error: execution timed out after {timeout_s:g} s."
    elif result.killed_reason == "memory":
        kind, note = FailureKind.TOOL_ERROR, "Error: killed: out of memory."
    elif result.killed_reason == "cpu_time":
        kind, note = FailureKind.TOOL_ERROR, "Error: killed: CPU time limit exceeded."
    elif result.killed_reason == "signal":
        kind, note = FailureKind.TOOL_ERROR, f"Error: killed by signal {result.signal}."
    elif result.exit_code != 0:
        kind = FailureKind.TOOL_ERROR
        if not result.stderr:
            note = f"Error: exit code {result.exit_code}."
    if note:
        body = body + ("" if not body or body.endswith("\n") else "\n") + note
    content = truncate_middle(body, limit)
    if kind is None:
        return ToolResult(content, metrics=metrics)
    return ToolResult(content, is_error=True, error_kind=kind, metrics=metrics)


class PythonTool:
    """The ``python`` tool. Pass a ``sandbox`` to share one pool between tools/episodes (the caller
    then closes it), or let the tool create and own a default one (``backend`` + ``sandbox_options``)."""

    name = "python"
    description = ("Execute Python code in a sandbox and return its output. Use print() to show results; "
                   "the value of the last expression is printed too. No network access; each call starts "
                   "from a fresh interpreter.")

    def __init__(self, sandbox: Sandbox | None = None, *, max_output_chars: int = 4000,
                 timeout_s: float | None = None, backend: str = "bwrap", **sandbox_options: Any) -> None:
        if isinstance(max_output_chars, bool) or not isinstance(max_output_chars, int) or max_output_chars < 100:
            raise ValueError(f"PythonTool(max_output_chars=...): expected an int >= 100, got {max_output_chars!r}")
        if sandbox is not None and sandbox_options:
            raise TypeError(f"PythonTool: sandbox options {sorted(sandbox_options)} given with an existing sandbox")
        self.parameters: dict[str, Any] = {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python program to run."}},
            "required": ["code"],
        }
        self._owns = sandbox is None
        self.sandbox = sandbox if sandbox is not None else create_sandbox(backend, **sandbox_options)
        self.max_output_chars = max_output_chars
        self.timeout_s = timeout_s

    def schema(self) -> dict[str, Any]:
        return tool_schema(self)

    async def __call__(self, **arguments: Any) -> ToolResult:
        failures = validate_call(self, arguments)
        if failures:
            return ToolResult.from_failures(failures)
        timeout = self.timeout_s if self.timeout_s is not None else self.sandbox.limits.timeout_s
        try:
            result = await self.sandbox.run(arguments["code"], timeout_s=timeout)
        except ValueError as exc:  # e.g. more code than the sandbox accepts
            return ToolResult.error(FailureKind.TOOL_ERROR, f"Error: {exc}")
        except ExecutorUnavailableError:  # a sandbox fleet without room or with a lost executor: the episode's
            raise  # failure, not the model's (the agent loop records it; the scheduler regenerates the episode)
        except Exception as exc:  # the sandbox is unusable (closed, unavailable): an error value, not a crash
            return ToolResult.error(FailureKind.SANDBOX_ERROR, f"Error: sandbox unavailable: {exc}")
        return render_exec_result(result, self.max_output_chars, timeout)

    async def close(self) -> None:
        """Closes the sandbox if this tool created it."""
        if self._owns:
            await self.sandbox.close()

    async def __aenter__(self) -> PythonTool:
        await self.sandbox.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()


# --------------------------------------------------------------------------- calculator

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS: dict[str, Callable[..., Any]] = {"sqrt": math.sqrt, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil,
          "log": math.log, "exp": math.exp}
_CONSTS = {"pi": math.pi, "e": math.e}
MAX_EXPONENT = 1000
MAX_EXPRESSION = 500
MAX_BITS = 100_000


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or
                                             (abs(left) > 1 and abs(right) * math.log2(abs(left)) > MAX_BITS)):
            raise ValueError(f"power {left!r:.20} ** {right!r:.20} too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and not node.keywords and len(node.args) in (1, 2)):
        return _FUNCS[node.func.id](*(_eval(a) for a in node.args))
    raise ValueError(f"unsupported expression element {ast.dump(node)[:80]!r}; allowed: numbers, + - * / // % **, "
                     f"parentheses, {sorted(_FUNCS)} and {sorted(_CONSTS)}")


@tool(timeout_s=5)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: e.g. "(3 + 4) * 12 / 7" or "sqrt(2) ** 2".
    """
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    value = _eval(tree)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)

