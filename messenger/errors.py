"""Errors the messenger raises on purpose. They derive from MessengerError so the executor can
tell a named transport failure from a bug; each message names the batch, the op and the endpoint,
because "timed out" alone is useless inside a Spark task log, and says what to do (which process
to start, which flag to raise), because the reader is often not the author.

WHY a base of its own and not sparkgnn.errors.SparkGNNError: the messenger is a leaf (zmq + pyarrow
+ stdlib) that imports nothing else of sparkgnn, so the broker runs where the rest cannot.
sparkgnn.errors.USER_ERRORS lists MessengerError next to SparkGNNError, so sparkgnn's command
lines and executor still treat these as deliberate refusals."""


class MessengerError(Exception):
    """Base class of all deliberate messenger errors."""


class TransportError(MessengerError, RuntimeError):
    """A request could not be completed (after retries): names batch id, op and endpoint."""


class RemoteTaskError(TransportError):
    """The worker refused the task (its handler raised, or it could not decode the request). The
    worker's ERROR names the exception in one line; its traceback is in the worker's log only."""


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


class EndpointError(MessengerError, ValueError):
    """An endpoint or transport spec is malformed (no port, unknown scheme, local[0]...)."""


class SecurityError(MessengerError, ValueError):
    """A configuration would expose a socket without authentication (non-loopback, no CURVE)."""


def size_text(nbytes: int) -> str:
    """Bytes as a person reads them in an error message: '300.0 MiB', '48.8 KiB', '512 bytes'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


# -- the texts of the dealer's refusals (dealer.py, probe.py) -------------------------------------
def unreachable_message(endpoint: str, timeout_s: float) -> str:
    return (
        f"no broker answered at {endpoint} within {timeout_s:g} s: start one with "
        f"`sparkgnn-broker --front {endpoint} --back <worker endpoint>` (clients connect to "
        f"its --front endpoint), or check the address"
    )


def no_worker_message(endpoint: str, back: str | None, timeout_s: float) -> str:
    where = back or "<the broker's --back endpoint>"
    return (
        f"no worker is connected to the broker at {endpoint} (none for {timeout_s:g} s): start "
        f"one with `sparkgnn-worker --connect {where} --model-store DIR`"
    )


def too_large_message(header: dict, size: int, limit: int, whose: str, remedy: str, what: str = "") -> str:
    """'batch 17 of job 'x' (op 'y') is 300.0 MiB (N bytes), over worker W's message limit of
    256.0 MiB, max_message_bytes=L: <remedy>, or send smaller batches (more partitions)'."""
    subject = f"{what} batch" if what else "batch"
    return (
        f"{subject} {header.get('batch')!r} of job {header.get('job')!r} (op {header.get('op')!r}) "
        f"is {size_text(size)} ({size} bytes), over {whose} message limit of {size_text(limit)}, "
        f"max_message_bytes={limit}: {remedy}, or send smaller batches (more partitions)"
    )
