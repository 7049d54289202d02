"""The lean /generate transport against a raw asyncio HTTP server that misbehaves on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

from agentrl.rollout._http import HttpPool, HttpTransportError

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\": 1.0}"
CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\n{\"ok\"\r\n6\r\n: 2.0}\r\n0\r\n\r\n")


@dataclass
class Server:
    """Answers each request with ``behaviour(n)`` (n counts requests): bytes to send, then whether to close."""

    behaviour: Callable[[int], tuple[bytes, bool]]
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                data, close = self.behaviour(len(self.requests))
                writer.write(data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[asyncio.Server] = []

    async def start(behaviour: Callable[[int], tuple[bytes, bool]]) -> Server:
        state = Server(behaviour)
        srv = await asyncio.start_server(state.handle, "127.0.0.1", 0)
        servers.append(srv)
        state.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        return state

    yield start
    for srv in servers:
        srv.close()
        await srv.wait_closed()


async def test_connections_are_kept_alive_and_reused(serve: Any) -> None:
    server = await serve(lambda n: (OK, False))
    pool = HttpPool(server.url)
    for _ in range(5):
        assert await pool.post("/generate", b'{"a": 1}', {"X-SMG-Routing-Key": "k"}) == (200, b'{"ok": 1.0}')
    assert server.connections == 1
    assert b"X-SMG-Routing-Key: k\r\n" in server.requests[0] and server.requests[0].endswith(b'{"a": 1}')
    pool.close()


async def test_a_connection_the_server_closed_while_idle_is_replaced(serve: Any) -> None:
    server = await serve(lambda n: (OK, True))  # answers, then closes: the idle connection goes stale
    pool = HttpPool(server.url)
    assert (await pool.post("/generate", b"{}"))[0] == 200
    await asyncio.sleep(0.05)
    assert (await pool.post("/generate", b"{}"))[0] == 200
    assert server.connections == 2
    pool.close()


async def test_a_response_cut_short_is_a_transport_error(serve: Any) -> None:
    server = await serve(lambda n: (OK[:-4], True))  # the body is 4 bytes short when the server hangs up
    pool = HttpPool(server.url)
    with pytest.raises(HttpTransportError, match="before the response was complete"):
        await pool.post("/generate", b"{}")
    pool.close()


async def test_chunked_responses_and_statuses_come_back_whole(serve: Any) -> None:
    answers = {1: (CHUNKED, False), 2: (b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy", False)}
    server = await serve(lambda n: answers[n])
    pool = HttpPool(server.url)
    assert await pool.post("/generate", b"{}") == (200, b'{"ok": 2.0}')
    assert await pool.post("/generate", b"{}") == (503, b"busy")
    pool.close()


async def test_a_cancelled_request_does_not_leave_its_connection_in_the_pool(serve: Any) -> None:
    server = await serve(lambda n: (b"" if n == 1 else OK, False))  # never answers the first request
    pool = HttpPool(server.url)
    task = asyncio.ensure_future(pool.post("/generate", b"{}"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await pool.post("/generate", b"{}"))[0] == 200
    assert server.connections == 2  # the half-used connection was closed, not reused
    pool.close()


async def test_an_unreachable_origin_and_bad_urls_are_clear_errors() -> None:
    from agentrl.rollout.process import free_port

    with pytest.raises(HttpTransportError, match="cannot connect"):
        await HttpPool(f"http://127.0.0.1:{free_port()}").post("/generate", b"{}")
    with pytest.raises(ValueError, match="expected an http://host:port URL"):
        HttpPool("https://example.invalid")
