"""Extra HTTP front processes (ServeConfig.fronts): intake not bound to one GIL.

    clients --HTTP--> port P (SO_REUSEPORT: the kernel spreads connections over every listener)
                        |-- the service process's own HttpFront ------------------> Server.submit
                        |-- front process 1..N-1: HTTP, JSON, validation, answer JSON
                              --ZeroMQ DEALER, packed frames--> relay ZmqFront --> Server.submit

WHY processes: a front spends most of a small request's time in Python (HTTP parsing, JSON,
building the Request, writing the answer's JSON); in one process that work shares one GIL with
the scheduler and dispatch threads, so intake caps the service's rate whatever the pools could
do. Each extra front does that work in its own interpreter and hands the service only what the
ZeroMQ front already reads: the messenger's frames, a JSON header and the request packed as one
buffer (wire.pack_request: the service takes numpy views of it, no Arrow stream to read per
request; never pickle), answered packed the same way. The service process keeps scheduling,
admission and the pools, so a request is queued, admitted, capped (max_queries, max_edges,
max_cost) and answered exactly as through its own front.

The channel between them is local and authenticated by the file system: the relay's ipc socket
and the service front's Unix socket lie in a folder only the service's user can enter (0700,
tempfile.mkdtemp), as the worker pools' ipc transport. A front process checks the inference token
of /v1/answer itself (constant time) and serves TLS with the same certificate; every other path
(/v1/health, /metrics, /v1/score, /v1/topk, /v1/admin/swap) is passed, headers and body as they
came, to the service process's own HttpFront over its Unix socket, which applies its own token
checks, so no path answers differently by the listener the kernel picked.

A front process reads its settings (tokens included, never on its command line) as one JSON line
on stdin and keeps stdin open: when the service process ends, however it ends, the pipe closes
and the front exits. A front process that dies while the service runs is logged and restarted
(up to MAX_RESTARTS times; beyond, the service logs that it runs with fewer fronts), and counted
in the service's stats (`front_restarts`, `front_deaths`). stop() closes the pipes, waits up to
STOP_WAIT_S per process, then kills it.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

RELAY_NAME = "relay"  # the relay ZmqFront's ipc socket in the fronts' folder
PROXY_NAME = "http.sock"  # the service HttpFront's Unix socket there
START_WAIT_S = 30.0
STOP_WAIT_S = 5.0
MAX_RESTARTS = 5
FRONT_HEADER = "X-Sparkgnn-Front"  # which front process answered (1..N-1; the service's own sets none)
# a relayed reply without the service's outcome kind (refused before Server.submit): its HTTP kind
RELAY_KINDS = {"RESULT": "ok", "BUSY": "busy", "ERROR": "error"}


def reuse_port_refusal() -> str | None:
    """Why several listeners cannot share one port here (None: they can): no SO_REUSEPORT in the
    socket module, or a kernel that refuses the option."""
    option = getattr(socket, "SO_REUSEPORT", None)
    if option is None:
        return "this platform's socket module has no SO_REUSEPORT"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, option, 1)
    except OSError as exc:
        return f"the kernel refuses SO_REUSEPORT ({exc})"
    return None


@dataclass(frozen=True)
class FrontSettings:
    """What a front process needs, sent as one JSON line on its stdin (tokens stay off `ps`)."""

    index: int
    host: str
    port: int
    relay: str  # ipc:// endpoint of the service's relay ZmqFront
    proxy: str  # path of the service HttpFront's Unix socket
    token: str | None
    tls_cert: str | None
    tls_key: str | None
    max_body_bytes: int
    idle_timeout_s: float
    reply_timeout_s: float  # a relayed request unanswered this long: 504 (the service is stuck)


def fronts_folder() -> str:
    """A new folder only this user may enter (0700), for the relay's and the proxy's sockets."""
    folder = tempfile.mkdtemp(prefix="sparkgnn-fronts-")
    os.chmod(folder, 0o700)
    return folder


class FrontProcesses:
    """The service's extra front processes: started, watched (a death is logged, counted in
    `stats` and restarted up to MAX_RESTARTS times) and stopped."""

    def __init__(self, settings: list[FrontSettings], *, stats: dict, lock: threading.Lock):
        self.settings = settings
        self.stats, self._lock = stats, lock
        self.procs: dict[int, subprocess.Popen] = {}
        self.restarts = 0
        self._stopping = threading.Event()
        self._watchers: list[threading.Thread] = []
        with lock:
            stats["front_processes"] = len(settings)
            stats["front_deaths"] = 0
            stats["front_restarts"] = 0

    def start(self) -> FrontProcesses:
        """Start every front process and wait until each listens (they start side by side);
        ServeError (one line) when one does not within START_WAIT_S (those started are stopped)."""
        try:
            started = [(setting, self._spawn(setting)) for setting in self.settings]
            for setting, proc in started:
                self._await_ready(setting, proc)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, setting: FrontSettings) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sparkgnn.serving.online.fronts"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self.procs[setting.index] = proc
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(asdict(setting)).encode() + b"\n")
        proc.stdin.flush()
        return proc

    def _await_ready(self, setting: FrontSettings, proc: subprocess.Popen) -> None:
        """Wait for the process's "ready" line, then watch it."""
        from sparkgnn.serving.online.pools import ServeError

        assert proc.stdout is not None
        line = _read_line(proc.stdout, START_WAIT_S)
        if line.strip() != b"ready":
            proc.kill()
            proc.wait(timeout=STOP_WAIT_S)
            raise ServeError(
                f"front process {setting.index} did not start within {START_WAIT_S:g} s "
                f"(exit code {proc.returncode}; its log is on stderr)"
            )
        watcher = threading.Thread(
            target=self._watch, args=(setting, proc), name=f"sparkgnn-serve-front-{setting.index}", daemon=True
        )
        watcher.start()
        self._watchers.append(watcher)

    def _watch(self, setting: FrontSettings, proc: subprocess.Popen) -> None:
        """Blocks on the process (no polling); a death while serving is logged, counted and
        restarted while restarts are left."""
        code = proc.wait()
        if self._stopping.is_set():
            return
        with self._lock:
            self.stats["front_deaths"] += 1
        if self.restarts >= MAX_RESTARTS:
            log.error(
                "sparkgnn-serve: front process %d exited (code %s); not restarted (%d restarts already): "
                "serving with %d of %d fronts",
                setting.index,
                code,
                self.restarts,
                sum(p.poll() is None for p in self.procs.values()) + 1,
                len(self.settings) + 1,
            )
            return
        log.error("sparkgnn-serve: front process %d exited (code %s); restarting it", setting.index, code)
        if self._stopping.is_set():  # stop() began meanwhile: nothing to restart
            return
        self.restarts += 1
        with self._lock:
            self.stats["front_restarts"] = self.restarts
        try:
            self._await_ready(setting, self._spawn(setting))
        except Exception as exc:  # noqa: BLE001 - logged: the service keeps serving on its other fronts
            log.error("sparkgnn-serve: front process %d could not be restarted: %s", setting.index, exc)

    def alive(self) -> int:
        """How many front processes run now."""
        return sum(proc.poll() is None for proc in self.procs.values())

    def stop(self) -> None:
        """Close each process's stdin (it exits), wait up to STOP_WAIT_S, then kill it."""
        self._stopping.set()
        procs = list(self.procs.values())
        for proc in procs:
            if proc.stdin is None:
                continue
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_WAIT_S)
            if proc.stdout is not None:
                proc.stdout.close()
        for watcher in self._watchers:
            watcher.join(timeout=STOP_WAIT_S)


