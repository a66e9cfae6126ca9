"""The service's ZeroMQ front: a ROUTER socket speaking the messenger's frames (JSON header +
Arrow tables `nodes`/`edges`, serving.online.wire), feeding `Server.submit`.

WHY one thread owns the socket: ZeroMQ sockets are not thread-safe, and answers are produced by
the dispatch threads. Each of those gets its own PUSH socket into an inproc pipe that this
thread drains into the ROUTER, so no lock sits on the reply path. Refusals made on the parse
threads (frames that are not the protocol, a table without the columns a request needs) take
the same pipe; the socket thread's own replies go straight to the ROUTER (it never waits on the
pipe it drains).
Requests may carry a `tag` the reply echoes (the load generator uses it).

Past capacity a request is refused on the socket thread from its header alone (a few
microseconds, no body parsed: Server.refuse_early) when the queue, with the messages this front
holds unparsed, already passes its deadline; so a refusal does not wait behind the parse queue.
Otherwise the socket thread only receives and sends: each message is decoded and validated (header,
Arrow tables, Server.submit's checks) on the service's parse pool (serving.online.parsing, the
threads the HTTP front parses on), so one large request does not stall the other clients. When
that pool's threads and queue are all taken, the message is answered BUSY at once (retry
later), read no further than its header (capped at protocol.MAX_HEADER_BYTES) for the
request_id and tag the reply echoes.

Headers are checked as strictly as the HTTP front's bodies (serving.online.bodies): a header key
or a table the protocol does not define is refused naming it and the expected ones (a misspelt
`"mode"` would otherwise be answered in the default mode), and each field must have its type.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time

import zmq

from sparkgnn.errors import USER_ERRORS
from sparkgnn.messenger import protocol
from sparkgnn.messenger.security import CLIENT, ServerAuth
from sparkgnn.serving.online import wire
from sparkgnn.serving.online.parsing import INLINE_BYTES, ParsePool
from sparkgnn.serving.request import RequestError

log = logging.getLogger(__name__)

# the header keys a request may carry: the messenger's own (protocol.stamp) and the service's
PROTOCOL_KEYS = frozenset({"v", "kind", "tables", "rows", "hash"})
REQUEST_KEYS: dict[str, tuple[type, ...]] = {
    "op": (str,),
    "request_id": (str,),
    "mode": (str,),
    "tag": (str, int, float),
    "deadline_ms": (int, float),
    wire.PACKED: (dict,),  # the packed layout's counts (wire.py): one payload frame, no tables
}
REQUEST_TABLES = ("nodes", "edges")
BUSY_RETRY_AFTER_S = 1.0  # a BUSY for a full parse pool: the HTTP front's Retry-After for it
PARSE_S_WEIGHT = 0.05  # of the latest message in the moving average of the seconds one takes to parse


def check_header(header: dict, tables: dict) -> None:
    """Refuse (RequestError) a request header with an unknown key or a field of the wrong type,
    and tables other than `nodes` and `edges`."""
    unknown = sorted(set(header) - PROTOCOL_KEYS - set(REQUEST_KEYS))
    if unknown:
        raise RequestError(
            f"unknown header key {unknown[0]!r}; expected one of: {', '.join(sorted(REQUEST_KEYS))} "
            "(and the messenger's own)"
        )
    if header.get("kind") != "TASK":
        raise RequestError(f"a request's header kind is 'TASK', got {header.get('kind')!r}")
    for key, types in REQUEST_KEYS.items():
        value = header.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise RequestError(f"header {key!r} has the wrong type: {type(value).__name__}")
    if header.get("op", "answer") != "answer":
        raise RequestError(f"header 'op' must be 'answer', got {header['op']!r}")
    extra = sorted(set(tables) - set(REQUEST_TABLES))
    if extra:
        raise RequestError(f"unknown table {extra[0]!r}; expected: {', '.join(REQUEST_TABLES)}")


class ZmqFront:
    def __init__(self, server, bind: str, curve_keys: str | None = None, *, parse_pool: ParsePool | None = None):
        """`parse_pool`: the threads that decode and validate requests (the Server shares its
        own with the HTTP front, and shuts it down); None: a default-sized one of the front's
        own, shut down when its socket thread ends."""
        self.server, self.bind, self.curve_keys = server, bind, curve_keys
        self._owns_pool = parse_pool is None
        self.parse_pool = parse_pool if parse_pool is not None else ParsePool()
        self.context: zmq.Context = zmq.Context.instance()
        self.endpoint: str | None = None
        self._reply_endpoint = f"inproc://sparkgnn-serve-replies-{id(self)}"
        self._pushers = threading.local()
        self._ids = itertools.count()
        self._auth: ServerAuth | None = None  # the allow-list (ZAP) of the CURVE front, closed with it
        self._sock: zmq.Socket | None = None  # the ROUTER, used by the socket thread only
        self._socket_thread: int | None = None
        # messages handed to the parse pool and not yet submitted, and the seconds one takes to
        # parse and submit (moving average): what an early refusal counts ahead of a request
        self._parsing = 0
        self._parsing_lock = threading.Lock()
        self.parse_s = 0.0

    def run(self, ready: threading.Event, stop: threading.Event) -> None:
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # a peer sending a larger message part is disconnected by libzmq before it is buffered
        # (the HTTP front's body limit, ServeConfig.max_body_bytes)
        sock.setsockopt(zmq.MAXMSGSIZE, int(self.server.config.max_body_bytes))
        if self.curve_keys:
            # Ironhouse: only clients listed in authorized_clients/ complete the handshake
            self._auth = ServerAuth(self.context, self.curve_keys)
            self._auth.secure(sock, CLIENT)
        try:
            self.endpoint = _bind(sock, self.bind)
        except BaseException:
            sock.close(0)
            if self._auth is not None:
                self._auth.close()
                self._auth = None
            raise
        self._sock, self._socket_thread = sock, threading.get_ident()
        replies = self.context.socket(zmq.PULL)
        replies.bind(self._reply_endpoint)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(replies, zmq.POLLIN)
        ready.set()
        try:
            while not stop.is_set():
                events = dict(poller.poll())  # blocks while idle: a message, a reply or wake() ends it
                if replies in events:
                    _drain(replies, lambda frames: sock.send_multipart(frames, copy=False) if len(frames) > 1 else None)
                if sock in events:
                    _drain(sock, self._on_message)
        finally:
            sock.close(0)
            replies.close(0)
            if self._auth is not None:
                self._auth.close()  # after its socket (a CURVE socket without a handler admits nobody)
                self._auth = None
            if self._owns_pool:
                self.parse_pool.shutdown()

    def wake(self) -> None:
        """End the socket thread's wait (stop(): it then sees the stop event): one empty frame
        on the reply pipe, which the thread drops. Never waits: where the frame cannot be queued
        the thread is awake already (its pipe holds frames) or gone (a reply that came after the
        stop event ended its loop and closed the pipe, which would block a send for ever)."""
        try:
            self._push().send(b"", flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def _on_message(self, frames) -> None:
        """On the socket thread: answer BUSY at once, from the header alone, when the queue
        already passes the request's deadline (Intake.refuse_early); else parse a small packed
        request here, hand any other to the parse pool, or answer BUSY when that pool is full."""
        identity, body = frames[0], frames[1:]
        if body and len(body[0]) == 0:  # a REQ-style empty delimiter
            body = body[1:]
        header = _header_or_empty(body)  # capped at MAX_HEADER_BYTES: microseconds
        try:
            if self._refused_early(identity, header):
                return
        except Exception:  # noqa: BLE001 - never the socket thread's end: the parse path decides instead
            log.exception("sparkgnn-serve: the early admission check failed; the request goes on to be parsed")
        with self._parsing_lock:
            self._parsing += 1
        if header.get(wire.PACKED) is not None and sum(len(f) for f in body) <= INLINE_BYTES:
            # a small packed request: numpy views and a few id lookups, cheaper here than a
            # hand-off to a parse thread (parsing.py)
            self._parse_and_submit(identity, body, header, time.monotonic())
            return
        if self.parse_pool.try_submit(self._parse_and_submit, identity, body, header, time.monotonic()) is not None:
            return
        with self._parsing_lock:
            self._parsing -= 1
        self.server.count_refusal()
        given, tag = header.get("request_id"), header.get("tag")
        reply = {
            "kind": "BUSY",
            "request_id": given if isinstance(given, str) else None,
            "error": "too many requests are waiting to be parsed; retry later",
            "retry_after_s": BUSY_RETRY_AFTER_S,
        }
        if isinstance(tag, str | int | float) and not isinstance(tag, bool):
            reply["tag"] = tag
        self._send(identity, reply, {})

    def _refused_early(self, identity, header: dict) -> bool:
        """On the socket thread: True when the queue already passes this request's deadline
        (Server.refuse_early, from its header alone), its BUSY sent from here at once."""
        if header.get("kind") != "TASK":
            return False
        given, tag = header.get("request_id"), header.get("tag")
        request_id = given if isinstance(given, str) and given else f"r{next(self._ids)}"
        if isinstance(tag, bool) or not isinstance(tag, str | int | float):
            tag = None
        return self.server.refuse_early(
            request_id,
            header.get("mode"),
            lambda outcome: self._send_outcome(identity, outcome, tag),
            deadline_ms=header.get("deadline_ms"),
            ahead=self._parsing,
            ahead_s=self._parsing * self.parse_s / self.parse_pool.threads,
        )

    def _parse_and_submit(self, identity, body: list, header: dict, received: float) -> None:
        """On a parse thread: decode and check the message, then Server.submit it (its Outcome
        is sent from the dispatch thread that makes it); a refusal is an ERROR reply naming
        what is wrong, and an unexpected failure one without the traceback (which is logged)."""
        started = time.perf_counter()
        try:
            self._decode_and_submit(identity, body, header, received)
        except Exception:  # noqa: BLE001 - the peer gets one line; the traceback stays in the log
            log.exception("sparkgnn-serve: a ZeroMQ request could not be read")
            self.server.count_refusal()
            self._send(identity, {"kind": "ERROR", "request_id": None, "error": "the request could not be read"}, {})
        finally:
            self.parse_s += PARSE_S_WEIGHT * (time.perf_counter() - started - self.parse_s)
            with self._parsing_lock:
                self._parsing -= 1

    def _decode_and_submit(self, identity, body: list, peeked: dict, received: float) -> None:
        """`peeked`: the header the socket thread read (size and header checked: protocol.peek_header),
        {} when it could not be read; the payload is then read without parsing the header again,
        as one packed buffer (wire.py) or as Arrow tables."""
        header: dict = {}
        refusals: tuple[type[Exception], ...] = (protocol.ProtocolError, ValueError, KeyError, RecursionError)
        try:
            if peeked:
                header = peeked
                if header.get("shm") is not None:
                    raise protocol.ProtocolError("message refers to shared memory; this receiver takes frames only")
            else:
                header = protocol.peek_header(body)  # raises: names what is wrong with it
            packed = header.get(wire.PACKED)
            if packed is not None:
                check_header(header, {})
                request_id = str(header.get("request_id") or f"r{next(self._ids)}")
                request = wire.unpack_request(request_id, packed, wire.packed_payload(header, body[1:]))
            else:
                header, tables = protocol.decode_payload(header, [protocol.frame_buffer(f) for f in body[1:]])
                check_header(header, tables)
                request_id = str(header.get("request_id") or f"r{next(self._ids)}")
                request = wire.request_from_tables(request_id, tables)
        except (*refusals, *USER_ERRORS) as exc:
            self.server.count_refusal()
            error = "the header nests too deeply" if isinstance(exc, RecursionError) else str(exc)
            given = header.get("request_id")
            self._send(
                identity, {"kind": "ERROR", "request_id": given if isinstance(given, str) else None, "error": error}, {}
            )
            return
        tag, reply_packed = header.get("tag"), packed is not None
        self.server.submit(
            request,
            header.get("mode"),
            lambda outcome: self._send_outcome(identity, outcome, tag, reply_packed),
            deadline_ms=header.get("deadline_ms"),
            received=received,
        )

    def _send_outcome(self, identity, outcome, tag, packed: bool = False) -> None:
        self._send_frames([identity, *self._outcome_frames(outcome, tag, packed)])

    @staticmethod
    def _outcome_frames(outcome, tag, packed: bool = False) -> list:
        """The reply frames of an Outcome (a RESULT with its answer, else BUSY or ERROR); `packed`
        (the request came packed): the answer as one packed buffer (wire.pack_answer), else as
        an Arrow table."""
        # the server's own limits (queue full, waited too long, stopping) are BUSY: retry later
        kind = {"ok": "RESULT", "busy": "BUSY", "timeout": "BUSY", "stopping": "BUSY"}.get(outcome.kind, "ERROR")
        header = {
            "kind": kind,
            "status": outcome.kind,  # the Outcome's own kind: a front process maps it to HTTP (fronts.py)
            "request_id": outcome.request_id,
            "tag": tag,
            "queue_ms": outcome.queue_s * 1e3,
            "service_ms": outcome.service_s * 1e3,
            "batch_requests": outcome.batch_requests,
            "pool": outcome.pool,
            "version": outcome.version,
        }
        if outcome.error:
            header["error"] = outcome.error
        if getattr(outcome, "retry_after_s", None):
            header["retry_after_s"] = outcome.retry_after_s
        if outcome.answer is None:
            return protocol.encode(header, {})
        if packed:
            counts, payload = wire.pack_answer(*outcome.answer.arrays())
            return wire.packed_frames(header, kind, counts, payload)
        return protocol.encode(header, {"answer": outcome.answer.table()})

    def _push(self):
        """This thread's PUSH socket into the reply pipe."""
        push = getattr(self._pushers, "sock", None)
        if push is None:
            push = self._pushers.sock = self.context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self._reply_endpoint)
        return push

    def _send(self, identity, header: dict, tables: dict) -> None:
        self._send_frames([identity, *protocol.encode(header, tables)])

    def _send_frames(self, frames: list) -> None:
        """Send a reply: on the ROUTER itself from the socket thread (which drains the reply pipe,
        so it must never wait on it), through this thread's PUSH into the pipe from any other."""
        sock = self._sock
        if sock is not None and threading.get_ident() == self._socket_thread:
            sock.send_multipart(frames, copy=False)
        else:
            self._push().send_multipart(frames, copy=False)


def _header_or_empty(body: list) -> dict:
    """The message's header alone (capped at protocol.MAX_HEADER_BYTES, so cheap to read on the
    socket thread), or {} when it is not a valid one."""
    try:
        return protocol.peek_header(body) if body else {}
    except (protocol.ProtocolError, ValueError, RecursionError):
        return {}


def _drain(sock, handle) -> None:
    """Hand every message waiting on `sock` to `handle`, without blocking."""
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        handle(frames)


def _bind(sock, endpoint: str) -> str:
    if endpoint.endswith(":0"):
        host = endpoint.rsplit(":", 1)[0]
        return f"{host}:{sock.bind_to_random_port(host)}"
    sock.bind(endpoint)
    return endpoint
