"""A lean HTTP/1.1 keep-alive connection pool for the ``/generate`` data path.

The rollout driver sends one POST per model turn, thousands a second, to a handful of loopback or
cluster-local endpoints; a general-purpose client (aiohttp: request objects, timers, cookie jar,
tracing, multidicts) spends ~250 µs of the driver's CPU on each. This pool does only what that path
needs — POST a JSON body on a kept-alive connection, read the status and the body — on an
``asyncio.Protocol`` with httptools' C response parser, at a fraction of the cost. Control-plane
calls (abort, loads, weight updates) keep using aiohttp.

Failure contract: a connection that breaks before the response is complete raises
:class:`HttpTransportError` (the caller retries it like any transport error); a response's status and
body come back as they are; cancelling a request closes its connection (it cannot be reused halfway).
Not thread-safe: one pool per event loop.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = ["HttpPool", "HttpTransportError"]


class HttpTransportError(ConnectionError):
    """The connection failed or closed before a complete response arrived."""


class _Connection(asyncio.Protocol):
    __slots__ = ("_body", "_parser", "_status", "_waiter", "alive", "keep_alive", "response_started", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._body: list[bytes] = []
        self._status = 0
        self.alive = True
        self.keep_alive = True
        self.response_started = False

    # -- asyncio.Protocol -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self.response_started = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HttpTransportError(f"malformed HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self._fail(HttpTransportError(f"connection closed before the response was complete"
                                      f"{': ' + str(exc) if exc else ''}"))

    # -- httptools callbacks --------------------------------------------------------------------
    def on_status(self, status: bytes) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        waiter, self._waiter = self._waiter, None
        body, self._body = b"".join(self._body), []
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, body))

    # -- use ---------------------------------------------------------------------------------------
    def send(self, request: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None and self._waiter is None
        self._waiter = loop.create_future()
        self._status = 0
        self.response_started = False
        self.transport.write(request)
        return self._waiter

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.close()


class HttpPool:
    """Kept-alive connections to one ``http://host:port`` origin, ``max_connections`` at most idle."""

    def __init__(self, base_url: str, *, max_connections: int = 256, connect_timeout_s: float = 10.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"HttpPool: base_url={base_url!r}; expected an http://host:port URL")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.max_connections = max_connections
        self.connect_timeout_s = connect_timeout_s
        self._host_header = f"{self.host}:{self.port}".encode()
        self._idle: deque[_Connection] = deque()
        self._closed = False

    async def _connection(self, reuse: bool = True) -> tuple[_Connection, bool]:
        while reuse and self._idle:
            conn = self._idle.pop()
            if conn.alive:
                return conn, True
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(loop.create_connection(_Connection, self.host, self.port),
                                                 self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise HttpTransportError(f"cannot connect to {self.host}:{self.port}: {type(exc).__name__}: {exc}") from exc
        return protocol, False

    async def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """POSTs ``body`` (JSON) to ``path``; returns ``(status, response body)``."""
        if self._closed:
            raise HttpTransportError("the connection pool is closed")
        extra = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) if headers else b""
        request = b"".join((b"POST ", (self.prefix + path).encode(), b" HTTP/1.1\r\nHost: ", self._host_header,
                            b"\r\nContent-Type: application/json\r\nContent-Length: ", str(len(body)).encode(),
                            b"\r\n", extra, b"\r\n", body))
        loop = asyncio.get_running_loop()
        conn, reused = await self._connection()
        try:
            status, data = await conn.send(request, loop)
        except HttpTransportError:
            conn.close()
            if not reused or conn.response_started:
                raise
            # the server closed an idle kept-alive connection as we used it: nothing was processed
            conn, _ = await self._connection(reuse=False)
            try:
                status, data = await conn.send(request, loop)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()  # a half-used connection is never reused (cancellation included)
            raise
        if conn.alive and conn.keep_alive and not self._closed and len(self._idle) < self.max_connections:
            self._idle.append(conn)
        else:
            conn.close()
        return status, data

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
