"""Headless Chromium driven over the DevTools protocol, for tests and benchmarks of HTML pages.

:class:`HeadlessChromium` starts the browser (Debian ``chromium``, installed by the project's
setup) on a free loopback port with its own profile folder, opens pages, records every console
error, uncaught exception and failed load the page produces, and takes full-page screenshots.
The protocol client is a plain aiohttp websocket: no browser-automation package is needed.

Example::

    async with HeadlessChromium() as browser:
        result = await browser.load(Path("page.html").resolve().as_uri())
        assert not result.errors, result.errors
        png = await browser.screenshot()

Use in tests and benchmarks only.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ChromiumError", "HeadlessChromium", "PageLoad", "chromium_path"]

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class ChromiumError(RuntimeError):
    """The browser could not be started or did not answer."""


def chromium_path() -> str | None:
    """The Chromium (or Chrome) executable on ``PATH``, or ``$AGENTRL_CHROMIUM``; None when absent."""
    explicit = os.environ.get("AGENTRL_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageLoad:
    """One page load: seconds from navigation to the first frame after ``load``, and what went wrong."""

    url: str
    seconds: float
    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)


class HeadlessChromium:
    """A headless browser process and one page, driven over the DevTools protocol (async context manager)."""

    def __init__(self, *, width: int = 1280, height: int = 900, executable: str | None = None) -> None:
        self.width, self.height = width, height
        self.executable = executable or chromium_path()
        self._proc: subprocess.Popen[bytes] | None = None
        self._profile: tempfile.TemporaryDirectory[str] | None = None
        self._session: Any = None
        self._ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: list[tuple[str, dict[str, Any]]] = []
        self._event_added = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------------
    async def __aenter__(self) -> HeadlessChromium:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, timeout_s: float = 30.0) -> None:
        import aiohttp

        if self.executable is None:
            raise ChromiumError("no chromium executable on PATH (Debian package 'chromium'; or set AGENTRL_CHROMIUM)")
        self._profile = tempfile.TemporaryDirectory(prefix="agentrl-chromium-")
        args = [self.executable, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking", "--disable-sync", "--mute-audio",
                "--force-color-profile=srgb", "--hide-scrollbars", "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0", f"--user-data-dir={self._profile.name}",
                f"--window-size={self.width},{self.height}", "about:blank"]
        if os.geteuid() == 0:  # Chromium's own sandbox refuses to run as root
            args.insert(1, "--no-sandbox")
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        port = await self._port(Path(self._profile.name) / "DevToolsActivePort", timeout_s)
        self._session = aiohttp.ClientSession()
        deadline = time.monotonic() + timeout_s
        while True:
            async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                pages = [t for t in await resp.json() if t.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        if not pages:
            raise ChromiumError("chromium started but shows no page target")
        self._ws = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self.send(f"{domain}.enable")

    async def _port(self, file: Path, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ChromiumError(f"chromium exited with status {self._proc.returncode} before listening")
            with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                return int(file.read_text().splitlines()[0])
            await asyncio.sleep(0.05)
        raise ChromiumError(f"chromium did not open its DevTools port within {timeout_s:.0f} s")

    async def close(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.send("Browser.close"), 5)
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._session is not None:
            await self._session.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.terminate()  # only the browser this object started, by its own handle
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        if self._profile is not None:
            self._profile.cleanup()
        self._ws = self._session = self._reader = self._proc = self._profile = None

    # -- protocol ----------------------------------------------------------------------------------
    async def _read(self) -> None:
        import aiohttp

        async for msg in self._ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                continue
            data = msg.json()
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
            else:
                self._events.append((data.get("method", ""), data.get("params", {})))
                self._event_added.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ChromiumError("the DevTools connection closed"))

    async def send(self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
        """One DevTools command; returns its ``result`` (raises :class:`ChromiumError` on an error reply)."""
        if self._ws is None:
            raise ChromiumError("the browser is not started")
        msg_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self._ws.send_json({"id": msg_id, "method": method, "params": params or {}})
        reply = await asyncio.wait_for(fut, timeout_s)
        if "error" in reply:
            raise ChromiumError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def _wait_event(self, method: str, since: int, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            for name, params in self._events[since:]:
                if name == method:
                    return params
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChromiumError(f"no {method} within {timeout_s:.0f} s")
            self._event_added.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._event_added.wait(), left)

    # -- pages -------------------------------------------------------------------------------------
    async def load(self, url: str, timeout_s: float = 30.0) -> PageLoad:
        """Opens ``url``; waits for ``load`` and one painted frame. Console errors, uncaught exceptions
        and failed loads (the browser's log at level error) land in ``errors``."""
        since = len(self._events)
        started = time.perf_counter()
        nav = await self.send("Page.navigate", {"url": url}, timeout_s)
        if nav.get("errorText"):
            raise ChromiumError(f"{url}: {nav['errorText']}")
        await self._wait_event("Page.loadEventFired", since, timeout_s)
        await self.send("Runtime.evaluate", {"expression": "new Promise(r => requestAnimationFrame(() => r(1)))",
                                             "awaitPromise": True}, timeout_s)
        seconds = time.perf_counter() - started
        await asyncio.sleep(0.05)  # late console messages of the load
        result = PageLoad(url=url, seconds=seconds)
        for name, params in self._events[since:]:
            if name == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                result.console.append(f"{params.get('type')}: {text}")
                if params.get("type") in ("error", "assert"):
                    result.errors.append(f"console.{params.get('type')}: {text}")
            elif name == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                result.errors.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
            elif name == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                result.errors.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())
        return result

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        reply = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                     "awaitPromise": True})
        if "exceptionDetails" in reply:
            raise ChromiumError(f"evaluate: {reply['exceptionDetails'].get('text')}")
        return reply.get("result", {}).get("value")

    async def screenshot(self, *, full_page: bool = True, max_height: int = 6000) -> bytes:
        """A PNG of the page (the whole page up to ``max_height`` pixels, or the window)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = await self.send("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
            height = min(int(size.get("height", self.height)), max_height)
            width = max(int(size.get("width", self.width)), self.width)
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        reply = await self.send("Page.captureScreenshot", params)
        return base64.b64decode(reply["data"])
