"""The proxy's HTTP server: OpenAI's ``/v1/chat/completions`` and ``/v1/models``, one base URL per session.

Routes (``BASE`` = ``http://host:port``):

- ``POST BASE/s/<session>/v1/chat/completions``: served by that :class:`ProxySession` (streaming
  and not); ``GET BASE/s/<session>/v1/models`` and ``GET BASE/v1/models`` list the one model.
- a request body must be sent as ``Content-Type: application/json`` (a charset parameter is fine):
  anything else is a 400 ``unsupported_content_type``, as OpenAI answers it;
- an unknown session is a 404 that names nothing else; a session whose episode ended answers 410
  (and the call is recorded on its episode as an ``agent_late_call`` error); with
  ``ProxyConfig.api_key`` set, a request without ``Authorization: Bearer <key>`` is a 401.

Session ids are 192-bit random URL tokens (:func:`secrets.token_urlsafe`): a harness reaches only the
session whose URL it was given, and nothing of one session (its messages, ids, errors) appears in
another's answers. The server runs on the event loop that calls :meth:`ProxyServer.start`; sessions
are served concurrently, each session's requests one at a time. HTTP is served by
:mod:`agentrl.proxy._http` (a lean keep-alive server on httptools: the serving path is as hot as the
agent loop's); any other path is a 404, another method a 405, all errors in OpenAI's shape.

Example::

    async with ProxyServer(ProxyConfig(api_key="k")) as server:
        session = server.open(ProxySession(template, client, AgentConfig()))
        oai = openai.AsyncOpenAI(base_url=server.base_url(session), api_key="k")
        await oai.chat.completions.create(model="agentrl", messages=[{"role": "user", "content": "hi"}])
        episode = server.close(session, StopReason.ENV_DONE)
"""

from __future__ import annotations

import hmac
import weakref
from collections import OrderedDict

import orjson

from agentrl.episode import Episode
from agentrl.proxy._http import HttpRequest, HttpResponse, HttpServer
from agentrl.proxy._wire import RequestError, completion, error_body, parse_request, stream_events
from agentrl.proxy.session import ProxyConfig, ProxySession, SessionError
from agentrl.trajectory import ErrorKind, StopReason

__all__ = ["ProxyServer"]

_CLOSED_KEPT = 4096  # closed sessions remembered, so a late call is told "closed" and recorded
_RETRY = {"x-should-retry": "true"}
_NO_RETRY = {"x-should-retry": "false"}
_STREAM_HEADERS = {"Cache-Control": "no-cache"}


def _not_allowed(method: str, allowed: str) -> HttpResponse:
    return HttpResponse(405, error_body(f"method {method} not allowed here; expected {allowed}"),
                        headers={"Allow": allowed})


def _error(status: int, message: str, kind: str = "invalid_request_error", *, param: str | None = None,
           code: str | None = None, retry: bool = False) -> HttpResponse:
    return HttpResponse(status, error_body(message, kind=kind, param=param, code=code),
                        headers=_RETRY if retry else _NO_RETRY)


