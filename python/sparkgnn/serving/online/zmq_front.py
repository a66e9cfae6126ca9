"""The service's ZeroMQ front: a ROUTER socket speaking the messenger's frames (JSON header +
Arrow tables `nodes`/`edges`, serving.online.wire), feeding `Server.submit`.

WHY one thread owns the socket: ZeroMQ sockets are not thread-safe, and answers are produced by
the dispatch threads. Each of those gets its own PUSH socket into an inproc pipe that this
thread drains into the ROUTER, so no lock sits on the reply path. Refusals made here (frames
that are not the protocol, a table without the columns a request needs) take the same pipe.
Requests may carry a `tag` the reply echoes (the load generator uses it).
"""

from __future__ import annotations

import itertools
import threading

import zmq

from sparkgnn.errors import USER_ERRORS
from sparkgnn.messenger import protocol
from sparkgnn.serving.online import wire

POLL_MS = 200


class ZmqFront:
    def __init__(self, server, bind: str, curve_keys: str | None = None):
        self.server, self.bind, self.curve_keys = server, bind, curve_keys
        self.context: zmq.Context = zmq.Context.instance()
        self.endpoint: str | None = None
        self._reply_endpoint = f"inproc://sparkgnn-serve-replies-{id(self)}"
        self._pushers = threading.local()
        self._ids = itertools.count()
        self._auth: object | None = None  # the CURVE authenticator thread, kept alive with the front

    def run(self, ready: threading.Event, stop: threading.Event) -> None:
        sock = self.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve_keys:
            from sparkgnn.messenger.security import make_server, start_authenticator

            self._auth = start_authenticator(self.context, self.curve_keys)
            make_server(sock, self.curve_keys)
        self.endpoint = _bind(sock, self.bind)
        replies = self.context.socket(zmq.PULL)
        replies.bind(self._reply_endpoint)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(replies, zmq.POLLIN)
        ready.set()
        try:
            while not stop.is_set():
                events = dict(poller.poll(POLL_MS))
                if replies in events:
                    _drain(replies, lambda frames: sock.send_multipart(frames, copy=False))
                if sock in events:
                    _drain(sock, self._on_message)
        finally:
            sock.close(0)
            replies.close(0)

    def _on_message(self, frames) -> None:
        identity, body = frames[0], frames[1:]
        if body and len(body[0]) == 0:  # a REQ-style empty delimiter
            body = body[1:]
        header: dict = {}
        refusals: tuple[type[Exception], ...] = (protocol.ProtocolError, ValueError, KeyError, *USER_ERRORS)
        try:
            header, tables = protocol.decode(body)
            request_id = str(header.get("request_id") or f"r{next(self._ids)}")
            request = wire.request_from_tables(request_id, tables)
        except refusals as exc:
            self.server.count_refusal()
            self._send(identity, {"kind": "ERROR", "request_id": header.get("request_id"), "error": str(exc)}, {})
            return
        tag = header.get("tag")
        self.server.submit(request, header.get("mode"), lambda outcome: self._send_outcome(identity, outcome, tag))

    def _send_outcome(self, identity, outcome, tag) -> None:
        kind = {"ok": "RESULT", "busy": "BUSY"}.get(outcome.kind, "ERROR")
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
        tables = {"answer": outcome.answer} if outcome.answer is not None else {}
        self._send(identity, header, tables)

    def _send(self, identity, header: dict, tables: dict) -> None:
        push = getattr(self._pushers, "sock", None)
        if push is None:
            push = self._pushers.sock = self.context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self._reply_endpoint)
        push.send_multipart([identity, *protocol.encode(header, tables)], copy=False)


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
