"""The python tool and the Docker backend against the real sandboxes."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.chat.types import FailureKind
from agentrl.tools import PythonTool
from agentrl.tools.sandbox import create_sandbox
from agentrl.tools.sandbox.docker import DockerSandbox

pytestmark = pytest.mark.integration


async def test_python_tool_on_bwrap() -> None:
    async with PythonTool(pool_size=2, timeout_s=2, max_output_chars=300) as python:
        r = await python(code="import math\nmath.factorial(5)")
        assert (r.content, r.is_error) == ("120\n", False)
        r = await python(code="print('partial')\n1/0")
        assert r.error_kind is FailureKind.TOOL_ERROR
        assert r.content.startswith("partial\n[stderr]\nTraceback") and "ZeroDivisionError" in r.content
        r = await python(code="print('x' * 5000)")
        assert not r.is_error and "characters truncated" in r.content and len(r.content) < 400
        r = await python(code="import time\nprint('a', flush=True)\ntime.sleep(10)")
        assert r.error_kind is FailureKind.TOOL_TIMEOUT and r.content == "a\nError: execution timed out after 2 s."
        r = await python(source="1")
        assert r.error_kind is FailureKind.MISSING_REQUIRED_ARGUMENT
        sandbox = python.sandbox
    assert sandbox.closed  # the tool owned its default sandbox


@pytest.mark.slow
async def test_docker_backend_contract(docker_host: str) -> None:
    async with create_sandbox("docker", docker_host=docker_host, pool_size=3, timeout_s=3) as sb:
        assert isinstance(sb, DockerSandbox)
        caps = sb.capabilities()
        assert caps.enforced["network"].startswith("--network none") and "memory" in caps.enforced
        r = await sb.run("import os\nprint(os.getuid(), sorted(os.environ))\nx = 6 * 7\nx")
        assert r.stdout.splitlines() == ["65534 ['HOME', 'HOSTNAME', 'LANG', 'PATH']", "42"], r
        r = await sb.run("echo hi; echo err >&2; exit 3", language="bash")
        assert (r.stdout, r.stderr, r.exit_code) == ("hi\n", "err\n", 3)
        t = time.perf_counter()
        results = await asyncio.gather(*(sb.run("import time\ntime.sleep(1.0)\nprint('ok')") for _ in range(3)))
        assert all(x.stdout == "ok\n" for x in results)
        assert time.perf_counter() - t < 2.6  # run one after the other they would take more than 3 s
        python = PythonTool(sb, max_output_chars=200)
        r = await python(code="print('y' * 1000)")
        assert "characters truncated" in r.content
        ids = sb.container_ids()
    assert sb.container_ids() == [] and len(ids) == 3


async def test_docker_unavailable_names_the_fix() -> None:
    from agentrl.tools.sandbox import SandboxUnavailableError

    sb = create_sandbox("docker", docker_host="unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxUnavailableError, match="no Docker daemon reachable at unix:///nonexistent"):
        await sb.start()
    await sb.close()
