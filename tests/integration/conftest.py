"""Fixtures shared by the integration tests: one Docker daemon and a pool of SGLang engines for the whole session.

``engine_pool`` boots one CPU engine per configuration on first use and keeps it for the session
(:class:`EnginePool`). ``shared_engine`` is the pool's engine serving the tiny Qwen3 in float32 (context 1024,
8,192 KV tokens, sampling seed 0, ``--sleep-on-idle``), pinned to its core like a run's own engine; whole training runs use it
through ``rollout.engines.urls``. Each such run loads its own weights into it before its first
rollout, so runs do not see each other's updates, and none stops it. Its OpenAI-compatible
``/v1`` chat endpoint renders the project's Qwen3 template and parses calls with SGLang's
``qwen25`` parser, for the tests that evaluate through ``--endpoint``.

``tiny_engine`` is that engine given back the tiny model's own weights (weight version ``"0"``), with
no request running on it: for the module that talks to a randomly initialised model directly (the
agent loop, the weight-sync tests, the eval endpoint) and would otherwise boot an engine of its own for it. Booting
one costs 40-90 s on two cores; reloading the weights costs well under a second.

``moe_engine`` is the pool's engine serving the tiny Qwen3-MoE (2 layers, 8 experts, top-2) in
float32 with ``--enable-return-routed-experts``, for the modules that need a mixture of experts
(engine vs trainer, routing, weight sync).

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


class EnginePool:
    """The session's CPU SGLang engines, one per distinct configuration (model folder, dtype, context,
    KV tokens, extra server arguments), booted on first use and stopped at the end of the session.

    A test that needs an engine asks ``engine_pool.url(model, ...)`` and gets the running one of that
    configuration, or one booted for it (40-90 s on two cores): tests of one configuration share it
    across modules. A pooled engine is shared: a test may load other weights into it (each run does),
    but must not stop, kill, restart or reconfigure it; such tests start an engine of their own.
    Under pytest-xdist each worker has its own pool; worker k's engines are pinned to core k (mod cores).
    """

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.engines: dict[tuple[object, ...], object] = {}
        self.worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
        self.workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)

    def url(self, model: str | Path, *, dtype: str = "float32", context_length: int = 1024,
            max_total_tokens: int = 8192, extra_args: tuple[str, ...] = ()) -> str:
        from agentrl.rollout import EngineConfig, SGLangEngine
        from agentrl.runner.cpu import plan_cpu

        key = (str(model), dtype, context_length, max_total_tokens, tuple(extra_args))
        if key not in self.engines:
            cpu = plan_cpu(engines=self.workers)
            core = self.worker % self.workers
            config = EngineConfig(model_path=str(model), device="cpu", dtype=dtype, context_length=context_length,
                                  max_total_tokens=max_total_tokens, random_seed=0, startup_timeout_s=600,
                                  env=cpu.engine_env(core), log_dir=self.logs,
                                  # it lives for the whole session: idle, SGLang's scheduler otherwise spins a core
                                  extra_args=("--sleep-on-idle", *extra_args))
            engine = asyncio.run(SGLangEngine.launch(config))
            self.engines[key] = engine
            if engine.process is not None:
                cpu.pin(core, engine.process.pid)
        return self.engines[key].url  # type: ignore[attr-defined, no-any-return]

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def engine_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnginePool]:
    pool = EnginePool(tmp_path_factory.mktemp("engine-pool"))
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="session")
def shared_engine(engine_pool: EnginePool) -> str:
    from agentrl.testing import build_tiny_model

    return engine_pool.url(build_tiny_model(), extra_args=("--chat-template", str(TEMPLATE),
                                                           "--tool-call-parser", "qwen25"))


@pytest.fixture(scope="session")
def moe_engine(engine_pool: EnginePool) -> str:
    from agentrl.testing import build_tiny_moe_model

    return engine_pool.url(build_tiny_moe_model(), extra_args=("--enable-return-routed-experts",))


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


from _ray_cluster import ray_two_hosts  # noqa: E402,F401  the session's Ray cluster (its module doc)
