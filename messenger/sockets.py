"""Socket construction shared by broker, worker and dealer, so the same options (size caps,
linger, high-water marks, CURVE) apply everywhere."""

from __future__ import annotations

import math

import zmq

from sparkgnn.messenger import security
from sparkgnn.messenger.errors import BindError, EndpointError

# Broker sockets only ever see control messages; this caps what a peer can make it allocate.
CONTROL_MAX_BYTES = 1024 * 1024


def poll_ms(seconds: float) -> int:
    """A wait in seconds as the whole milliseconds zmq's poll takes, rounded up: a wait of 0.4 ms
    polls for 1 ms instead of returning at once and spinning until the deadline; never negative
    (a negative poll timeout would wait forever)."""
    return max(0, math.ceil(seconds * 1000))


def make(
    context: zmq.Context,
    kind: int,
    *,
    max_frame_bytes: int | None = None,
    server_auth: security.ServerAuth | None = None,
    allow: str = security.CLIENT,
    client_keys: security.ClientKeys | None = None,
    hwm: int | None = None,
    identity: bytes | None = None,
) -> zmq.Socket:
    """A socket with the shared options; a CURVE server admitting `allow`'s allow-list when
    `server_auth` is given, a CURVE client with its persistent key pair (pinning the server key)
    when `client_keys` is."""
    sock = context.socket(kind)
    sock.linger = 0
    if max_frame_bytes:
        # libzmq drops (and disconnects) a peer sending a frame larger than this before
        # allocating it; the whole-message cap is checked by protocol.decode.
        sock.setsockopt(zmq.MAXMSGSIZE, int(max_frame_bytes))
    if hwm is not None:
        sock.sndhwm = sock.rcvhwm = hwm
    if identity is not None:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    if server_auth is not None:
        server_auth.secure(sock, allow)
    else:
        if hasattr(zmq, "ZAP_ENFORCE_DOMAIN"):
            # a socket with no ZAP domain never consults a ZAP handler: without this libzmq sends
            # an unkeyed (NULL) socket's handshakes to whatever handler the context has (a keyed
            # server's, which refuses NULL), so an unkeyed loopback run sharing a context with
            # a keyed one would be cut off
            sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        if client_keys is not None:
            security.make_client(sock, client_keys)
    return sock


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind and return the concrete endpoint (tcp port resolved for `tcp://host:*`).
    A failure is a BindError naming the endpoint and libzmq's reason ("Address already in use"),
    not a raw ZMQError traceback: a taken port is the operator's to fix, not a bug."""
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise BindError(f"cannot bind {endpoint}: {_reason(exc)}") from None
    last = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    return last or endpoint


def connect(sock: zmq.Socket, endpoint: str) -> None:
    """Connect, or EndpointError naming the endpoint (libzmq only says "Invalid argument")."""
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        raise EndpointError(f"cannot connect to {endpoint!r}: {_reason(exc)}") from None


def _reason(exc: zmq.ZMQError) -> str:
    """libzmq's reason alone ("Address already in use"; pyzmq appends the address itself)."""
    return zmq.strerror(exc.errno) if exc.errno else str(exc)