def _read_line(stream, timeout_s: float) -> bytes:
    """One line of `stream` (a pipe), b"" when none arrives within timeout_s or it closes."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return b""
    return stream.readline()


def remove_folder(folder: str | None) -> None:
    """Remove the fronts' folder (its sockets) when the service stops."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


# -- inside a front process ------------------------------------------------------------------


class RelayedOutcome:
    """A relayed reply read back as intake.Outcome's fields, so http_front.outcome_response writes
    the same JSON, status and Retry-After as the service's own front."""

    def __init__(self, header: dict, tables: dict, packed_answer: tuple | None = None):
        """`tables`: the reply's Arrow tables (its `answer`), or `packed_answer`: the (node ids, h,
        pred) arrays of a packed reply (wire.unpack_answer)."""
        from sparkgnn.serving.online import wire

        self.request_id = header.get("request_id")
        self.kind = header.get("status") or RELAY_KINDS.get(str(header.get("kind")), "failed")
        self.error = header.get("error")
        self.queue_s = float(header.get("queue_ms") or 0.0) / 1e3
        self.service_s = float(header.get("service_ms") or 0.0) / 1e3
        self.batch_requests = header.get("batch_requests") or 0
        self.pool = header.get("pool") or ""
        self.version = header.get("version") or 0
        self.retry_after_s = header.get("retry_after_s")
        table = tables.get("answer")
        if packed_answer is not None:
            self.answer: _Answer | None = _Answer(packed_answer)
        else:
            self.answer = None if table is None else _Answer(wire.answer_arrays(table))


