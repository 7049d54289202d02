"""Fixtures for the sandbox integration tests: a Docker daemon with the sandbox image, host canaries.

``docker_host`` uses a daemon that already answers (``DOCKER_HOST`` or the default socket); else it
starts a private ``dockerd`` (own data root, socket and pidfile; no iptables rules, no bridge),
builds the sandbox image offline if missing, and stops that daemon (by PID) at the end of the
session. When this machine cannot run dockerd or build the image, the Docker tests are skipped
with the precise reason.
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
from agentrl.tools.sandbox.dockerd import PrivateDockerDaemon, daemon_unavailable_reason, ensure_image, ping


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    for host in (os.environ.get("DOCKER_HOST"), "unix:///var/run/docker.sock"):
        if host and ping(host):
            ensure_or_skip(host)
            yield host
            return
    reason = daemon_unavailable_reason()
    if reason is not None:
        pytest.skip(f"Docker backend not testable here: {reason}")
    daemon = PrivateDockerDaemon()
    try:
        host = daemon.start()
    except RuntimeError as exc:
        daemon.stop()
        pytest.skip(f"Docker backend not testable here: dockerd failed to start: {exc}")
    try:
        ensure_or_skip(host)
        yield host
    finally:
        daemon.stop()
        assert daemon.proc is None
        assert not [n for n in daemon.new_links if n.startswith(("docker", "br-", "veth"))], daemon.new_links


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
