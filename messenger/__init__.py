"""Messenger: wire protocol, broker, dealer client, worker loop. Uses zmq + pyarrow only.

    protocol   frames [header JSON | Arrow IPC stream per table], validation (ProtocolError)
    transport  Transport interface, InProcessTransport, connect(spec) registry
    dealer     MessengerTransport: the client used inside Spark tasks (its state machine), with
      batches        a batch's states and attempts
      broker_link    the dealer's control socket: liveness, reconnects, no broker / no worker
      payload_route  a batch's payload: shared memory segment (same host) or frames
    probe      probe_broker / broker_stats: asking a broker without a batch (driver-side checks)
    broker     Broker + `sparkgnn-broker` (control path only: leases, heartbeats, requeue)
    dispatch   the broker's socket-free bookkeeping (LRU slots, bounded queue, expiry)
    worker_loop  Worker, serve: the worker loop (control thread + task loop)
    worker     the worker executables' shared command line, generic
               `python -m sparkgnn.messenger.worker --handler m:f` (re-exports Worker, serve)
    local      LocalCluster: broker + N worker child processes (`local[N]`)
    shm        same-host payload route through reused shared memory segments
    verify     result checks shared by all transports (batch id, row ids)
    cli        one-line argument/user errors with exit code 2 for the messenger's command lines
    errors     MessengerError (the messenger's own error base) and its refusals with their texts
    endpoints, security, sockets, memory, watchdog, hashing: small helpers, one job each
See README.md in this folder for the design, measured numbers and the API.
"""

from typing import TYPE_CHECKING

from sparkgnn.messenger.errors import (
    BindError,
    BrokerUnreachableError,
    EndpointError,
    MessageTooLargeError,
    MessengerError,
    NoWorkerError,
    RemoteTaskError,
    SecurityError,
    TransportError,
)

if TYPE_CHECKING:
    from sparkgnn.messenger.broker import Broker
    from sparkgnn.messenger.dealer import MessengerTransport
    from sparkgnn.messenger.local import LocalCluster
    from sparkgnn.messenger.protocol import PROTOCOL_VERSION, Handler, Kind, ProtocolError, decode, encode
    from sparkgnn.messenger.transport import InProcessTransport, connect
    from sparkgnn.messenger.worker import serve

__all__ = [
    "PROTOCOL_VERSION",
    "Kind",
    "ProtocolError",
    "Handler",
    "encode",
    "decode",
    "MessengerError",
    "TransportError",
    "RemoteTaskError",
    "SecurityError",
    "BrokerUnreachableError",
    "NoWorkerError",
    "MessageTooLargeError",
    "EndpointError",
    "BindError",
    "connect",
    "Broker",
    "serve",
    "LocalCluster",
    "InProcessTransport",
    "MessengerTransport",
]

# Loaded on first use (PEP 562): the errors above are all `sparkgnn.errors` needs (it lists
# MessengerError in USER_ERRORS), and importing them must not cost pyarrow or zmq.
_LAZY = {
    "PROTOCOL_VERSION": "protocol",
    "Kind": "protocol",
    "ProtocolError": "protocol",
    "Handler": "protocol",
    "encode": "protocol",
    "decode": "protocol",
    "connect": "transport",
    "InProcessTransport": "transport",
    "MessengerTransport": "dealer",
    "Broker": "broker",
    "serve": "worker",
    "LocalCluster": "local",
}


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"sparkgnn.messenger.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'sparkgnn.messenger' has no attribute {name!r}")
