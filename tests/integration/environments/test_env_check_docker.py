"""The conformance checker's container-leak check against a real (private) Docker daemon."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from agentrl.chat import Message
from agentrl.environments import Environment, check_environment
from agentrl.trajectory import Trajectory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

IMAGE = "agentrl-empty-check:test"  # an image with no files: containers can be created, never started


@pytest.fixture(scope="module")
def docker_host(docker_daemon: str) -> str:
    """The session's Docker daemon (tests/integration/conftest.py) with an empty image imported."""
    empty = subprocess.run(["tar", "cf", "-", "--files-from", "/dev/null"], capture_output=True, check=True).stdout
    subprocess.run(["docker", "-H", docker_daemon, "import", "-", IMAGE], input=empty, capture_output=True,
                   check=True, timeout=60)
    return docker_daemon


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=60).stdout.strip()


class ContainerEnv(Environment):
    """Creates a container per episode and removes it in close()."""

    async def reset(self) -> list[Message]:
        self.container = docker("create", IMAGE, "/none")
        return [Message(role="user", content="hi")]

    def reward(self, trajectory: Trajectory) -> float:
        return 0.0

    async def close(self) -> None:
        if getattr(self, "container", None):
            docker("rm", "-f", self.container)


class LeakyContainerEnv(ContainerEnv):
    async def close(self) -> None:
        pass  # forgets the container


async def test_leaked_containers_are_reported(docker_host: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("DOCKER_HOST", docker_host)  # the checker's `docker ps` asks the private daemon
    clean = await check_environment(ContainerEnv, [{}], max_rows=1)
    assert clean.ok, clean.format()
    leaky = await check_environment(LeakyContainerEnv, [{}], max_rows=1)
    leaks = [v for v in leaky.violations if v.check == "leak"]
    # one violation per row, naming every scripted episode (four of them, two "tools") that leaked
    assert len(leaks) == 1, leaky.format()
    assert "1 Docker container(s) created during the episode" in str(leaks[0])
    assert "(in the tools, failures, answer episodes)" in str(leaks[0])
    assert leaky.checks_failed == {"leak"}, leaky.format()
    assert len(docker("ps", "-a", "-q").split()) == 4
