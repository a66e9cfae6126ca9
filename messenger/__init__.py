"""Messenger: wire protocol, broker, dealer client, worker loop. Uses zmq + pyarrow only.

    protocol   frames [header JSON | Arrow IPC stream per table], validation (ProtocolError)
    transport  Transport interface, InProcessTransport, connect(spec) registry
    dealer     MessengerTransport: the client used inside Spark tasks
    broker     Broker + `sparkgnn-broker` (control path only: leases, heartbeats, requeue)
    dispatch   the broker's socket-free bookkeeping (LRU slots, bounded queue, expiry)
    worker     worker loop (`serve`), generic `python -m sparkgnn.messenger.worker --handler m:f`
    local      LocalCluster: broker + N worker child processes (`local[N]`)
    shm        same-host payload route through reused shared memory segments
    verify     result checks shared by all transports (batch id, row ids)
    cli        one-line argument/user errors with exit code 2 for the messenger's command lines
    endpoints, security, sockets, memory, watchdog, hashing: small helpers, one job each
See README.md in this folder for the design, measured numbers and the API.
"""
from sparkgnn.messenger.errors import (BindError, BrokerUnreachableError, EndpointError,
                                       MessageTooLargeError, NoWorkerError, RemoteTaskError,
                                       SecurityError, TransportError)
from sparkgnn.messenger.protocol import PROTOCOL_VERSION, Handler, Kind, ProtocolError, decode, encode

__all__ = ["PROTOCOL_VERSION", "Kind", "ProtocolError", "Handler", "encode", "decode",
           "TransportError", "RemoteTaskError", "SecurityError", "BrokerUnreachableError",
           "NoWorkerError", "MessageTooLargeError", "EndpointError", "BindError", "connect", "Broker", "serve",
           "LocalCluster", "InProcessTransport", "MessengerTransport"]

_LAZY = {"connect": "transport", "InProcessTransport": "transport", "MessengerTransport": "dealer",
         "Broker": "broker", "serve": "worker", "LocalCluster": "local"}


def __getattr__(name):
    if name in _LAZY:
        from importlib import import_module
        return getattr(import_module(f"sparkgnn.messenger.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'sparkgnn.messenger' has no attribute {name!r}")
