"""Errors the messenger raises on purpose. They derive from sparkgnn's SparkGNNError so the
executor can tell a named transport failure from a bug; each message names the batch, the op and
the endpoint, because "timed out" alone is useless inside a Spark task log."""
from sparkgnn.errors import SparkGNNError


class TransportError(SparkGNNError, RuntimeError):
    """A request could not be completed (after retries): names batch id, op and endpoint."""


class RemoteTaskError(TransportError):
    """The worker refused the task (its handler raised, or it could not decode the request)."""


class SecurityError(SparkGNNError, ValueError):
    """A configuration would expose a socket without authentication (non-loopback, no CURVE)."""
