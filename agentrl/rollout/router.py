"""sglang-router launcher: one router subprocess on loopback, workers added and removed over HTTP.

The router is the single data-path entry to an engine group (one code path on a laptop and on a
cluster). :meth:`Router.launch` starts ``sglang-router`` 0.3.2 with the chosen policy, its own
Prometheus port and the health-check settings of :class:`RouterConfig`, and waits until it answers.
Workers are registered with ``POST /workers`` (asynchronous on the router's side, so
:meth:`Router.add_worker` waits until the worker is listed) and removed by id, looked up by URL.
:meth:`Router.stop` stops exactly the process tree it started.

Router-side retries are off by default: the :class:`~agentrl.rollout.client.InferenceClient` owns
retries, and two retrying layers compound.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from annotated_types import Ge, Gt

from agentrl._enum import NamedEnum
from agentrl._limits import check_limits
from agentrl.rollout.process import (
    PORT_DRAWS,
    ManagedProcess,
    default_log_dir,
    free_port,
    request_json,
    wait_ready,
)

__all__ = ["Router", "RouterConfig", "RouterError", "RouterPolicy", "RouterPortTaken"]

log = logging.getLogger(__name__)


class RouterError(RuntimeError):
    """The router did not start, refused a worker operation, or could not be reached."""


class RouterPortTaken(RouterError):
    """The router could not bind one of its ports: another process had taken it."""


class RouterPolicy(NamedEnum):
    """Routing policies of sglang-router 0.3.2's core. ``_router_entry`` sets each through the router's
    Python API, since ``consistent_hashing`` and ``prefix_hash`` are not choices of its command line."""

    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    CACHE_AWARE = "cache_aware"
    POWER_OF_TWO = "power_of_two"
    MANUAL = "manual"
    CONSISTENT_HASHING = "consistent_hashing"
    PREFIX_HASH = "prefix_hash"


@dataclass(frozen=True)
class RouterConfig:
    """How to start the router. ``port``/``prometheus_port`` ``None``: pick free ports.

    Health checks default to the router's own (60 s interval); tests use 1 s and threshold 1. The
    agentrl health monitor does not rely on them (it deregisters engines it finds dead itself).
    """

    policy: RouterPolicy = RouterPolicy.CONSISTENT_HASHING
    host: str = "127.0.0.1"
    port: int | None = None
    prometheus_port: int | None = None
    health_check_interval_s: Annotated[int, Ge(1)] = 60
    health_failure_threshold: Annotated[int, Ge(1)] = 3
    health_success_threshold: Annotated[int, Ge(1)] = 2
    health_check_timeout_s: Annotated[int, Ge(1)] = 5
    health_check_endpoint: str = "/health"
    disable_health_check: bool = False
    disable_retries: bool = True
    disable_circuit_breaker: bool = True
    request_timeout_s: Annotated[int, Ge(1)] = 3600
    log_level: str = "warn"
    startup_timeout_s: Annotated[float, Gt(0.0)] = 60.0
    log_dir: str | os.PathLike[str] | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    allow_public_host: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", RouterPolicy(self.policy))
        check_limits(self)
        for name in ("port", "prometheus_port"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535):
                raise ValueError(f"RouterConfig.{name}={value!r}: expected None (a free port) or an int in [1, 65535]")
        if self.log_dir is not None:
            if not isinstance(self.log_dir, (str, os.PathLike)):
                raise ValueError(f"RouterConfig.log_dir={self.log_dir!r}: expected a folder (str or Path) or None")
            object.__setattr__(self, "log_dir", Path(self.log_dir))
        if self.host not in ("127.0.0.1", "localhost", "::1") and not self.allow_public_host:
            raise ValueError(f"RouterConfig.host={self.host!r}: expected a loopback address "
                             "(set allow_public_host=True to serve other machines)")


def _router_args(config: RouterConfig, port: int, prom_port: int) -> list[str]:
    args = [
        "--host", config.host, "--port", str(port),
        "--prometheus-host", config.host, "--prometheus-port", str(prom_port),
        "--health-check-interval-secs", str(config.health_check_interval_s),
        "--health-failure-threshold", str(config.health_failure_threshold),
        "--health-success-threshold", str(config.health_success_threshold),
        "--health-check-timeout-secs", str(config.health_check_timeout_s),
        "--health-check-endpoint", config.health_check_endpoint,
        "--request-timeout-secs", str(config.request_timeout_s),
        "--log-level", config.log_level,
    ]
    if config.disable_health_check:
        args.append("--disable-health-check")
    if config.disable_retries:
        args.append("--disable-retries")
    if config.disable_circuit_breaker:
        args.append("--disable-circuit-breaker")
    args += ["--policy-override", config.policy.value]  # _router_entry sets every policy the same way
    return [*args, *config.extra_args]


class Router:
    """A running sglang-router subprocess. Create with :meth:`launch`; stop with :meth:`stop`."""

    def __init__(self, config: RouterConfig, process: ManagedProcess, port: int, prometheus_port: int) -> None:
        self.config = config
        self.process = process
        self.port = port
        self.prometheus_port = prometheus_port
        self.url = f"http://{config.host}:{port}"

    @classmethod
    async def launch(cls, config: RouterConfig | None = None) -> Router:
        """Starts the router and waits until ``GET /workers`` answers (or raises :class:`RouterError`)."""
        config = config or RouterConfig()
        # ports drawn here can still be taken before the router binds them: draw again, a few times
        tries = 1 if config.port and config.prometheus_port else PORT_DRAWS
        for attempt in range(1, tries + 1):
            port = config.port or free_port(config.host)
            prom_port = config.prometheus_port or free_port(config.host)
            try:
                return cls(config, await cls._start(config, port, prom_port), port, prom_port)
            except RouterPortTaken:
                if attempt == tries:
                    raise
                log.warning("router: port %d or %d was taken before it bound it; starting on others", port, prom_port)
        raise AssertionError("unreachable")

    @staticmethod
    async def _start(config: RouterConfig, port: int, prom_port: int) -> ManagedProcess:
        log_path = (Path(config.log_dir) if config.log_dir is not None else default_log_dir()) / f"router-{port}.log"
        cmd = [sys.executable, "-m", "agentrl.rollout._router_entry", *_router_args(config, port, prom_port)]
        url = f"http://{config.host}:{port}"

        async def answers() -> bool:
            try:
                await request_json("GET", url + "/workers", timeout_s=2.0, error_cls=RouterError)
                return True
            except RouterError:
                return False

        return await ManagedProcess.start(
            cmd, env=os.environ, log_path=log_path, name=f"router:{port}",
            ready=lambda process: wait_ready(answers, what=f"router {url}", timeout_s=config.startup_timeout_s,
                                             poll_s=0.2, error_cls=RouterError, process=process, port=port,
                                             port_taken_cls=RouterPortTaken))

    async def _request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """One JSON request to the router. Every failure (HTTP error status, lost connection, timeout,
        a body that is not JSON) is a :class:`RouterError`, so callers catch that alone."""
        return await request_json(method, self.url + path, body, timeout_s=timeout, error_cls=RouterError)

    async def workers(self) -> list[dict[str, Any]]:
        """The router's worker list (``GET /workers``)."""
        body = await self._request("GET", "/workers")
        return list(body.get("workers", [])) if isinstance(body, dict) else []

    async def worker_id(self, url: str) -> str | None:
        url = url.rstrip("/")
        for worker in await self.workers():
            if str(worker.get("url", "")).rstrip("/") == url:
                return str(worker["id"])
        return None

    async def add_worker(self, url: str, *, timeout_s: float = 60.0) -> str:
        """Registers ``url`` and waits until the router lists it; returns its worker id."""
        await self._request("POST", "/workers", {"url": url.rstrip("/")})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            worker_id = await self.worker_id(url)
            if worker_id is not None:
                return worker_id
            await asyncio.sleep(0.1)
        raise RouterError(f"worker {url} not listed by the router {self.url} within {timeout_s} s; "
                          f"router log:\n{self.process.log_tail()}")

    async def remove_worker(self, url: str, *, timeout_s: float = 30.0) -> bool:
        """Deregisters ``url`` (by its id) and waits until it is gone; False if it was not registered."""
        worker_id = await self.worker_id(url)
        if worker_id is None:
            return False
        await self._request("DELETE", f"/workers/{worker_id}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await self.worker_id(url) is None:
                return True
            await asyncio.sleep(0.1)
        raise RouterError(f"worker {url} still listed by the router {self.url} {timeout_s} s after DELETE")

    def stop(self) -> None:
        """Stops the router's process tree (idempotent). Blocks up to about 15 s: in async code run it
        with ``await asyncio.to_thread(router.stop)``."""
        self.process.stop(grace_s=5.0)
