"""The Transport interface the Spark executor calls, its in-process implementation, and
`connect(spec)`, which picks an implementation from a registry by the spec's scheme.

WHY an in-process transport with the same contract: unit tests and tiny jobs run the handler in
the caller's process, but through the same encode -> decode -> verify path (wire=True), so a
handler that returns a malformed result fails identically in-process and across processes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, runtime_checkable

from sparkgnn.messenger import verify
from sparkgnn.messenger.dealer import MessengerTransport
from sparkgnn.messenger.errors import EndpointError, RemoteTaskError, TransportError
from sparkgnn.messenger.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    RESERVED,
    Handler,
    Kind,
    ProtocolError,
    decode,
    encode,
)


@runtime_checkable
class Transport(Protocol):
    def call(self, header: dict, tables: dict) -> tuple[dict, dict]:
        """One request/response; raises TransportError naming batch id, op, endpoint."""

    def map(self, requests: Iterable[tuple[dict, dict]], window: int = ...) -> Iterator[tuple[dict, dict]]:
        """Pipelined, bounded in-flight window; results in request order."""

    def close(self) -> None: ...


class InProcessTransport:
    """Calls `handler` directly. With wire=True (default) requests and results go through the
    real encoder/decoder (hash, row counts, Arrow validity) and the same result verification
    (batch id, row ids) as the messenger; wire=False skips the serialization round trip."""

    endpoint = "inprocess"

    def __init__(
        self,
        handler: Handler,
        *,
        wire: bool = True,
        job: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        self.handler = handler
        self.wire = wire
        self.job = job
        self.max_message_bytes = max_message_bytes
        self._seq = 0
        self._closed = False

    def call(self, header: dict, tables: dict) -> tuple[dict, dict]:
        if self._closed:
            raise TransportError("in-process transport is closed")
        header = dict(header, kind=Kind.TASK.value)
        self._seq += 1
        header.setdefault("batch", f"inprocess-{self._seq}")
        if self.job is not None:
            header.setdefault("job", self.job)
        expected_ids = verify.request_ids(header, tables)
        if self.wire:
            header, tables = decode(encode(header, tables), self.max_message_bytes)
        try:
            fields, out = self.handler(header, tables)
            if not isinstance(fields, dict) or not isinstance(out, dict):
                raise TypeError("handler must return (dict of header fields, dict of tables)")
        except Exception as exc:
            raise RemoteTaskError(
                f"batch {header.get('batch')!r} op {header.get('op')!r} "
                f"(in-process): handler raised {type(exc).__name__}: {exc}"
            ) from exc
        result = {k: v for k, v in fields.items() if k not in RESERVED}
        result.update({k: header.get(k) for k in ("job", "batch", "op", "layer", "model")}, kind=Kind.RESULT.value)
        try:
            if self.wire:
                result, out = decode(encode(result, out), self.max_message_bytes)
            verify.check_result(header, result, out, expected_ids)
        except ProtocolError as exc:
            raise TransportError(
                f"batch {header.get('batch')!r} op {header.get('op')!r} (in-process): bad result: {exc}"
            ) from exc
        return result, out

    def map(self, requests: Iterable[tuple[dict, dict]], window: int = 1) -> Iterator[tuple[dict, dict]]:
        for header, tables in requests:
            yield self.call(header, tables)

    def close(self) -> None:
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _inprocess(spec: str, handler_factory, **options):
    if handler_factory is None:
        raise ValueError("connect('inprocess') needs handler_factory (a callable returning a Handler)")
    return InProcessTransport(handler_factory(), **options)


def _messenger(spec: str, handler_factory, **options):
    return MessengerTransport(spec, **options)


class _ClusterTransport(MessengerTransport):
    """A MessengerTransport that owns the LocalCluster it talks to and stops it on close()."""

    def __init__(self, cluster, **options):
        self.cluster = cluster
        options.setdefault("keys_dir", cluster.keys_dir)
        super().__init__(cluster.front, **options)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.cluster.stop()


def parse_local(spec: str) -> int:
    """The N of "local[N]" (N >= 1), or EndpointError saying what N must be."""
    match = re.fullmatch(r"local\[([^\]]*)\]", spec.strip()) if isinstance(spec, str) else None
    text = match.group(1).strip() if match else None
    if text is None or not text.isdigit() or int(text) < 1:
        raise EndpointError(
            f"bad local spec {spec!r}: want local[N] with N a whole number >= 1 "
            f"(how many worker processes to start), e.g. local[2]"
        )
    return int(text)


def _local(spec: str, handler_factory, *, cluster_options=None, **options):
    from sparkgnn.messenger.local import LocalCluster  # spawns processes: import only when asked

    cluster = LocalCluster(parse_local(spec), **(cluster_options or {})).start()
    try:
        return _ClusterTransport(cluster, **options)
    except BaseException:
        cluster.stop()
        raise


TRANSPORTS: dict[str, Callable] = {
    "inprocess": _inprocess,
    "tcp": _messenger,
    "ipc": _messenger,
    "inproc": _messenger,
    "local": _local,
}


def _key(spec: str) -> str:
    if "://" in spec:
        return spec.split("://", 1)[0]
    return spec.split("[", 1)[0]


def connect(spec: str, handler_factory: Callable[[], Handler] | None = None, **options) -> Transport:
    """A transport for `spec`: "inprocess" (handler_factory required), "tcp://...", "ipc://...",
    "inproc://..." (a broker's front endpoint), or "local[N]" (starts a LocalCluster; pass its
    arguments as cluster_options=dict(...)). Other options go to the transport's constructor."""
    factory = TRANSPORTS.get(_key(spec)) if isinstance(spec, str) else None
    if factory is None:
        raise EndpointError(
            f"unknown transport spec {spec!r}; known: {sorted(TRANSPORTS)} "
            f"(inprocess, local[N], tcp://host:port, ipc:///path, inproc://name)"
        )
    return factory(spec, handler_factory, **options)
