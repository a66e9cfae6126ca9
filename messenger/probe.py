"""Asking a broker, without a batch: is it there, does it have a worker (`probe_broker`, run from
the driver before a job depends on the broker), and its metrics (`broker_stats`).

Both use a throw-away DEALER socket on the broker's front endpoint and only control messages
(HEARTBEAT, STATS); every wait is bounded. The dealer (dealer.py) makes the same checks per batch
while it asks for a worker, with the same timeouts and the same messages (errors.py).
"""

from __future__ import annotations

import time

import zmq

from sparkgnn.messenger import endpoints, security, sockets
from sparkgnn.messenger.errors import (
    BrokerUnreachableError,
    NoWorkerError,
    TransportError,
    no_worker_message,
    unreachable_message,
)
from sparkgnn.messenger.protocol import Kind, ProtocolError, control, peek_header

# How long a batch waits for a broker that never answers / for a worker to connect to a broker
# that has none. Short enough that a wrong address fails while the user still watches, long
# enough for a broker or a worker (torch import) that is being started at the same time.
CONNECT_TIMEOUT_S = 15.0
NO_WORKER_TIMEOUT_S = 15.0


def broker_stats(
    endpoint: str,
    timeout_s: float = 5.0,
    client_keys: security.ClientKeys | None = None,
    context: zmq.Context | None = None,
) -> dict:
    """One STATS round trip to a broker's front endpoint; TransportError if it does not answer."""
    context = context or zmq.Context.instance()
    sock = sockets.make(context, zmq.DEALER, max_frame_bytes=sockets.CONTROL_MAX_BYTES, client_keys=client_keys)
    try:
        sock.connect(endpoint)
        sock.send_multipart(control(Kind.STATS))
        if not sock.poll(sockets.poll_ms(timeout_s)):
            raise TransportError(f"broker {endpoint} did not answer STATS within {timeout_s}s")
        header = peek_header(sock.recv_multipart(), sockets.CONTROL_MAX_BYTES)
        return header.get("metrics") or {}
    finally:
        sock.close(0)


def probe_broker(
    endpoint: str,
    connect_timeout_s: float | None = CONNECT_TIMEOUT_S,
    no_worker_timeout_s: float | None = NO_WORKER_TIMEOUT_S,
    client_keys: security.ClientKeys | None = None,
    context: zmq.Context | None = None,
) -> dict:
    """Check, before a job depends on it, that a broker answers at `endpoint` (BrokerUnreachableError
    after connect_timeout_s) and that at least one worker is connected to it (waits up to
    no_worker_timeout_s for one, then NoWorkerError). Returns the broker's last HEARTBEAT answer.
    WHY: a driver that starts a Spark job against a wrong address would otherwise learn it from
    every task, deep in a JVM stack trace; 0 / None for a timeout waits without limit."""
    endpoints.check_connect(endpoint)
    context = context or zmq.Context.instance()
    sock = sockets.make(context, zmq.DEALER, max_frame_bytes=sockets.CONTROL_MAX_BYTES, client_keys=client_keys)
    try:
        sockets.connect(sock, endpoint)
        answer = _ping(sock, connect_timeout_s)
        if answer is None:
            assert connect_timeout_s is not None  # _ping only gives up when it has a timeout
            raise BrokerUnreachableError(unreachable_message(endpoint, connect_timeout_s))
        since = time.monotonic()
        while answer.get("live_workers") == 0:
            if no_worker_timeout_s and time.monotonic() - since >= no_worker_timeout_s:
                raise NoWorkerError(no_worker_message(endpoint, answer.get("back"), no_worker_timeout_s))
            time.sleep(0.2)
            answer = _ping(sock, connect_timeout_s)
            if answer is None:
                assert connect_timeout_s is not None  # _ping only gives up when it has a timeout
                raise BrokerUnreachableError(unreachable_message(endpoint, connect_timeout_s))
        return answer
    finally:
        sock.close(0)


def _ping(sock: zmq.Socket, timeout_s: float | None, resend_s: float = 0.5) -> dict | None:
    """A HEARTBEAT round trip: the broker's answer header, or None when silent for timeout_s.
    The ping is repeated every resend_s, so a broker that starts while we wait still answers."""
    deadline = time.monotonic() + timeout_s if timeout_s else None
    while True:
        try:
            sock.send_multipart(control(Kind.HEARTBEAT), zmq.NOBLOCK)
        except zmq.Again:
            pass  # no pipe to queue it on yet: the next round sends it again
        resend_at = time.monotonic() + resend_s
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            wait = (resend_at if deadline is None else min(resend_at, deadline)) - now
            if wait <= 0:
                break
            if not sock.poll(sockets.poll_ms(wait)):
                continue
            try:
                header = peek_header(sock.recv_multipart(), sockets.CONTROL_MAX_BYTES)
            except ProtocolError:
                continue
            if header["kind"] == Kind.HEARTBEAT.value:
                return header
