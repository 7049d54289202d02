"""A server's port taken between the moment it was drawn and the moment the server binds it.

``free_port`` draws below the kernel's ephemeral range (where outgoing connections cannot take it);
a launch whose drawn port is taken all the same sees "address already in use" in the server's log,
stops that server at once (SGLang's logs it and hangs) and draws again; a port the config names is
not redrawn, and the error says which port and why. The engine's side runs here on a stand-in server
that binds its port as SGLang does; ``tests/integration/rollout/test_sglang_engines.py`` proves the
detection on the real SGLang server, and the router's tests below run the real router.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.rollout import process as process_mod
from agentrl.rollout.engine import EngineConfig, EnginePortTaken, SGLangEngine
from agentrl.rollout.process import ManagedProcess, free_port, wait_ready
from agentrl.rollout.router import Router, RouterConfig, RouterPortTaken
from agentrl.testing import build_tiny_model

# Binds --port like SGLang's HTTP server: on a taken port it logs uvicorn's error and hangs (as SGLang's
# launcher does, its scheduler still alive); otherwise it answers every GET with 200.
STAND_IN = """
import http.server, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
try:
    server = http.server.HTTPServer(("127.0.0.1", port), Ok)
except OSError as err:
    print(f"ERROR:    [Errno {err.errno}] error while attempting to bind on address ('127.0.0.1', {port}): "
          "address already in use", flush=True)
    time.sleep(600)
server.serve_forever()
"""


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another socket of this machine has bound (not listening: a readiness probe sent to it is
    refused at once instead of waiting out its timeout in the backlog)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def _stand_in_command(self: EngineConfig, port: int, device: str) -> list[str]:
    return [sys.executable, "-c", STAND_IN, "--port", str(port)]


def test_free_port_draws_below_the_ephemeral_range_and_binds() -> None:
    low, _ = process_mod._ephemeral_ports()
    ports = {free_port() for _ in range(20)}
    if low - 20000 >= 1000:
        assert all(20000 <= p < low for p in ports), ports
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_the_log_of_an_earlier_server_on_the_same_file_is_not_read_as_this_ones(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("ERROR: [Errno 98] error while attempting to bind: address already in use\n")
    proc = ManagedProcess([sys.executable, "-c", "print('serving', flush=True); import time; time.sleep(30)"],
                          env={"PATH": "/usr/bin:/bin"}, log_path=log, name="later")
    try:
        for _ in range(200):
            if "serving" in proc.log_tail():
                break
            time.sleep(0.05)
        assert proc.log_since_start().strip() == "serving"
        assert not process_mod.port_taken(proc)
    finally:
        proc.stop(grace_s=1.0)


async def test_wait_ready_stops_waiting_for_a_server_that_logs_its_port_taken(tmp_path: Path, taken: int) -> None:
    class Taken(RuntimeError):
        pass

    proc = ManagedProcess([sys.executable, "-c", STAND_IN, "--port", str(taken)], env={"PATH": "/usr/bin:/bin"},
                          log_path=tmp_path / "s.log", name="stand-in")
    try:
        async def never() -> bool:
            return False

        with pytest.raises(Taken, match="could not bind its port"):
            await wait_ready(never, what="stand-in", timeout_s=120, poll_s=0.05, error_cls=RuntimeError,
                             process=proc, port_taken_cls=Taken)
        assert proc.alive()  # it hangs, as SGLang does: the error came from its log, not from its exit
    finally:
        proc.stop(grace_s=1.0)


async def test_an_engine_whose_drawn_port_was_taken_starts_on_another(
        tmp_path: Path, taken: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import agentrl.rollout.engine as engine_mod

    drawn = iter([taken])
    monkeypatch.setattr(engine_mod, "free_port", lambda host: next(drawn, None) or free_port(host))
    monkeypatch.setattr(EngineConfig, "command", _stand_in_command)
    config = EngineConfig(model_path=str(build_tiny_model()), device="cpu", log_dir=str(tmp_path), health_poll_s=0.1)
    with caplog.at_level(logging.WARNING, logger="agentrl.rollout.engine"):
        engine = await SGLangEngine.launch(config)
    try:
        assert engine.url != f"http://127.0.0.1:{taken}" and await engine.healthy()
        assert f"port {taken} was taken" in caplog.text
        assert "address already in use" in (tmp_path / f"sglang-{taken}.log").read_text()
    finally:
        await asyncio.to_thread(engine.stop)


async def test_an_engine_on_a_named_port_that_is_taken_fails_at_once_naming_it(
        tmp_path: Path, taken: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(EngineConfig, "command", _stand_in_command)
    config = EngineConfig(model_path=str(build_tiny_model()), device="cpu", port=taken, log_dir=str(tmp_path),
                          health_poll_s=0.1, startup_timeout_s=600)
    with pytest.raises(EnginePortTaken, match=f"127.0.0.1:{taken} could not bind its port"):
        await SGLangEngine.launch(config)


async def test_an_engine_is_not_ready_because_another_server_answers_on_its_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a healthy server (the stand-in, in a process of its own) holds the port the engine is started on: the
    # probe is answered at once, but not by the engine, which is refused rather than taken for ready
    other = ManagedProcess([sys.executable, "-c", STAND_IN, "--port", str(port := free_port())],
                           env={"PATH": "/usr/bin:/bin"}, log_path=tmp_path / "other.log", name="other")
    try:
        async def answers() -> bool:
            return await SGLangEngine(f"http://127.0.0.1:{port}", None, None).healthy()

        await wait_ready(answers, what="other", timeout_s=60, poll_s=0.05, error_cls=RuntimeError, process=other,
                         port=port)  # its own server: ready
        # the engine's stand-in here never binds nor logs: only the answer from outside its tree can stop it
        monkeypatch.setattr(EngineConfig, "command", lambda self, port, device: [
            sys.executable, "-c", "import time; time.sleep(600)"])
        config = EngineConfig(model_path=str(build_tiny_model()), device="cpu", port=port, log_dir=str(tmp_path),
                              health_poll_s=0.1, startup_timeout_s=600)
        with pytest.raises(EnginePortTaken, match=f"another server answers on port {port}, not this one"):
            await SGLangEngine.launch(config)
    finally:
        other.stop(grace_s=1.0)


async def test_a_router_whose_drawn_port_was_taken_starts_on_another(
        tmp_path: Path, taken: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import agentrl.rollout.router as router_mod

    drawn = iter([taken])
    monkeypatch.setattr(router_mod, "free_port", lambda host: next(drawn, None) or free_port(host))
    router = await Router.launch(RouterConfig(log_dir=str(tmp_path)))
    try:
        assert router.port != taken and await router.workers() == []
        assert "Address already in use" in (tmp_path / f"router-{taken}.log").read_text()
    finally:
        await asyncio.to_thread(router.stop)


async def test_a_router_on_a_named_port_that_is_taken_fails_naming_it(tmp_path: Path, taken: int) -> None:
    with pytest.raises(RouterPortTaken, match=f"router http://127.0.0.1:{taken} could not bind its port"):
        await Router.launch(RouterConfig(port=taken, log_dir=str(tmp_path)))
