"""A small fake SGLang worker for fast tests and client benchmarks (never used outside tests).

It answers the routes the real sglang-router probes (``/health``, ``/server_info``, ``/model_info``)
and the SGLang routes the client uses (``/generate``, ``/abort_request``, ``/flush_cache``,
``/update_weights_from_disk``, ``/pause_generation``, ``/continue_generation``, ``/v1/loads``), in SGLang 0.5.23's
response shape. Generation is deterministic: output token ``i`` is ``(last_input_id + 1 + i) % vocab``
with log-probability ``-0.1 * (i + 1)``, or, with a ``script``, turn ``k``'s scripted ids where ``k``
counts the ``script_marker`` ids in the prompt (e.g. the tool-response tag: a tool call, then an answer); ``token_delay_s`` makes each token take time so aborts and
deadlines can be exercised. ``meta_info.worker`` names the worker that answered (the router passes
response bodies through unchanged). Every ``/generate`` body and its headers are recorded.

Run in a thread of the test process (:meth:`FakeWorker.start`) or as its own process::

    python -m agentrl.testing.fake_worker --port 18001 --name w0
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from agentrl.rollout.types import RoutingShape
from agentrl.testing.scripted import scripted_routing

__all__ = ["FakeCluster", "FakeWorker", "FakeWorkerState"]


@dataclass
class FakeWorkerState:
    """What the fake worker saw and how it misbehaves; tests mutate it between requests."""

    name: str = "fake"
    vocab_size: int = 1024
    token_delay_s: float = 0.0
    weight_version: str = "default"
    context_length: int = 4096
    fail_next: int = 0
    fail_status: int = 500
    record: bool = True
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    aborted: set[str] = field(default_factory=set)
    running: dict[str, bool] = field(default_factory=dict)
    control_calls: list[str] = field(default_factory=list)
    script: list[list[int]] | None = None
    script_marker: int | None = None
    # weight updates: fail the next ``fail_updates`` (-1: every one) with HTTP 400 as SGLang does;
    # ``keep_version`` answers success but leaves ``weight_version`` unchanged; ``update_delay_s``
    # makes each update take time
    fail_updates: int = 0
    keep_version: bool = False
    update_delay_s: float = 0.0
    updates: list[dict[str, Any]] = field(default_factory=list)
    # pause state: while paused, decoding stops (``retract``/``in_place`` keep requests, ``abort``
    # ends them); new requests wait for ``continue`` as on SGLang
    paused: bool = False
    in_update_session: bool = False
    pause_modes: list[str] = field(default_factory=list)
    # a mixture-of-experts engine started with --enable-return-routed-experts: a request setting
    # return_routed_experts gets the routing of positions [routed_experts_start_len, len - 1) as SGLang
    # encodes it (base64 int32), each row agentrl.testing.scripted.scripted_routing of its token
    routing: RoutingShape | None = None


class FakeWorker:
    """A fake engine on ``127.0.0.1:port`` (``port=0``: a free one). ``url`` is valid after start."""

    def __init__(self, state: FakeWorkerState | None = None, port: int = 0) -> None:
        self.state = state or FakeWorkerState()
        self._port = port
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._ok)
        app.router.add_get("/health_generate", self._ok)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/abort_request", self._abort)
        app.router.add_route("*", "/flush_cache", self._ok)
        app.router.add_post("/pause_generation", self._control)
        app.router.add_post("/continue_generation", self._control)
        app.router.add_post("/update_weights_from_disk", self._update_weights)
        app.router.add_get("/v1/loads", self._loads)
        app.router.add_post("/begin_weight_update", self._session)
        app.router.add_post("/end_weight_update", self._session)
        app.router.add_post("/release_memory_occupation", self._memory)
        app.router.add_post("/resume_memory_occupation", self._memory)
        return app

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _control(self, request: web.Request) -> web.Response:
        """``/pause_generation`` and ``/continue_generation``."""
        self.state.control_calls.append(request.path)
        if request.path == "/continue_generation":
            self.state.paused = False
            return web.json_response({"message": "Generation continued successfully.", "status": "ok"})
        mode = str((await request.json() or {}).get("mode", "abort"))
        self.state.pause_modes.append(mode)
        self.state.paused = True
        if mode == "abort":
            self.state.aborted.update(self.state.running)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _session(self, request: web.Request) -> web.Response:
        """SGLang's weight-update session: ``begin`` twice, or ``end`` without ``begin``, answer 400."""
        self.state.control_calls.append(request.path)
        opening = request.path == "/begin_weight_update"
        if opening == self.state.in_update_session:
            return web.json_response({"success": False, "message": "weight update session state"}, status=400)
        self.state.in_update_session = opening
        return web.json_response({"success": True})

    async def _memory(self, request: web.Request) -> web.Response:
        """``/release_memory_occupation`` and ``/resume_memory_occupation``: recorded with their tags."""
        tags = (await request.json() or {}).get("tags") or ["all"]
        self.state.control_calls.append(f"{request.path} {','.join(tags)}")
        return web.json_response({"success": True})

    async def _wait_unpaused(self, rid: str | None = None) -> None:
        while self.state.paused and (rid is None or rid not in self.state.aborted):
            await asyncio.sleep(0.005)

    async def _server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": f"fake/{self.state.name}", "served_model_name": "fake",
                                  "tp_size": 1, "dp_size": 1, "context_length": self.state.context_length,
                                  "version": "fake"})

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": f"fake/{self.state.name}", "model_type": "qwen3",
                                  "architectures": ["Qwen3ForCausalLM"], "weight_version": self.state.weight_version})

    async def _loads(self, request: web.Request) -> web.Response:
        load = {"dp_rank": 0, "num_running_reqs": len(self.state.running), "num_waiting_reqs": 0}
        return web.json_response({"loads": [load]})

    async def _update_weights(self, request: web.Request) -> web.Response:
        s = self.state
        s.control_calls.append(request.path)
        body = await request.json()
        s.updates.append(body)
        if s.update_delay_s:
            await asyncio.sleep(s.update_delay_s)
        if s.fail_updates:
            s.fail_updates -= 1 if s.fail_updates > 0 else 0
            return web.json_response({"success": False, "message": f"injected update failure by {s.name}",
                                      "num_paused_requests": 0}, status=400)
        if body.get("abort_all_requests"):
            s.aborted.update(s.running)
        if body.get("weight_version") is not None and not s.keep_version:
            s.weight_version = str(body["weight_version"])
        return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})

    async def _abort(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("abort_all"):
            self.state.aborted.update(self.state.running)
        elif "rid" in body:
            self.state.aborted.add(str(body["rid"]))
        return web.Response(text="")

    async def _generate(self, request: web.Request) -> web.Response:
        s = self.state
        body = orjson.loads(await request.read())  # orjson: benchmarks drive thousands of requests a second
        if s.record:
            s.requests.append(body)
            s.headers.append(dict(request.headers))
        if s.fail_next > 0:
            s.fail_next -= 1
            return web.json_response({"error": {"message": f"injected failure by {s.name}"}}, status=s.fail_status)
        ids = body.get("input_ids")
        sp = body.get("sampling_params") or {}
        if not isinstance(ids, list) or not ids:
            return web.json_response({"error": {"message": "input_ids: expected a non-empty list"}}, status=400)
        max_new = int(sp.get("max_new_tokens", 128))
        if len(ids) + max_new > s.context_length:
            msg = (f"The input ({len(ids)} tokens) is longer than the model's context length "
                   f"({s.context_length} tokens).")
            return web.json_response({"error": {"message": msg}}, status=400)
        rid = str(body.get("rid") or id(body))
        await self._wait_unpaused()
        scripted = None
        if s.script:
            turn = ids.count(s.script_marker) if s.script_marker is not None else 0
            scripted = s.script[min(turn, len(s.script) - 1)]
        out, finish = await self._decode(rid, int(ids[-1]), max_new, set(sp.get("stop_token_ids") or []), scripted)
        lps = [[-0.1 * (i + 1), t, None] for i, t in enumerate(out)]
        meta = {"id": rid, "prompt_tokens": len(ids), "completion_tokens": len(out), "cached_tokens": 0,
                "finish_reason": finish, "weight_version": s.weight_version, "worker": s.name}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = lps
        if body.get("return_routed_experts") and s.routing is not None:
            start = int(body.get("routed_experts_start_len", 0))
            rows = scripted_routing([*ids, *out][start: len(ids) + len(out) - 1], s.routing)
            meta["routed_experts"] = base64.b64encode(rows.astype("<i4").tobytes()).decode()
        return web.Response(body=orjson.dumps({"text": "", "output_ids": out, "meta_info": meta}),
                            content_type="application/json")

    async def _decode(self, rid: str, last: int, max_new: int, stops: set[int],
                      scripted: list[int] | None = None) -> tuple[list[int], dict[str, Any]]:
        s = self.state
        s.running[rid] = True
        out: list[int] = []
        try:
            if not s.token_delay_s and scripted is None:  # nothing can abort it: produce the tokens at once
                await asyncio.sleep(0)
                if rid not in s.aborted:
                    out = [(last + 1 + i) % s.vocab_size for i in range(max_new)]
                    hit = next((i for i, t in enumerate(out) if t in stops), None) if stops else None
                    if hit is not None:
                        return out[: hit + 1], {"type": "stop", "matched": out[hit]}
                    return out, {"type": "length", "length": max_new}
            for i in range(max_new):
                if s.token_delay_s:
                    await asyncio.sleep(s.token_delay_s)
                await self._wait_unpaused(rid)
                if rid in s.aborted:
                    s.aborted.discard(rid)
                    return out, {"type": "abort", "message": "Abort before prefill" if not out else "aborted"}
                if scripted is not None:
                    if i >= len(scripted):
                        return out, {"type": "stop", "matched": None}
                    tok = scripted[i]
                else:
                    tok = (last + 1 + i) % s.vocab_size
                out.append(tok)
                if tok in stops:
                    return out, {"type": "stop", "matched": tok}
            return out, {"type": "length", "length": max_new}
        finally:
            s.running.pop(rid, None)

    async def start_async(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self._port).start()
        port = int(self._runner.addresses[0][1])
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop_async(self) -> None:
        self.state.aborted.update(self.state.running)  # let slow generations end before shutdown
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> str:
        """Serves from a background thread with its own event loop; returns the URL."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start_async())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"fake-worker-{self.state.name}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake worker did not start within 10 s")
        return self.url

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop_async(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None


@dataclass
class FakeCluster:
    """Fake workers registered behind one router (``agentrl.rollout.Router``) for tests."""

    router: Any
    workers: list[FakeWorker]

    def reset(self) -> None:
        """Forgets recorded requests and injected failures between tests."""
        for w in self.workers:
            w.state.requests.clear()
            w.state.headers.clear()
            w.state.fail_next = 0
            w.state.fail_status = 500
            w.state.token_delay_s = 0.0
            w.state.fail_updates = 0
            w.state.keep_version = False
            w.state.update_delay_s = 0.0
            w.state.paused = False

    def urls(self) -> list[str]:
        return [w.url for w in self.workers]


def main() -> None:
    parser = argparse.ArgumentParser(description="fake SGLang worker for tests and benchmarks")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="fake")
    parser.add_argument("--no-record", action="store_true", help="do not keep request bodies (benchmarks)")
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds per generated token")
    parser.add_argument("--script", help='JSON file {"marker": id, "turns": [[ids...], ...]}: scripted replies')
    args = parser.parse_args()
    state = FakeWorkerState(name=args.name, record=not args.no_record, token_delay_s=args.token_delay)
    if args.script:
        with open(args.script, encoding="utf-8") as f:
            spec = json.load(f)
        state.script = [[int(t) for t in turn] for turn in spec["turns"]]
        state.script_marker = spec.get("marker")
    try:  # the fake worker is a benchmark baseline's peer: as fast as it can be
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    web.run_app(FakeWorker(state).app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
