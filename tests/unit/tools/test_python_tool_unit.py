"""The python tool's rendering and error mapping, and the sandbox API's argument checks (no processes).

A recording fake sandbox stands in for the real one here; the same tool runs against the real
bubblewrap pool in tests/integration/sandbox/test_python_tool.py.
"""

from __future__ import annotations

import pytest

import agentrl.tools.sandbox as sandbox_pkg
from agentrl.chat.types import FailureKind
from agentrl.tools import PythonTool, render_exec_result, truncate_middle
from agentrl.tools.sandbox import Capabilities, ExecResult, Sandbox, SandboxLimits, create_sandbox


class RecordingSandbox(Sandbox):
    backend = "fake"

    def __init__(self, result: ExecResult) -> None:
        super().__init__(SandboxLimits(timeout_s=7))
        self.result = result
        self.calls: list[tuple[str, float | None]] = []

    async def run(self, code: str, *, language: str = "python", timeout_s: float | None = None) -> ExecResult:
        self.calls.append((code, self._check_request(code, language, timeout_s)))
        return self.result

    async def close(self) -> None:
        self._closed = True

    def capabilities(self) -> Capabilities:
        return Capabilities("fake", {})


def result(**kw: object) -> ExecResult:
    base: dict[str, object] = {"stdout": "", "stderr": "", "exit_code": 0}
    base.update(kw)
    return ExecResult(**base)  # type: ignore[arg-type]


def test_truncate_middle_keeps_head_and_tail() -> None:
    assert truncate_middle("abc", 10) == "abc"
    text = "H" * 100 + "T" * 100
    out = truncate_middle(text, 60)
    assert out.startswith("H" * 40) and out.endswith("T" * 20) and "[... 140 characters truncated ...]" in out


@pytest.mark.parametrize(("res", "kind", "needle"), [
    (result(stdout="4\n"), None, "4\n"),
    (result(stdout="a\n", stderr="Traceback...\nZeroDivisionError", exit_code=1, claimed_exception="ZeroDivisionError"),
     FailureKind.TOOL_ERROR, "a\n[stderr]\nTraceback"),
    (result(stdout="partial", exit_code=None, timed_out=True, killed_reason="timeout", signal=9),
     FailureKind.TOOL_TIMEOUT, "partial\nError: execution timed out after 7 s."),
    (result(exit_code=None, killed_reason="memory", signal=9), FailureKind.TOOL_ERROR, "out of memory"),
    (result(exit_code=None, killed_reason="cpu_time", signal=9), FailureKind.TOOL_ERROR, "CPU time"),
    (result(exit_code=None, killed_reason="signal", signal=11), FailureKind.TOOL_ERROR, "signal 11"),
    (ExecResult.sandbox_error("worker died"), FailureKind.SANDBOX_ERROR, "the sandbox failed"),
    (result(exit_code=3), FailureKind.TOOL_ERROR, "exit code 3"),
])
def test_render_exec_result(res: ExecResult, kind: FailureKind | None, needle: str) -> None:
    out = render_exec_result(res, 4000, 7)
    assert out.error_kind is kind and out.is_error == (kind is not None)
    assert needle in out.content
    assert out.metrics["exit_code"] == res.exit_code


async def test_python_tool_validates_and_uses_the_sandbox_timeout() -> None:
    fake = RecordingSandbox(result(stdout="x" * 10_000))
    tool = PythonTool(fake, max_output_chars=500)
    assert tool.schema()["function"]["parameters"]["required"] == ["code"]
    r = await tool(code="print('x' * 10000)")
    assert fake.calls == [("print('x' * 10000)", 7.0)]
    assert len(r.content) < 600 and "characters truncated" in r.content
    bad = await tool(cmd="1")
    assert bad.error_kind is FailureKind.MISSING_REQUIRED_ARGUMENT and len(fake.calls) == 1
    await tool.close()
    assert not fake.closed  # a shared sandbox belongs to the caller
    huge = await PythonTool(fake)(code="x" * (SandboxLimits().max_code_bytes + 1))
    assert huge.error_kind is FailureKind.TOOL_ERROR and "max_code_bytes" in huge.content
    await fake.close()
    closed = await PythonTool(fake)(code="1")
    assert closed.error_kind is FailureKind.SANDBOX_ERROR


def test_python_tool_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="max_output_chars"):
        PythonTool(RecordingSandbox(result()), max_output_chars=5)
    with pytest.raises(TypeError, match="sandbox options"):
        PythonTool(RecordingSandbox(result()), pool_size=3)


def test_limits_and_factory_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"SandboxLimits.memory_mb: expected a positive number, got -1"):
        SandboxLimits(memory_mb=-1)
    with pytest.raises(ValueError, match=r"SandboxLimits.cpu_s: expected an integer, got 1.5"):
        SandboxLimits(cpu_s=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"backend=...\): expected one of \('bwrap', 'docker', 'local'\), got 'vm'"):
        create_sandbox("vm")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['poolsize'\]"):
        create_sandbox("bwrap", poolsize=2)
    with pytest.raises(TypeError, match="either limits= or"):
        create_sandbox("bwrap", limits=SandboxLimits(), timeout_s=3)


async def test_run_arguments_are_checked() -> None:
    fake = RecordingSandbox(result())
    with pytest.raises(ValueError, match=r"language=...\): expected one of \('python', 'bash'\), got 'ruby'"):
        await fake.run("1", language="ruby")
    with pytest.raises(ValueError, match=r"timeout_s=...\): expected a positive number of seconds, got 0"):
        await fake.run("1", timeout_s=0)
    with pytest.raises(TypeError, match="expected a str"):
        await fake.run(b"1")  # type: ignore[arg-type]


def test_sandbox_public_surface() -> None:
    assert sorted(sandbox_pkg.__all__) == sorted([
        "BACKENDS", "Capabilities", "ExecResult", "KilledReason", "Sandbox", "SandboxClosedError", "SandboxLimits",
        "SandboxUnavailableError", "create_sandbox"])
