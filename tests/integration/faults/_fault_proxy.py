"""A small HTTP/1.1 proxy that injects faults in front of a real server (an SGLang engine, a router).

It runs in the test's event loop. Each request is read whole (``Content-Length`` bodies: what the
client, the router and aiohttp send), handed to ``rule(path, index)`` (``index`` counts the
requests of that path so far, from 0), and then:

- ``PASS``: forwarded to the upstream; its answer is written back (keep-alive);
- ``Status(code)``: answered with ``code`` and a JSON error body, never forwarded;
- ``RESET``: the connection is closed without an answer, never forwarded;
- ``CUT``: forwarded (the upstream did the work), then half of the answer is written and the
  connection closed: the answer is lost on the way back;
- ``STALL``: accepted and never answered, never forwarded (until the client gives up or the proxy stops).

:attr:`FaultProxy.seen` counts requests per path, :attr:`FaultProxy.forwarded` those that reached
the upstream and :attr:`FaultProxy.statuses` its answers, so a test can tell "retried" from "never retried".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson

__all__ = ["CUT", "PASS", "RESET", "STALL", "FaultProxy", "Status"]


@dataclass(frozen=True)
class Status:
    code: int


PASS, RESET, CUT, STALL = "pass", "reset", "cut", "stall"
Action = str | Status
Rule = Callable[[str, int], Action]
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


class FaultProxy:
    """``async with FaultProxy(upstream, rule) as proxy: proxy.url``; the rule may be swapped at any time."""

    def __init__(self, upstream: str, rule: Rule | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.rule: Rule = rule or (lambda path, index: PASS)
        self.seen: Counter[str] = Counter()
        self.forwarded: Counter[str] = Counter()
        self.actions: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()  # what the upstream answered to the forwarded requests
        self._server: asyncio.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.url = ""

    async def __aenter__(self) -> FaultProxy:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None and self._session is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()
        await self._session.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serves one request; False when the connection is to be closed."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if not target.startswith("/"):  # e.g. the router's HTTP/2 probe ("PRI * HTTP/2.0"): refused, as uvicorn does
            await self._write(writer, 400, {}, b"")
            return False
        path = target.split("?", 1)[0]
        action = self.rule(path, self.seen[path])
        self.seen[path] += 1
        self.actions[action if isinstance(action, str) else f"status {action.code}"] += 1
        if action == RESET:
            return False
        if action == STALL:
            await asyncio.Event().wait()  # until cancelled: the client gave up, or the proxy stops
        if isinstance(action, Status):
            payload = orjson.dumps({"error": {"message": f"injected HTTP {action.code} by the fault proxy"}})
            await self._write(writer, action.code, {"content-type": "application/json"}, payload)
            return True
        try:
            status, reply_headers, reply = await self._forward(method, target, headers, body)
        except aiohttp.ClientError as exc:  # the upstream is gone: a gateway error, as a proxy answers
            await self._write(writer, 502, {}, f"upstream unreachable: {exc}".encode())
            return False
        self.forwarded[path] += 1
        self.statuses[status] += 1
        if action == CUT:
            writer.write(self._head(status, reply_headers, len(reply)) + reply[: len(reply) // 2])
            await writer.drain()
            return False
        await self._write(writer, status, reply_headers, reply)
        return headers.get("connection", "").lower() != "close"

    async def _forward(self, method: str, target: str, headers: dict[str, str],
                       body: bytes) -> tuple[int, dict[str, str], bytes]:
        assert self._session is not None
        sent = {k: v for k, v in headers.items() if k not in _HOP}
        async with self._session.request(method, self.upstream + target, data=body, headers=sent) as resp:
            reply = await resp.read()
            kept = {k.lower(): v for k, v in resp.headers.items() if k.lower() not in _HOP}
            return resp.status, kept, reply

    @staticmethod
    def _head(status: int, headers: dict[str, str], length: int) -> bytes:
        lines = [f"HTTP/1.1 {status} X", *(f"{k}: {v}" for k, v in headers.items()), f"content-length: {length}"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _write(self, writer: asyncio.StreamWriter, status: int, headers: dict[str, str], body: bytes) -> None:
        writer.write(self._head(status, headers, len(body)) + body)
        await writer.drain()
