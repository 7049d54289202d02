"""The proxy's own HTTP/1.1 server (``agentrl.proxy._http``) on raw sockets: keep-alive, pipelining,
chunked bodies, refusals (413, 400, 431), HEAD, ``Connection: close``, handler failures, shutdown; and
the proxy's routes on it (404, 405 in OpenAI's error shape)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
import pytest

from agentrl.proxy import ProxyConfig, ProxyServer
from agentrl.proxy._http import HttpRequest, HttpResponse, HttpServer

Response = tuple[int, dict[str, str], bytes]


async def echo(request: HttpRequest) -> HttpResponse:
    if request.path == "/fail":
        raise RuntimeError("boom")
    if request.path == "/slow":
        await asyncio.sleep(0.05)
    body = orjson.dumps({"method": request.method, "path": request.path, "body": request.body.decode(),
                         "agent": request.headers.get("x-agent")})
    return HttpResponse(200, body, headers={"x-seen": "1"})


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


@contextlib.asynccontextmanager
async def connected() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A connection to an echo server (1 KiB bodies); closed and the server stopped however the test ends."""
    server = HttpServer(echo, max_body_bytes=1024)
    reader, writer = await asyncio.open_connection("127.0.0.1", await server.start("127.0.0.1", 0))
    try:
        yield reader, writer
    finally:
        writer.close()
        await server.stop()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def test_keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    async with connected() as (reader, writer):
        writer.write(post("/slow?x=1", b"first", "X-Agent: a\r\n"))
        status, headers, body = await read_response(reader)
        assert status == 200 and headers["x-seen"] == "1" and headers["content-type"] == "application/json"
        assert orjson.loads(body) == {"method": "POST", "path": "/slow", "body": "first", "agent": "a"}
        writer.write(post("/slow", b"second") + post("/fast", b"third"))  # pipelined: the slow one answers first
        assert [orjson.loads((await read_response(reader))[2])["body"] for _ in range(2)] == ["second", "third"]


async def test_a_chunked_body_is_joined() -> None:
    async with connected() as (reader, writer):
        writer.write(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        assert orjson.loads((await read_response(reader))[2])["body"] == "abcde"


@pytest.mark.parametrize("raw, status", [
    (post("/big", b"x" * 2000), 413),
    (b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n" + b"x" * 2000 + b"\r\n0\r\n\r\n", 413),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431),
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
])
async def test_refused_requests_are_answered_and_the_connection_closed(raw: bytes, status: int) -> None:
    async with connected() as (reader, writer):
        writer.write(raw)
        got, headers, body = await read_response(reader)
        assert got == status and headers["connection"] == "close"
        assert orjson.loads(body)["error"]["type"] == "invalid_request_error"
        assert await reader.read() == b""  # closed


async def test_head_connection_close_and_a_failing_handler() -> None:
    async with connected() as (reader, writer):
        writer.write(b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Content-Length: " in head  # the length, not the body
        writer.write(post("/fail", b""))
        status, _, body = await read_response(reader)
        assert status == 500 and "internal error" in orjson.loads(body)["error"]["message"]
        writer.write(post("/again", b"x", "Connection: close\r\n"))  # still served after the failure
        status, headers, _ = await read_response(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await reader.read() == b""


async def test_stop_lets_a_running_handler_answer() -> None:
    started = asyncio.Event()

    async def slow(request: HttpRequest) -> HttpResponse:
        started.set()
        await asyncio.sleep(0.05)
        return HttpResponse(200, request.body)

    server = HttpServer(slow, max_body_bytes=1024)
    reader, writer = await asyncio.open_connection("127.0.0.1", await server.start("127.0.0.1", 0))
    writer.write(post("/slow", b"late"))
    await started.wait()
    stopping = asyncio.create_task(server.stop())
    assert await read_response(reader) == (200, {"content-type": "application/json", "content-length": "4"}, b"late")
    await stopping
    assert await reader.read() == b""  # then the connection is closed
    writer.close()


async def test_the_proxys_routes_answer_unknown_paths_and_methods_in_openais_shape() -> None:
    async with ProxyServer(ProxyConfig()) as server:
        port = int(server.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for raw, expected in ((b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
                              (b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405),
                              (post("/v1/models", b""), 405),
                              (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 200)):
            writer.write(raw)
            status, headers, body = await read_response(reader)
            assert status == expected, raw
            if status == 405:
                assert headers["allow"] in ("GET", "POST")
            if status >= 400:
                assert set(orjson.loads(body)["error"]) == {"message", "type", "param", "code"}
        writer.close()