class ProxyServer:
    """The HTTP front of many :class:`ProxySession` objects (see the module doc). Not thread-safe:
    use it from the loop that started it."""

    def __init__(self, config: ProxyConfig | None = None) -> None:
        self.config = config or ProxyConfig()
        self._sessions: dict[str, ProxySession] = {}
        # closed sessions' ids, so a late call is told "closed" (and recorded while the episode is still held)
        self._closed: OrderedDict[str, weakref.ref[ProxySession]] = OrderedDict()
        self._http: HttpServer | None = None
        self.url = ""
        self.requests = 0

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> str:
        """Starts listening; returns ``http://host:port``."""
        if self._http is not None:
            return self.url
        http = HttpServer(self._route, max_body_bytes=self.config.max_body_bytes)
        port = await http.start(self.config.host, self.config.port)
        self._http = http
        self.url = f"http://{self.config.host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Stops listening; open sessions are closed (their held requests answered ``aborted``)."""
        for session in list(self._sessions.values()):
            session.close()
        if self._http is not None:
            await self._http.stop()
            self._http = None

    async def __aenter__(self) -> ProxyServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._http is not None

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    # -- sessions --------------------------------------------------------------------------------
    def open(self, session: ProxySession) -> ProxySession:
        """Serves ``session`` from now on (at :meth:`base_url`)."""
        if session.id in self._sessions or session.id in self._closed:
            raise ValueError(f"ProxyServer.open: session id {session.id[:8]}… is already in use")
        self._sessions[session.id] = session
        return session

    def base_url(self, session: ProxySession) -> str:
        """The OpenAI base URL of ``session``: ``http://host:port/s/<session>/v1``."""
        if not self.url:
            raise RuntimeError("ProxyServer.base_url: the server is not started (await start() first)")
        return f"{self.url}/s/{session.id}/v1"

    def close(self, session: ProxySession, reason: StopReason | None = None) -> Episode:
        """Stops serving ``session`` (later calls get 410); with ``reason``, ends its episode with it."""
        self._sessions.pop(session.id, None)
        session.close()
        self._closed[session.id] = weakref.ref(session)
        while len(self._closed) > _CLOSED_KEPT:
            self._closed.popitem(last=False)
        return session.finish(reason) if reason is not None else session.episode()

    # -- handlers --------------------------------------------------------------------------------
    async def _route(self, request: HttpRequest) -> HttpResponse:
        """The API key, then the routes of the module doc (``/s/<session>/v1/...``, ``/v1/...``)."""
        key = self.config.api_key
        if key is not None:
            given = request.headers.get("authorization", "")
            token = given[7:] if given.startswith("Bearer ") else ""
            if not hmac.compare_digest(token.encode(), key.encode()):
                return _error(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error",
                              code="invalid_api_key")
        path, method = request.path, request.method
        sid, route = "", path
        if path.startswith("/s/"):
            sid, _, rest = path[3:].partition("/")
            route = "/" + rest if sid else ""
        if route == "/v1/chat/completions":
            if method != "POST":
                return _not_allowed(method, "POST")
            return await self._chat(request, sid) if sid else self._no_session()
        if route == "/v1/models":
            if method != "GET":
                return _not_allowed(method, "GET")
            return self._models() if not sid or sid in self._sessions else self._unknown(sid)
        return _error(404, f"no route {path!r:.120}: the proxy serves <base>/s/<session>/v1/chat/completions and "
                           "/v1/models", "not_found_error")

    def _models(self) -> HttpResponse:
        body = {"object": "list", "data": [{"id": self.config.model_name, "object": "model", "created": 0,
                                            "owned_by": "agentrl"}]}
        return HttpResponse(200, orjson.dumps(body))

    def _no_session(self) -> HttpResponse:
        return _error(404, "address a session: POST <base>/s/<session>/v1/chat/completions (each episode has its "
                           "own base URL)", "not_found_error")

    def _unknown(self, sid: str) -> HttpResponse:
        ref = self._closed.get(sid)
        if ref is not None:
            closed = ref()
            if closed is not None:
                closed.record(ErrorKind.AGENT_LATE_CALL, "a request after the episode ended", "request")
            return _error(410, "this session's episode has ended; no more requests are served", "episode_closed")
        return _error(404, "no such session", "not_found_error")

    async def _chat(self, request: HttpRequest, sid: str) -> HttpResponse:
        self.requests += 1
        session = self._sessions.get(sid)
        if session is None:
            return self._unknown(sid)
        media = request.headers.get("content-type", "")
        if media.partition(";")[0].strip().lower() != "application/json":
            message = (f"Content-Type: got {media!r:.80}; this endpoint only accepts 'application/json' request "
                       "bodies")
            session.metrics["proxy/bad_requests"] += 1
            session.record(ErrorKind.AGENT_REQUEST, message, "request")
            return _error(400, message, code="unsupported_content_type")
        try:
            chat = parse_request(orjson.loads(request.body), session.memo)
        except orjson.JSONDecodeError as exc:
            session.record(ErrorKind.AGENT_REQUEST, f"body: not JSON ({exc})", "request")
            return _error(400, f"body: not JSON ({exc})")
        except RequestError as exc:
            session.metrics["proxy/bad_requests"] += 1
            session.record(ErrorKind.AGENT_REQUEST, f"{exc.param or 'request'}: {exc.message}", "request")
            return _error(exc.status, exc.message, param=exc.param, code=exc.code)
        retries = request.headers.get("x-stainless-retry-count", "0")
        try:
            reply = await session.handle(chat, retry=retries.isdigit() and int(retries) > 0)
        except RequestError as exc:
            return _error(exc.status, exc.message, param=exc.param, code=exc.code)
        except SessionError as exc:
            return _error(exc.status, exc.message, exc.kind, code=exc.code, retry=exc.retry)
        if chat.stream:
            return HttpResponse(200, stream_events(reply, chat.include_usage), "text/event-stream", _STREAM_HEADERS)
        return HttpResponse(200, completion(reply))
