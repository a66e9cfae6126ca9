"""ZeroMQ endpoint helpers: loopback checks and the worker's own data endpoint.

WHY: the broker stays on the control path and payloads travel dealer<->worker directly, so each
worker binds a data socket next to where it reaches the broker (same transport: ipc next to
ipc, loopback tcp next to loopback tcp, inproc next to inproc) and advertises it in READY.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
import tempfile
import uuid

from sparkgnn.messenger.errors import EndpointError, SecurityError

_LOCAL_SCHEMES = ("ipc", "inproc")
FORMS = "tcp://host:port, ipc:///path/to/socket or inproc://name"


def scheme(endpoint: str) -> str:
    if not isinstance(endpoint, str) or "://" not in endpoint:
        raise EndpointError(f"not a ZeroMQ endpoint: {endpoint!r} (want {FORMS})")
    return endpoint.split("://", 1)[0]


def _tcp_port_ok(rest: str) -> bool:
    host, sep, port = rest.rpartition(":")
    return bool(sep and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536)


# scheme -> does the part after "://" name something a socket can connect to?
_CONNECTABLE = {
    "tcp": lambda rest: _tcp_port_ok(rest.rsplit(";", 1)[-1]),  # "src;host:port" is libzmq syntax
    "ipc": lambda rest: bool(rest),
    "inproc": lambda rest: bool(rest),
}


def check_connect(endpoint: str) -> str:
    """`endpoint`, or EndpointError naming what is wrong with it. WHY up front: libzmq answers
    a malformed address with a bare "Invalid argument", and inside a worker's control thread not
    even that reaches the user."""
    kind = scheme(endpoint)
    valid = _CONNECTABLE.get(kind)
    if valid is None:
        raise EndpointError(f"unknown scheme {kind!r} in endpoint {endpoint!r} (want {FORMS})")
    if not valid(endpoint.split("://", 1)[1]):
        raise EndpointError(f"cannot connect to {endpoint!r}: want {FORMS} (a tcp port is 1-65535)")
    return endpoint


def tcp_host(endpoint: str) -> str:
    rest = endpoint.split("://", 1)[1]
    host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return host.strip("[]")


def is_loopback(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on 127.0.0.0/8, ::1 or localhost."""
    kind = scheme(endpoint)
    if kind in _LOCAL_SCHEMES:
        return True
    if kind != "tcp":
        return False
    host = tcp_host(endpoint)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # interface names, hostnames, '*': treat as exposed


def check_bind(endpoint: str, curve_keys_dir, bind_any: bool = True) -> None:
    """Refuse to bind a non-loopback address unless explicitly allowed and CURVE-protected."""
    if is_loopback(endpoint):
        return
    if not bind_any:
        raise SecurityError(
            f"refusing to bind non-loopback {endpoint}: pass --bind-any "
            f"(and --curve-keys DIR) to expose the messenger on a network"
        )
    if not curve_keys_dir:
        raise SecurityError(
            f"binding non-loopback {endpoint} requires CURVE keys (--curve-keys DIR, see zmq.auth.create_certificates)"
        )


def ipc_dir() -> str:
    """The folder a worker's ipc:// data socket goes in: $SPARKGNN_IPC_DIR when set (LocalCluster
    sets its own 0700 run folder), else `sparkgnn-<uid>` under $XDG_RUNTIME_DIR (or the temp
    folder), made 0700. WHY private: a socket file in a world-writable /tmp can be connected to
    by any local user, and its predictable name squatted. An existing folder that is not this
    user's own 0700 directory is refused (SecurityError), never used."""
    configured = os.environ.get("SPARKGNN_IPC_DIR")
    if configured:
        return configured
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = runtime if runtime and os.path.isdir(runtime) else tempfile.gettempdir()
    folder = os.path.join(base, f"sparkgnn-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SecurityError(
            f"{folder} is not a private directory of this user (want a 0700 directory owned by uid "
            f"{os.getuid()}) so ipc sockets will not be made there; remove it or set SPARKGNN_IPC_DIR"
        )
    return folder


def data_bind_for(broker_endpoint: str) -> str:
    """Where a worker binds its data socket, next to how it reaches the broker."""
    kind = scheme(broker_endpoint)
    if kind == "inproc":
        return f"inproc://sparkgnn-data-{uuid.uuid4().hex}"
    if kind == "ipc":
        return f"ipc://{ipc_dir()}/sparkgnn-w{os.getpid()}-{uuid.uuid4().hex[:8]}.ipc"
    host = tcp_host(broker_endpoint)
    if is_loopback(broker_endpoint):
        return f"tcp://{'[::1]' if ':' in host else '127.0.0.1'}:*"
    return "tcp://0.0.0.0:*"


def advertised(bound: str, advertise_host: str | None = None) -> str:
    """The endpoint dealers connect to for a socket bound at `bound` (tcp wildcard -> this
    host's name unless `advertise_host` says otherwise)."""
    if scheme(bound) != "tcp":
        return bound
    if advertise_host is None:
        if tcp_host(bound) not in ("0.0.0.0", "*", "::"):
            return bound
        advertise_host = socket.gethostname()
    port = bound.rsplit(":", 1)[1]
    return f"tcp://{advertise_host}:{port}"


def cleanup_ipc(endpoint: str) -> None:
    """Remove the socket file an ipc:// bind left behind (ZeroMQ does not)."""
    if endpoint.startswith("ipc://"):
        try:
            os.unlink(endpoint[len("ipc://") :])
        except OSError:
            pass
