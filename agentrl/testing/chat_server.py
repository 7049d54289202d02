"""A fake OpenAI-compatible chat-completions server on 127.0.0.1, for tests of message-level episodes.

:class:`FakeChatServer` answers ``POST /v1/chat/completions`` with what ``answer(messages, tools)``
returns (an OpenAI ``message`` object, optionally with ``finish_reason``) and lists one model at
``GET /v1/models``; every request body is kept in ``requests``. It runs an aiohttp server in its own
thread, so a subprocess (``agentrl eval --endpoint``) or the test's event loop can call it.
:func:`arithmetic_chat_answer` plays the toy-arithmetic policy (calculator, then the boxed result).

Use in tests only.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["FakeChatServer", "arithmetic_chat_answer"]

Answer = Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]
_QUESTION = re.compile(r"(\d+) \* (\d+)")


def arithmetic_chat_answer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Calls ``calculator`` on the question, then answers ``\\boxed{product}`` once it has a tool result."""
    question = next(m["content"] for m in messages if m["role"] == "user")
    a, b = (int(x) for x in _QUESTION.findall(question)[-1])
    if not any(m["role"] == "tool" for m in messages):
        call = {"id": "call_0", "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": f"{a} * {b}"})}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": f"The answer is \\boxed{{{a * b}}}."}


class FakeChatServer:
    """See the module doc. ``with FakeChatServer(answer) as server: server.url`` (``.../v1``)."""

    def __init__(self, answer: Answer = arithmetic_chat_answer, *, model: str = "fake-model") -> None:
        self.answer, self.model = answer, model
        self.requests: list[dict[str, Any]] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    def __enter__(self) -> FakeChatServer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("FakeChatServer did not start within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from aiohttp import web

        async def completions(request: web.Request) -> web.Response:
            body = await request.json()
            self.requests.append(body)
            message = dict(self.answer(body["messages"], body.get("tools") or []))
            finish = message.pop("finish_reason", "tool_calls" if message.get("tool_calls") else "stop")
            if finish == "error":
                return web.json_response({"error": {"message": message.get("content")}}, status=400)
            return web.json_response({"id": "chatcmpl-fake", "object": "chat.completion", "model": self.model,
                                      "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                                      "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", completions)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

