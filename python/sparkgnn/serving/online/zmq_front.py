"""The service's ZeroMQ front: a ROUTER socket speaking the messenger's frames (JSON header +
Arrow tables `nodes`/`edges`, serving.online.wire), feeding `Server.submit`.

WHY one thread owns the socket: ZeroMQ sockets are not thread-safe, and answers are produced by
the dispatch threads. Each of those gets its own PUSH socket into an inproc pipe that this
thread drains into the ROUTER, so no lock sits on the reply path. Refusals made here (frames
that are not the protocol, a table without the columns a request needs) take the same pipe.
Requests may carry a `tag` the reply echoes (the load generator uses it).

Headers are checked as strictly as the HTTP front's bodies (serving.online.bodies): a header key
or a table the protocol does not define is refused naming it and the expected ones (a misspelt
`"mode"` would otherwise be answered in the default mode), and each field must have its type.
"""

from __future__ import annotations

import itertools
import threading

import zmq

from sparkgnn.errors import USER_ERRORS
from sparkgnn.messenger import protocol
from sparkgnn.messenger.security import CLIENT, ServerAuth
from sparkgnn.serving.online import wire
from sparkgnn.serving.request import RequestError

# the header keys a request may carry: the messenger's own (protocol.stamp) and the service's
PROTOCOL_KEYS = frozenset({"v", "kind", "tables", "rows", "hash"})
REQUEST_KEYS: dict[str, tuple[type, ...]] = {
    "op": (str,),
    "request_id": (str,),
    "mode": (str,),
    "tag": (str, int, float),
    "deadline_ms": (int, float),
}
REQUEST_TABLES = ("nodes", "edges")


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
    def __init__(self, server, bind: str, curve_keys: str | None = None):
        self.server, self.bind, self.curve_keys = server, bind, curve_keys
        self.context: zmq.Context = zmq.Context.instance()
        self.endpoint: str | None = None
        self._reply_endpoint = f"inproc://sparkgnn-serve-replies-{id(self)}"
        self._pushers = threading.local()
        self._ids = itertools.count()
        self._auth: ServerAuth | None = None  # the allow-list (ZAP) of the CURVE front, closed with it

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

    def wake(self) -> None:
        """End the socket thread's wait (stop(): it then sees the stop event): one empty frame
        on the reply pipe, which the thread drops."""
        push = self._push()
        push.send(b"")

    def _on_message(self, frames) -> None:
        identity, body = frames[0], frames[1:]
        if body and len(body[0]) == 0:  # a REQ-style empty delimiter
            body = body[1:]
        header: dict = {}
        refusals: tuple[type[Exception], ...] = (protocol.ProtocolError, ValueError, KeyError, RecursionError)
        try:
            header, tables = protocol.decode(body)
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
        tag = header.get("tag")
        self.server.submit(
            request,
            header.get("mode"),
            lambda outcome: self._send_outcome(identity, outcome, tag),
            deadline_ms=header.get("deadline_ms"),
        )

    def _send_outcome(self, identity, outcome, tag) -> None:
        # the server's own limits (queue full, waited too long, stopping) are BUSY: retry later
        kind = {"ok": "RESULT", "busy": "BUSY", "timeout": "BUSY", "stopping": "BUSY"}.get(outcome.kind, "ERROR")
        header = {
            "kind": kind,
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
        tables = {"answer": outcome.answer} if outcome.answer is not None else {}
        self._send(identity, header, tables)

    def _push(self):
        """This thread's PUSH socket into the reply pipe."""
        push = getattr(self._pushers, "sock", None)
        if push is None:
            push = self._pushers.sock = self.context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self._reply_endpoint)
        return push

    def _send(self, identity, header: dict, tables: dict) -> None:
        self._push().send_multipart([identity, *protocol.encode(header, tables)], copy=False)


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