class _Answer:
    """The relayed answer's (node ids, h, pred) arrays, as wire.AnswerRows.arrays gives them."""

    __slots__ = ("_arrays",)

    def __init__(self, arrays):
        self._arrays = arrays

    def arrays(self):
        return self._arrays


class FrontApp:
    """One front process's aiohttp application: /v1/answer relayed as the messenger's frames, the
    rest proxied to the service's own front."""

    def __init__(self, settings: FrontSettings):
        self.settings = settings
        self._tags = itertools.count()
        self._waiting: dict[Any, asyncio.Future] = {}  # by the tag the request was sent with
        self._sock: Any = None  # the DEALER to the relay (zmq.asyncio), once started
        self._session: Any = None  # the aiohttp client of the service front's Unix socket

    async def start(self) -> Any:
        """Connect the relay, listen on the shared port; the aiohttp AppRunner (cleaned up at exit)."""
        import zmq
        import zmq.asyncio
        from aiohttp import ClientSession, UnixConnector, web

        from sparkgnn.serving.online.http_front import server_ssl_context

        s = self.settings
        context = zmq.asyncio.Context()
        sock = self._sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(s.relay)
        self._reader = asyncio.get_running_loop().create_task(self._read_replies())
        self._session = ClientSession(connector=UnixConnector(path=s.proxy), auto_decompress=False)
        app = web.Application(client_max_size=s.max_body_bytes)
        app.router.add_post("/v1/answer", self._answer)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=s.idle_timeout_s, lingering_time=s.idle_timeout_s
        )
        await runner.setup()
        tls = server_ssl_context(s.tls_cert, s.tls_key) if s.tls_cert and s.tls_key else None
        await web.TCPSite(runner, s.host, s.port, ssl_context=tls, reuse_port=True).start()
        return runner

    async def _read_replies(self) -> None:
        """The relay's replies, each handed to the request awaiting its tag; a reply that cannot be
        read is logged and its request answered 500 (the reader goes on)."""
        from sparkgnn.messenger import protocol
        from sparkgnn.serving.online import wire

        while True:
            frames = await self._sock.recv_multipart(copy=False)
            header: dict = {}
            try:
                header = protocol.peek_header(frames)
                packed = header.get(wire.PACKED)
                if packed is None:
                    outcome = RelayedOutcome(*protocol.decode(frames))
                else:
                    arrays = wire.unpack_answer(packed, wire.packed_payload(header, frames[1:]))
                    outcome = RelayedOutcome(header, {}, arrays)
            except Exception as exc:  # noqa: BLE001 - one bad reply must not end the reader
                log.error("sparkgnn-serve front %d: an unreadable relay reply (%s)", self.settings.index, exc)
                outcome = RelayedOutcome({"status": "failed", "error": "the service's reply could not be read"}, {})
            waiting = self._waiting.pop(header.get("tag"), None)
            if waiting is not None and not waiting.done():
                waiting.set_result(outcome)

    async def _answer(self, request):
        from sparkgnn.errors import USER_ERRORS
        from sparkgnn.serving.online import wire
        from sparkgnn.serving.online.bodies import decode_answer, request_of
        from sparkgnn.serving.online.http_front import json_reply, outcome_response

        headers = {FRONT_HEADER: str(self.settings.index)}
        token = self.settings.token
        if token and not hmac.compare_digest(
            request.headers.get("Authorization", "").encode(), f"Bearer {token}".encode()
        ):
            return json_reply(
                {"status": "error", "error": "missing or wrong bearer token"}, status=401, headers=headers
            )
        try:
            body = await asyncio.wait_for(request.read(), self.settings.idle_timeout_s)
        except asyncio.TimeoutError:
            reply = json_reply(
                {"status": "error", "error": f"the body did not arrive within {self.settings.idle_timeout_s:g} s"},
                status=408,
            )
            reply.force_close()
            return reply
        try:
            parsed = decode_answer(body)
            req = request_of(parsed)
            counts, payload = wire.pack_request(req)
        except USER_ERRORS as exc:
            return json_reply({"status": "error", "error": str(exc)}, status=400, headers=headers)
        tag = next(self._tags)
        header: dict = {"kind": "TASK", "op": "answer", "tag": tag}
        if parsed.request_id is not None:
            header["request_id"] = parsed.request_id
        if parsed.mode is not None:
            header["mode"] = parsed.mode
        if parsed.deadline_ms is not None:
            header["deadline_ms"] = parsed.deadline_ms
        waiting = self._waiting[tag] = asyncio.get_running_loop().create_future()
        await self._sock.send_multipart([b"", *wire.packed_frames(header, "TASK", counts, payload)], copy=False)
        try:
            outcome = await asyncio.wait_for(waiting, self.settings.reply_timeout_s)
        except asyncio.TimeoutError:
            self._waiting.pop(tag, None)
            return json_reply(
                {"status": "timeout", "error": "the service did not answer in time; retry later"},
                status=504,
                headers={**headers, "Retry-After": "1"},
            )
        response = outcome_response(outcome)
        response.headers[FRONT_HEADER] = headers[FRONT_HEADER]
        return response

    async def _proxy(self, request):
        from aiohttp import web

        forwarded = {k: v for k, v in request.headers.items() if k in ("Authorization", "Content-Type")}
        body = await request.read() if request.can_read_body else None
        async with self._session.request(
            request.method, f"http://service{request.path_qs}", headers=forwarded, data=body
        ) as upstream:
            data = await upstream.read()
            kept = {k: v for k, v in upstream.headers.items() if k in ("Content-Type", "Retry-After")}
            kept[FRONT_HEADER] = str(self.settings.index)
            return web.Response(body=data, status=upstream.status, headers=kept)


def main() -> int:
    """A front process: settings from stdin's first line, then serve until stdin closes."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = FrontSettings(**json.loads(sys.stdin.buffer.readline()))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    front = FrontApp(settings)
    runner = loop.run_until_complete(front.start())
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    closed = asyncio.Event()
    # the service's end (stop(), or its death): stdin reaches EOF
    threading.Thread(
        target=lambda: (sys.stdin.buffer.read(), loop.call_soon_threadsafe(closed.set)), daemon=True
    ).start()
    loop.run_until_complete(closed.wait())
    loop.run_until_complete(runner.cleanup())
    if front._session is not None:
        loop.run_until_complete(front._session.close())
    return 0


if __name__ == "__main__":
    sys.exit(main())
