"""The service's HTTP/JSON front (aiohttp), for clients that do not speak ZeroMQ.

WHY aiohttp: a well-kept asynchronous server (no hand-written HTTP parsing); one event loop in
its own thread holds thousands of open requests while they wait in the scheduler, each as a
coroutine awaiting its Future, not a thread.

  POST /v1/answer   body {"request_id"?, "mode"?, "nodes": [{"id", "x"}], "edges"?: [[s, d]],
                    "deadline_ms"?} (bodies.AnswerBody: strict, an unknown key is refused naming it)
                    200 with the answers; 400 for a malformed request (the error names what is
                    wrong), 413 for one over the service's size or cost caps (or a body over
                    max_body_bytes); 503 with Retry-After when the queue (requests or bytes) is
                    full, the request could not meet its deadline (admission.py; Retry-After: the
                    predicted wait), too many bodies wait to be parsed, or the service is stopping;
                    504 with Retry-After when the request waited in the queue past its deadline or
                    the request timeout or
                    its batch ran past the batch deadline (the server's limits: retry later); 500
                    when its batch failed on a worker; 401 without the token
  POST /v1/score    body {"pairs": [[src, dst]], "relations"?, "nodes"?, "edges"?, ...}: decoder
                    scores of the pairs from the served embeddings; POST /v1/topk body {"sources",
                    "k", "relation"?, "nodes"?, ...}: each source's k best vertices (linkpred.py;
                    400 for a malformed body, 413 over its caps, the query nodes' own outcome else)
  GET  /metrics     the service's metrics in Prometheus' text format (stats.py), behind the
                    inference token as /v1/health, or the admin token with metrics_auth "admin"
  GET  /v1/health   {"status": "ok", "stats": counters, "version": the version served (Server.version_info:
                    number, graph fingerprint, swaps, draining) -- never its graph or store paths,
                    which would show any client of a token-less service the host's layout
  POST /v1/admin/swap  body {"graph": DIR, "store"?: PATH, "timeout_s"?: S in [1, 86400]}
                    (bodies.SwapBody): both paths must lie under the config's swap_roots
                    (Server.check_swap_paths), then Server.swap, run off the event loop (answers
                    keep flowing meanwhile); 200 with the swap's report, 409 when the swap is
                    refused (the old version still serving; a path outside the roots and a
                    missing one get the same words), 400 for a malformed body, 401 without the
                    admin token, 403 when the service has no admin token

With a token configured every inference request must carry `Authorization: Bearer <token>`
(compared in constant time). Admin operations need the ADMIN token, a different one: a service
started without one refuses them, and the inference token never opens them, since a swap makes
the service read and serve the paths it is given. Bodies above `max_body_bytes` are refused by
aiohttp itself (413).

Answer bodies are decoded and validated (bodies.decode_answer, Server.submit) off the event loop,
on the service's parse pool (serving.online.parsing: `parse_threads` threads, shared with the
ZeroMQ front); at most `parse_queue` requests wait for them, and one more is answered 503 with
Retry-After at once, so one large body never stalls the other clients and a flood of them never
queues without bound. With `tls` (a certificate chain and its key, PEM) the front serves HTTPS
(the ssl module; TLS 1.2 at least), which a non-loopback bind needs.

WHY replies through orjson (json_reply), not the json module: an answer's `h` rows are numpy
views of its batch's answer (wire.BatchAnswers, read into numpy once per batch), which orjson
writes in C; the json module needs every value turned into a Python float first, which was most
of the front's time per answer. Bodies are read by msgspec (bodies.py), which validates as it
decodes.

Connections are bounded in time: one idle (no request, or a request line or headers never
finished) is closed after `idle_timeout_s` (aiohttp's keep-alive timer), and a body not received
within `idle_timeout_s` is answered 408 and its connection closed, so a client that sends half a
body holds nothing for long. A client that resets its connection mid-body is logged as one line
(not a traceback), at most one line per `RESET_LOG_EVERY_S` with the count of resets since.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import math
import ssl
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from sparkgnn.errors import USER_ERRORS
from sparkgnn.serving.online.bodies import BodyError, check_swap_timeout, decode_answer, decode_swap, request_of
from sparkgnn.serving.online.linkpred import LinkRefused, LinkService
from sparkgnn.serving.online.parsing import INLINE_BYTES, ParsePool
from sparkgnn.serving.request import Request

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
IDLE_TIMEOUT_S = 30.0
RESET_LOG_EVERY_S = 10.0
HEALTH_HIDDEN = ("graph", "store")  # Version.describe keys /v1/health leaves out: host paths
# Outcome.kind -> HTTP status; the server's own limits (busy, stopping, timeout) are 5xx with
# Retry-After, the client's mistakes ("error") 400
STATUS = {"ok": 200, "error": 400, "too_large": 413, "busy": 503, "stopping": 503, "timeout": 504, "failed": 500}
RETRY_AFTER_S = {"busy": 1, "stopping": 5, "timeout": 1}
# orjson: numpy arrays and scalars as JSON; non-str keys (ints) as strings, as the json module writes them
JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS

if TYPE_CHECKING:
    from aiohttp import web


class HttpFront:
    def __init__(
        self,
        server,
        bind: str,
        token: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        *,
        admin_token: str | None = None,
        tls: tuple[str, str] | None = None,
        parse_threads: int = 2,
        parse_queue: int = 64,
        metrics_auth: str = "inference",
        parse_pool: ParsePool | None = None,
        reuse_port: bool = False,
        unix_path: str | None = None,
    ):
        """`parse_pool`: the threads that decode and validate bodies (the Server shares its own
        with the ZeroMQ front, and shuts it down); None: one of `parse_threads` threads and
        `parse_queue` waiting of the front's own, shut down by stop(). `reuse_port`: bind with
        SO_REUSEPORT, beside the front processes (fronts.py) listening on the same port;
        `unix_path`: also serve on this Unix socket, where those processes pass the paths they
        do not serve themselves."""
        from sparkgnn.serving.online.config import split_http_bind

        host, port = split_http_bind(bind)
        self.server, self.host, self.port, self.token = server, host, port, token
        self.admin_token = admin_token
        self.metrics_auth = metrics_auth  # "inference" (as /v1/health) or "admin"
        self.max_body_bytes = max_body_bytes
        self.idle_timeout_s = float(idle_timeout_s)
        self.ssl_context = server_ssl_context(*tls) if tls else None
        self.reuse_port, self.unix_path = reuse_port, unix_path
        self._owns_pool = parse_pool is None
        self.parse_pool = parse_pool if parse_pool is not None else ParsePool(int(parse_threads), int(parse_queue))
        self.resets = ResetLog(RESET_LOG_EVERY_S)
        self.link = LinkService(server)  # /v1/score and /v1/topk
        # the HTTP response of an Outcome (a typed service's front gives its own JSON form)
        self.respond: Callable[[Any], web.Response] = outcome_response
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
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
        app.router.add_post("/v1/score", functools.partial(self._link, "score"))
        app.router.add_post("/v1/topk", functools.partial(self._link, "topk"))
        app.router.add_get("/v1/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/admin/swap", self._swap)
        # idle connections, and the unread rest of a refused body, wait at most idle_timeout_s
        runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=self.idle_timeout_s, lingering_time=self.idle_timeout_s
        )
        await runner.setup()
        self._runner = runner
        site = web.TCPSite(
            runner, self.host, self.port, ssl_context=self.ssl_context, reuse_port=self.reuse_port or None
        )
        await site.start()
        if self.unix_path:
            await web.UnixSite(runner, self.unix_path).start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # the bound port (0 = any)
        self.url = f"{'https' if self.ssl_context else 'http'}://{self.host}:{port}"

    def _authorised(self, request, admin: bool = False) -> bool:
        """Whether `request` carries `Bearer <token>` (the inference token unless `admin`); no
        inference token configured lets every inference request through, never an admin one."""
        token = self.admin_token if admin else self.token
        if not token:
            return not admin
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    async def _body(self, request):
        """The request's body, or the response refusing it: 408 (and the connection closed) when
        it does not arrive within idle_timeout_s; None with one rate-limited log line when the
        client reset the connection mid-body (there is no one to answer)."""
        try:
            return await asyncio.wait_for(request.read(), self.idle_timeout_s)
        except asyncio.TimeoutError:
            response = json_reply(
                {"status": "error", "error": f"the body did not arrive within {self.idle_timeout_s:g} s"}, status=408
            )
            response.force_close()
            return response
        except ConnectionError as exc:
            self.resets.note(request.remote, exc)
            return None

    async def _answer(self, request):
        from aiohttp import web

        if not self._authorised(request):
            return json_reply({"status": "error", "error": "missing or wrong bearer token"}, status=401)
        body = await self._body(request)
        if not isinstance(body, bytes):
            return body if body is not None else web.Response(status=400)
        if len(body) <= INLINE_BYTES:  # parsed here: less than a hand-off to a parse thread (parsing.py)
            try:
                outcome = await asyncio.wrap_future(self._parse_and_submit(body))
            except USER_ERRORS as exc:
                self.server.count_refusal()
                return json_reply({"status": "error", "error": str(exc)}, status=400)
            return self.respond(outcome)
        parsing = self.parse_pool.try_submit(self._parse_and_submit, body)
        if parsing is None:
            self.server.count_refusal()
            return json_reply(
                {"status": "busy", "error": "too many request bodies are waiting to be parsed; retry later"},
                status=503,
                headers={"Retry-After": str(RETRY_AFTER_S["busy"])},
            )
        try:
            submitted = await asyncio.wrap_future(parsing)
        except USER_ERRORS as exc:
            self.server.count_refusal()
            return json_reply({"status": "error", "error": str(exc)}, status=400)
        outcome = await asyncio.wrap_future(submitted)
        return self.respond(outcome)

    async def _link(self, op: str, request):
        """POST /v1/score and /v1/topk (linkpred.py): the body checked and its query nodes queued
        on the parse pool, their Outcome awaited, then the scores computed on the parse pool."""
        from aiohttp import web

        if not self._authorised(request):
            return json_reply({"status": "error", "error": "missing or wrong bearer token"}, status=401)
        body = await self._body(request)
        if not isinstance(body, bytes):
            return body if body is not None else web.Response(status=400)
        try:
            job = await self._on_parse_pool(self.link.prepare, op, body)
            if job is None:
                return _parse_busy()
            outcome = await asyncio.wrap_future(job.queries) if job.queries is not None else None
            finished = await self._on_parse_pool(job.finish, outcome)
            if finished is None:
                return _parse_busy()
        except LinkRefused as exc:
            self.server.count_refusal()
            return json_reply({"status": exc.kind, "error": str(exc)}, status=STATUS[exc.kind])
        except USER_ERRORS as exc:
            self.server.count_refusal()
            return json_reply({"status": "error", "error": str(exc)}, status=400)
        kind, reply = finished
        headers = {"Retry-After": str(RETRY_AFTER_S[kind])} if kind in RETRY_AFTER_S else None
        return json_reply(reply, status=STATUS.get(kind, 500), headers=headers)

    async def _on_parse_pool(self, fn, *args):
        """fn(*args) on the parse pool, awaited; None when the pool's queue is full."""
        running = self.parse_pool.try_submit(fn, *args)
        if running is None:
            self.server.count_refusal()
            return None
        return await asyncio.wrap_future(running)

    def _parse_and_submit(self, body: bytes):
        """On a parse thread: decode the body, then Server.submit (which validates and queues it);
        the Future of its Outcome."""
        parsed = decode_answer(body)
        return self.server.submit(request_of(parsed), parsed.mode, deadline_ms=parsed.deadline_ms)

    async def _health(self, request):
        if not self._authorised(request):
            return json_reply({"status": "error", "error": "missing or wrong bearer token"}, status=401)
        version = {k: v for k, v in self.server.version_info().items() if k not in HEALTH_HIDDEN}
        return json_reply({"status": "ok", "stats": dict(self.server.stats), "version": version})

    async def _metrics(self, request):
        """The service's metrics in Prometheus' text format (stats.ServiceMetrics), behind the
        inference token (as /v1/health) or, with metrics_auth "admin", the admin token."""
        from aiohttp import web

        from sparkgnn.serving.online.stats import CONTENT_TYPE

        admin = self.metrics_auth == "admin"
        if admin and not self.admin_token:
            return json_reply(
                {"status": "error", "error": "metrics_auth is 'admin' but the service has no admin token"}, status=403
            )
        if not self._authorised(request, admin=admin):
            which = "admin " if admin else ""
            return json_reply({"status": "error", "error": f"missing or wrong {which}bearer token"}, status=401)
        return web.Response(body=self.server.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def _swap(self, request):
        from aiohttp import web

        from sparkgnn.serving.online.server import SwapRefused

        if not self.admin_token:
            return json_reply(
                {
                    "status": "error",
                    "error": "admin operations need an admin token: start the service with --admin-token-file "
                    "(or SPARKGNN_SERVE_ADMIN_TOKEN)",
                },
                status=403,
            )
        if not self._authorised(request, admin=True):
            return json_reply({"status": "error", "error": "missing or wrong admin bearer token"}, status=401)
        body = await self._body(request)
        if not isinstance(body, bytes):
            return body if body is not None else web.Response(status=400)
        try:
            graph, store, timeout_s = swap_from_json(body)
        except BodyError as exc:
            return json_reply({"status": "error", "error": str(exc)}, status=400)
        loop = asyncio.get_running_loop()

        def checked_swap() -> dict:
            real_graph, real_store = self.server.check_swap_paths(graph, store)
            return self.server.swap(real_graph, real_store, timeout_s=timeout_s)

        try:
            report = await loop.run_in_executor(None, checked_swap)
        except SwapRefused as exc:
            return json_reply({"status": "error", "error": str(exc)}, status=409)
        return json_reply({"status": "ok", "swap": report})

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
        if self._owns_pool:
            self.parse_pool.shutdown()


def _parse_busy():
    return json_reply(
        {"status": "busy", "error": "too many request bodies are waiting to be parsed; retry later"},
        status=503,
        headers={"Retry-After": str(RETRY_AFTER_S["busy"])},
    )


def server_ssl_context(cert: str, key: str) -> ssl.SSLContext:
    """The HTTPS context of the front: the PEM certificate chain `cert` and its key `key`, TLS 1.2
    at least; ServeError (one line) when they cannot be loaded."""
    from sparkgnn.serving.online.pools import ServeError

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ServeError(f"TLS certificate {cert} / key {key}: cannot be loaded ({exc})") from None
    return context


class ResetLog:
    """One log line per connection reset mid-body, at most one per `every_s` seconds; the
    line after a quiet spell counts the resets it stood for (2,000 clients that disconnect
    mid-body make a few lines, not 2,000 tracebacks)."""

    def __init__(self, every_s: float):
        self.every_s = float(every_s)
        self.count = 0  # resets seen in all
        self._suppressed = 0
        self._last = -float("inf")
        self._lock = threading.Lock()

    def note(self, remote: str | None, exc: BaseException) -> None:
        with self._lock:
            self.count += 1
            now = time.monotonic()
            if now - self._last < self.every_s:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        more = f" ({suppressed} more since the last such line)" if suppressed else ""
        log.warning("sparkgnn-serve: client %s reset the connection mid-body (%s)%s", remote, exc, more)


def outcome_response(outcome, to_json=None):
    """The HTTP response of an Outcome: its JSON (`to_json`, default outcome_json), the status of
    its kind (STATUS) and, for the server's own limits, Retry-After."""
    retry = getattr(outcome, "retry_after_s", None)
    if outcome.kind in RETRY_AFTER_S:
        headers = {"Retry-After": str(math.ceil(retry) if retry else RETRY_AFTER_S[outcome.kind])}
    else:
        headers = None
    body = outcome_json(outcome) if to_json is None else to_json(outcome)
    return json_reply(body, status=STATUS.get(outcome.kind, 500), headers=headers)


def json_reply(data, *, status: int = 200, headers: dict | None = None) -> web.Response:
    """`data` as a JSON response (application/json), encoded by orjson: numpy arrays and scalars
    are written as JSON arrays and numbers in C (float32 rows in float32's shortest form, which
    reads back to the same float32), with no per-value Python conversion."""
    from aiohttp import web

    return web.json_bytes_response(data, dumps=_dumps, status=status, headers=headers)


def _dumps(data) -> bytes:
    return orjson.dumps(data, option=JSON_OPTIONS)


def outcome_json(outcome) -> dict:
    """The HTTP/JSON form of an Outcome, for json_reply: each answer's `h` is a numpy row view of
    its batch's answer (wire.AnswerRows), so building it costs a dict per query node and no
    conversion of the values."""
    body: dict = {"request_id": outcome.request_id, "status": outcome.kind}
    if outcome.error:
        body["error"] = outcome.error
    if outcome.answer is not None:
        nodes, h, pred = outcome.answer.arrays()
        if pred is None:
            body["answers"] = [{"node": n, "h": row} for n, row in zip(nodes.tolist(), h, strict=True)]
        else:
            body["answers"] = [
                {"node": n, "h": row, "pred": p} for n, row, p in zip(nodes.tolist(), h, pred.tolist(), strict=True)
            ]
        body["queue_ms"] = outcome.queue_s * 1e3
        body["service_ms"] = outcome.service_s * 1e3
        body["batch_requests"] = outcome.batch_requests
        body["pool"] = outcome.pool
        body["version"] = outcome.version
    return body


def swap_from_json(body: bytes) -> tuple[str, str | None, float]:
    """A swap body (bodies.SwapBody) -> (graph, store, timeout_s); BodyError names what is wrong."""
    swap = decode_swap(body)
    return swap.graph, swap.store, check_swap_timeout(swap.timeout_s)


def request_from_json(body: bytes) -> tuple[Request, str | None]:
    """An answer body (bodies.AnswerBody) -> (Request, mode or None); BodyError (a RequestError)
    names an unknown key with the expected ones, a wrong type and where, or a malformed body."""
    parsed = decode_answer(body)
    return request_of(parsed), parsed.mode
