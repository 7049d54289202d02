"""Fixtures shared by the integration tests: one Docker daemon for the whole session.

``docker_daemon`` uses a daemon that already answers (``DOCKER_HOST`` or the default socket); else
it starts a private ``dockerd`` (own data root, socket and pidfile; no iptables rules, no bridge)
and stops it (by PID) at the end of the session, checking that it left no network link behind.
Where this machine cannot run dockerd, the tests that need it are skipped with the precise reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agentrl.tools.sandbox.dockerd import PrivateDockerDaemon, daemon_unavailable_reason, ping


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[str]:
    for host in (os.environ.get("DOCKER_HOST"), "unix:///var/run/docker.sock"):
        if host and ping(host):
            yield host
            return
    reason = daemon_unavailable_reason()
    if reason is not None:
        pytest.skip(f"Docker not testable here: {reason}")
    daemon = PrivateDockerDaemon()
    try:
        host = daemon.start()
    except RuntimeError as exc:
        daemon.stop()
        pytest.skip(f"Docker not testable here: dockerd failed to start: {exc}")
    try:
        yield host
    finally:
        daemon.stop()
        assert daemon.proc is None
        assert not [n for n in daemon.new_links if n.startswith(("docker", "br-", "veth"))], daemon.new_links
