"""The service's HTTP/JSON front (aiohttp), for clients that do not speak ZeroMQ.

WHY aiohttp: a well-kept asynchronous server (no hand-written HTTP parsing); one event loop in
its own thread holds thousands of open requests while they wait in the scheduler, each as a
coroutine awaiting its Future, not a thread.

  POST /v1/answer   body {"request_id", "mode"?, "nodes": [{"id", "x"}], "edges": [[s, d]]}
                    200 with the answers; 400 for a malformed request (the error names what is
                    wrong); 503 when the queue is full ("busy", retry later); 401 without the token
  GET  /v1/health   {"status": "ok", "stats": ..., "version": the version served (Server.version_info)}
  POST /v1/admin/swap  body {"graph": DIR, "store"?: PATH, "timeout_s"?: S}: Server.swap, run off
                    the event loop (answers keep flowing meanwhile); 200 with the swap's report,
                    409 when the swap is refused (the old version still serving), 400 for a
                    malformed body, 403 when the service has no token

With a token configured every request must carry `Authorization: Bearer <token>` (compared in
constant time). Admin operations always need the token: a service started without one (loopback,
where answering needs none) refuses them, since a swap makes the service read and serve whatever
paths it is given. Bodies above `max_body_bytes` are refused by aiohttp itself (413).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading

import numpy as np

from sparkgnn.errors import USER_ERRORS
from sparkgnn.serving.online import wire
from sparkgnn.serving.request import Request, RequestError

MAX_BODY_BYTES = 64 * 1024 * 1024
STATUS = {"ok": 200, "error": 400, "busy": 503}


class HttpFront:
    def __init__(self, server, bind: str, token: str | None = None, max_body_bytes: int = MAX_BODY_BYTES):
        host, port = bind.rsplit(":", 1)
        self.server, self.host, self.port, self.token = server, host, int(port), token
        self.max_body_bytes = max_body_bytes
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: object | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> HttpFront:
        ready = threading.Event()
        failure: list = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name="sparkgnn-serve-http", daemon=True
        )
        self._thread.start()
        if not ready.wait(15.0):
            raise TimeoutError("the HTTP front did not start within 15 s")
        if failure:
            raise failure[0]
        return self

    def _run(self, ready: threading.Event, failure: list) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except Exception as exc:  # noqa: BLE001 - reported to start()
            failure.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()

    async def _serve(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/v1/answer", self._answer)
        app.router.add_get("/v1/health", self._health)
        app.router.add_post("/v1/admin/swap", self._swap)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # the bound port (0 = any)
        self.url = f"http://{self.host}:{port}"

    def _authorised(self, request) -> bool:
        if not self.token:
            return True
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode())

    async def _answer(self, request):
        from aiohttp import web

        if not self._authorised(request):
            return web.json_response({"status": "error", "error": "missing or wrong bearer token"}, status=401)
        try:
            body = json.loads(await request.read())
            query, mode = request_from_json(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return web.json_response({"status": "error", "error": f"the body is not JSON: {exc}"}, status=400)
        except USER_ERRORS as exc:
            return web.json_response({"status": "error", "error": str(exc)}, status=400)
        outcome = await asyncio.wrap_future(self.server.submit(query, mode))
        return web.json_response(outcome_json(outcome), status=STATUS.get(outcome.kind, 500))

    async def _health(self, request):
        from aiohttp import web

        if not self._authorised(request):
            return web.json_response({"status": "error", "error": "missing or wrong bearer token"}, status=401)
        return web.json_response(
            {"status": "ok", "stats": dict(self.server.stats), "version": self.server.version_info()}
        )

    async def _swap(self, request):
        from aiohttp import web

        from sparkgnn.serving.online.server import SwapRefused

        if not self.token:
            return web.json_response(
                {
                    "status": "error",
                    "error": "admin operations need a bearer token: start the service with --token",
                },
                status=403,
            )
        if not self._authorised(request):
            return web.json_response({"status": "error", "error": "missing or wrong bearer token"}, status=401)
        try:
            body = json.loads(await request.read())
            graph, store, timeout_s = swap_from_json(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return web.json_response({"status": "error", "error": f"the body is not JSON: {exc}"}, status=400)
        except ValueError as exc:
            return web.json_response({"status": "error", "error": str(exc)}, status=400)
        loop = asyncio.get_running_loop()
        try:
            report = await loop.run_in_executor(None, lambda: self.server.swap(graph, store, timeout_s=timeout_s))
        except SwapRefused as exc:
            return web.json_response({"status": "error", "error": str(exc)}, status=409)
        return web.json_response({"status": "ok", "swap": report})

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown():
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10.0)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def outcome_json(outcome) -> dict:
    """The HTTP/JSON form of an Outcome."""
    body: dict = {"request_id": outcome.request_id, "status": outcome.kind}
    if outcome.error:
        body["error"] = outcome.error
    if outcome.answer is not None:
        nodes, h, pred = wire.answer_arrays(outcome.answer)
        body["answers"] = [
            {"node": int(n), "h": row.tolist(), **({"pred": int(pred[i])} if pred is not None else {})}
            for i, (n, row) in enumerate(zip(nodes, h, strict=True))
        ]
        body["queue_ms"] = outcome.queue_s * 1e3
        body["service_ms"] = outcome.service_s * 1e3
        body["batch_requests"] = outcome.batch_requests
        body["pool"] = outcome.pool
        body["version"] = outcome.version
    return body


def swap_from_json(body) -> tuple[str, str | None, float]:
    """{"graph": DIR, "store"?: PATH, "timeout_s"?: seconds} -> (graph, store, timeout_s)."""
    if not isinstance(body, dict) or not isinstance(body.get("graph"), str) or not body["graph"]:
        raise ValueError('the body must be a JSON object with "graph": the new graph directory')
    store = body.get("store")
    if store is not None and (not isinstance(store, str) or not store):
        raise ValueError('"store" must be a PE store path (or left out: the current store\'s root)')
    timeout_s = body.get("timeout_s", 300.0)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise ValueError('"timeout_s" must be a positive number of seconds')
    unknown = sorted(set(body) - {"graph", "store", "timeout_s"})
    if unknown:
        raise ValueError(f"unknown swap settings {unknown}")
    return body["graph"], store, float(timeout_s)


def request_from_json(body: dict) -> tuple[Request, str | None]:
    """{"request_id", "mode"?, "nodes": [{"id", "x": [...]}], "edges": [[src, dst], ...]}."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    nodes = body.get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise RequestError('"nodes" must be a list of {"id": int, "x": [float, ...]} objects')
    edges = body.get("edges") or []
    if not isinstance(edges, list) or not all(isinstance(e, list | tuple) and len(e) == 2 for e in edges):
        raise RequestError('"edges" must be a list of [src, dst] pairs')
    try:
        qid = [n["id"] for n in nodes]
        x = [n["x"] for n in nodes]
    except KeyError as exc:
        raise RequestError(f"a node lacks {exc}") from None
    mode = body.get("mode")
    request = Request(
        str(body.get("request_id", "http")),
        np.asarray(qid) if qid else np.zeros(0, np.int64),
        x if x else np.zeros((0, 0), np.float32),  # type: ignore[arg-type]  # Request reports ragged rows
        np.asarray([e[0] for e in edges]) if edges else np.zeros(0, np.int64),
        np.asarray([e[1] for e in edges]) if edges else np.zeros(0, np.int64),
    )
    return request, (str(mode) if mode is not None else None)
