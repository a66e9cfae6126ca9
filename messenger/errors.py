"""Errors the messenger raises on purpose. They derive from sparkgnn's SparkGNNError so the
executor can tell a named transport failure from a bug; each message names the batch, the op and
the endpoint, because "timed out" alone is useless inside a Spark task log, and says what to do
(which process to start, which flag to raise), because the reader is often not the author."""
from sparkgnn.errors import SparkGNNError


class TransportError(SparkGNNError, RuntimeError):
    """A request could not be completed (after retries): names batch id, op and endpoint."""


class RemoteTaskError(TransportError):
    """The worker refused the task (its handler raised, or it could not decode the request)."""


class BrokerUnreachableError(TransportError):
    """No broker answered at an endpoint within the connect timeout (none listening there, a
    wrong address, or a firewall): names the endpoint and the command that starts a broker."""


class NoWorkerError(TransportError):
    """The broker answers but no worker is connected to it, so a batch would wait forever."""


class MessageTooLargeError(TransportError):
    """A batch or result is over a peer's message size limit: names the batch, both sizes and the
    flag that raises the limit. Raised before sending when the limit is known, or when the peer
    answers with an ERROR frame marked too_large."""


class BindError(TransportError):
    """A broker or worker socket cannot bind its endpoint (port taken, no such folder...)."""


class EndpointError(SparkGNNError, ValueError):
    """An endpoint or transport spec is malformed (no port, unknown scheme, local[0]...)."""


class SecurityError(SparkGNNError, ValueError):
    """A configuration would expose a socket without authentication (non-loopback, no CURVE)."""


def size_text(nbytes: int) -> str:
    """Bytes as a person reads them in an error message: '300.0 MiB', '48.8 KiB', '512 bytes'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"
