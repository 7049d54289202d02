"""Fixtures shared by the integration tests: one Docker daemon and one SGLang engine for the whole session.

``shared_engine`` is a CPU SGLang engine serving the tiny Qwen3 in float32 (context 1024, 8,192
KV tokens, sampling seed 0, `--sleep-on-idle`), pinned to its core like a run's own engine; whole training runs use it
through ``rollout.engines.urls``. Each such run loads its own weights into it before its first
rollout, so runs do not see each other's updates, and none stops it. Its OpenAI-compatible
``/v1`` chat endpoint renders the project's Qwen3 template and parses calls with SGLang's
``qwen25`` parser, for the tests that evaluate through ``--endpoint``.

``tiny_engine`` is that engine given back the tiny model's own weights (weight version ``"0"``), with
no request running on it: for the module that talks to a randomly initialised model directly (the
agent loop, the weight-sync tests, the eval endpoint) and would otherwise boot an engine of its own for it. Booting
one costs 40-90 s on two cores; reloading the weights costs well under a second.

``docker_daemon`` uses a daemon that already answers (``DOCKER_HOST`` or the default socket); else
it starts a private ``dockerd`` (own data root, socket and pidfile; no iptables rules, no bridge)
and stops it (by PID) at the end of the session, checking that it left no network link behind.
Where this machine cannot run dockerd, the tests that need it are skipped with the precise reason.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.tools.sandbox.dockerd import PrivateDockerDaemon, daemon_unavailable_reason, ping

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "qwen3.jinja"


@pytest.fixture(scope="session")
def shared_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from agentrl.rollout import EngineConfig, SGLangEngine
    from agentrl.runner.cpu import plan_cpu
    from agentrl.testing import build_tiny_model

    cpu = plan_cpu(engines=1)
    config = EngineConfig(model_path=str(build_tiny_model()), device="cpu", dtype="float32", context_length=1024,
                          max_total_tokens=8192, random_seed=0, startup_timeout_s=600, env=cpu.engine_env(0),
                          log_dir=tmp_path_factory.mktemp("shared-engine"),
                          # it lives for the whole session: idle, SGLang's scheduler otherwise spins a core
                          extra_args=("--sleep-on-idle", "--chat-template", str(TEMPLATE),
                                      "--tool-call-parser", "qwen25"))
    engine = asyncio.run(SGLangEngine.launch(config))
    try:
        if engine.process is not None:
            cpu.pin(0, engine.process.pid)
        yield engine.url
    finally:
        engine.stop()


async def _reset_to_tiny_model(url: str) -> None:
    from agentrl.rollout import SGLangEngine
    from agentrl.testing import build_tiny_model

    engine = await SGLangEngine.attach(url)
    for _ in range(600):  # a run that just ended may still be finishing its last aborts
        if await engine.active_requests() == 0:
            break
        await asyncio.sleep(0.05)
    assert await engine.active_requests() == 0, f"the shared engine at {url} is still serving requests"
    await engine.update_weights_from_disk(build_tiny_model(), "0")
    assert await engine.weight_version() == "0"


@pytest.fixture(scope="module")
def tiny_engine(shared_engine: str) -> str:
    asyncio.run(_reset_to_tiny_model(shared_engine))
    return shared_engine


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
