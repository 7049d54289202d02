"""Fixtures for the sandbox integration tests: a Docker daemon with the sandbox image, host canaries.

``docker_host`` is the session's Docker daemon (``docker_daemon`` in tests/integration/conftest.py)
with the sandbox image built offline if missing. When this machine cannot build the image, the
Docker tests are skipped with the precise reason.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Iterator

import pytest
from sandbox_canaries import CANARY_ENV, PROJECT, HostCanaries

from agentrl.tools.sandbox.docker import DEFAULT_IMAGE
from agentrl.tools.sandbox.dockerd import ensure_image


@pytest.fixture(scope="session")
def docker_host(docker_daemon: str) -> str:
    """The session's Docker daemon (tests/integration/conftest.py) with the sandbox image built."""
    ensure_or_skip(docker_daemon)
    return docker_daemon


def ensure_or_skip(host: str) -> None:
    try:
        ensure_image(host, DEFAULT_IMAGE)
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"Docker backend not testable here: the sandbox image could not be built offline: {exc}")


@pytest.fixture(scope="session")
def canaries() -> Iterator[HostCanaries]:
    token = "canary-" + secrets.token_hex(12)
    os.environ[CANARY_ENV] = token  # in the test process's environment: must never reach a sandbox
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.2)
    tcp.settimeout(0.2)
    c = HostCanaries(token, secrets.token_hex(6), PROJECT, os.getpid(), tcp.getsockname()[1], udp.getsockname()[1])
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            try:
                conn, _ = tcp.accept()
                c.tcp_hits.append(b"connection")
                conn.close()
            except OSError:
                pass
            try:
                c.udp_hits.append(udp.recv(1024))
            except OSError:
                pass

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    yield c
    stop.set()
    thread.join(2)
    tcp.close()
    udp.close()
    os.environ.pop(CANARY_ENV, None)
