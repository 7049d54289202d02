"""The proxy's HTTP/1.1 server: keep-alive connections on httptools' C parser, one handler for all routes.

A harness sends one request per model turn, at the engine's pace: the proxy's serving path is as
hot as the agent loop's. A general-purpose framework (aiohttp's web server: request and response
objects, multidicts, URL objects, the router and middleware chain, a writer per response) spent
~0.1–0.15 ms of the proxy process's CPU on each request, about a third of everything the proxy adds
to a turn. This server does only what the proxy needs, as ``agentrl.rollout._http`` does on the
client side: parse a request (method, path, headers, body; ``Content-Length`` or chunked), await
the handler, write one response with a ``Content-Length`` body.

Contract:

- requests on one connection are answered in order (pipelined ones wait for the one before);
  connections are kept alive unless the client says otherwise (``Connection: close``, HTTP/1.0);
- a body over ``max_body_bytes`` is answered 413 and the connection closed; request headers over
  64 KiB 431; a malformed request 400 (and closed); ``Expect: 100-continue`` is honoured;
- ``HEAD`` is answered like ``GET`` without the body (the handler sees ``GET``);
- a handler's exception is logged and answered 500; a client that disconnects does not cancel its
  handler (its reply is dropped), as aiohttp's server does by default;
- :meth:`HttpServer.stop` stops listening, lets running handlers finish for up to
  ``shutdown_timeout_s`` (then cancels them) and closes every connection.

Not thread-safe: one server per event loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast

import httptools
import orjson

__all__ = ["HttpRequest", "HttpResponse", "HttpServer"]

log = logging.getLogger(__name__)

_MAX_HEAD_BYTES = 64 * 1024
_MAX_PIPELINED = 8  # complete requests waiting on one connection before it stops reading
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}


@dataclass(slots=True)
class HttpRequest:
    """One request: ``method`` (``HEAD`` arrives as ``GET``), ``path`` without the query, ``headers``
    with lower-case names (a repeated header keeps its last value), the whole ``body``."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """One response: ``status``, the whole ``body`` and its ``content_type``, extra ``headers``."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


def _refusal(status: int, message: str) -> HttpResponse:
    return HttpResponse(status, orjson.dumps({"error": {"message": message, "type": "invalid_request_error",
                                                        "param": None, "code": None}}))


class _Connection(asyncio.Protocol):
    """One client connection: httptools feeds the callbacks, complete requests queue for :meth:`_serve`."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url: list[bytes] = []
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._head = 0
        self._refused: HttpResponse | None = None  # answered without the handler (413, 431)
        self._queue: deque[tuple[HttpRequest | HttpResponse, bool, bool]] = deque()  # (what, keep alive, head)
        self._paused = False
        self.task: asyncio.Task[None] | None = None
        self.closed = False

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a response is one write: send it now
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._queue.clear()
        self._server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._abandon(_refusal(400, "protocol upgrades are not served"))
        except httptools.HttpParserError as exc:
            self._abandon(_refusal(400, f"malformed HTTP request: {exc}"))

    # -- httptools callbacks ----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = [], {}, []
        self._size = self._head = 0
        self._refused = None

    def on_url(self, url: bytes) -> None:
        self._head += len(url)
        if self._head <= _MAX_HEAD_BYTES:  # an over-long target is refused (431), not kept
            self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head += len(name) + len(value)
        if self._head <= _MAX_HEAD_BYTES:
            self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._head > _MAX_HEAD_BYTES:
            self._refused = _refusal(431, f"request headers over {_MAX_HEAD_BYTES} bytes")
            return
        length = self._headers.get("content-length", "")
        if length.isdigit() and int(length) > self._server.max_body_bytes:
            self._refused = _refusal(413, f"request body of {length} bytes; at most {self._server.max_body_bytes}")
        elif self._headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._refused is not None:
            return
        if self._size > self._server.max_body_bytes:  # chunked: no length up front
            self._refused, self._body = _refusal(413, f"request body over {self._server.max_body_bytes} bytes"), []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        method = self._parser.get_method().decode("latin-1")
        head = method == "HEAD"
        if self._refused is not None:
            self._push(self._refused, False, head)
            return
        path = b"".join(self._url).decode("latin-1").partition("?")[0]
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = HttpRequest("GET" if head else method, path, self._headers, body)
        self._push(request, self._parser.should_keep_alive(), head)

    # -- serving ----------------------------------------------------------------------------------
    def _push(self, what: HttpRequest | HttpResponse, keep_alive: bool, head: bool) -> None:
        self._queue.append((what, keep_alive, head))
        if len(self._queue) >= _MAX_PIPELINED and self._transport is not None and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        try:
            while self._queue and not self.closed:
                what, keep_alive, head = self._queue.popleft()
                if self._paused and len(self._queue) < _MAX_PIPELINED // 2 and self._transport is not None:
                    self._paused = False
                    self._transport.resume_reading()
                response = what if isinstance(what, HttpResponse) else await self._handle(what)
                self._write(response, keep_alive, head)
                if not keep_alive:
                    self._close()
        finally:
            self.task = None

    async def _handle(self, request: HttpRequest) -> HttpResponse:
        try:
            return await self._server.handler(request)
        except Exception:
            log.exception("the proxy's handler failed on %s %s", request.method, request.path)
            return _refusal(500, "internal error in the agentrl proxy")

    def _write(self, response: HttpResponse, keep_alive: bool, head: bool) -> None:
        transport = self._transport
        if self.closed or transport is None or transport.is_closing():
            return  # the client went away: the reply is dropped
        status = _STATUS_LINES.get(response.status) or f"HTTP/1.1 {response.status} Unknown\r\n".encode()
        parts = [status, b"Content-Type: ", response.content_type.encode(), b"\r\nContent-Length: ",
                 str(len(response.body)).encode(), b"\r\n"]
        for name, value in response.headers.items():
            parts += (name.encode(), b": ", value.encode(), b"\r\n")
        if not keep_alive:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        if not head:
            parts.append(response.body)
        transport.write(b"".join(parts))

    def _abandon(self, response: HttpResponse) -> None:
        """A request the parser cannot go on from: answered (when nothing is in flight) and closed."""
        self._queue.clear()
        if self.task is None:
            self._write(response, False, False)
        self._close()

    def _close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class HttpServer:
    """Serves ``handler`` on ``host:port`` (see the module doc)."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, shutdown_timeout_s: float = 60.0) -> None:
        self.handler, self.max_body_bytes, self.shutdown_timeout_s = handler, max_body_bytes, shutdown_timeout_s
        self.connections: set[_Connection] = set()
        self._listener: asyncio.AbstractServer | None = None

    async def start(self, host: str, port: int) -> int:
        """Starts listening; returns the port (a free one for ``port=0``)."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(lambda: _Connection(self), host, port, backlog=1024)
        return int(self._listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        listener.close()
        running = [c.task for c in self.connections if c.task is not None]
        if running:
            _, late = await asyncio.wait(running, timeout=self.shutdown_timeout_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        for conn in list(self.connections):
            conn._close()
        await listener.wait_closed()
