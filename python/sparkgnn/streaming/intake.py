"""Request file bytes -> requests, and the queue entry (Pending) each request becomes.

WHY the job parses the bytes itself (Spark's binaryFile source hands over path + content) instead
of letting Spark read the files as Parquet: a Parquet stream source with a fixed schema fails the
whole query on one corrupt or foreign file (and every restart replays the same batch, so the query
never gets past it). Parsing each file on its own turns "this file is unusable" into a value: the
file goes to the dead-letter directory with the reason and the rest of the micro-batch is served.

What counts as malformed (the whole file is refused): empty (0 bytes; Spark does not even hand
those over, handler.py finds them in the checkpoint), not Parquet or truncated, a column of SCHEMA
missing, a column whose type cannot be cast to SCHEMA's, a kind other than node/edge, null ids,
feature vectors of different lengths inside one request, or no row at all. The checks and their
words are serving.request.parse_request_bytes', shared with read_requests. A file that parses but holds
an invalid REQUEST (unknown ids, wrong width, NaN) is not malformed: that request is answered
with an error row naming the problem (handler.py), because the fault is the request's, not the
file's, and a client reading the answers should learn about it under its request id; so is a
request over the online service's caps (max_queries query nodes, max_edges edges:
serving.online.config.over_caps). On a typed graph the files are typed request files, read into
TypedRequests (serving/typed_request.py says what is malformed there, a homogeneous file too).

Oversize files (FileLimits) are refused too, before anything decodes them: a file longer than
`max_bytes` is never collected to the driver (handler.py filters on the source's `length` column,
so Spark does not even read its content) and is dead-lettered without its bytes; a file whose
Parquet footer (pyarrow metadata: read from the file's tail, no page decompressed) declares more
than `max_rows` rows or more than `max_decompressed_bytes` of uncompressed column data is
dead-lettered before it is decoded, so a small file that would decompress to gigabytes (a
decompression bomb) costs its footer, not the driver's memory. The footer's sizes are what the
writer recorded; page headers that contradict them make the decoder fail, which is a malformed
file like any other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkgnn.errors import SparkGNNError
from sparkgnn.serving.request import Request, RequestError, parse_request_bytes

if TYPE_CHECKING:
    from sparkgnn.serving.typed import TypedRequest


class MalformedRequestFile(SparkGNNError, ValueError):
    """A request file cannot be read as requests; the message says why."""


@dataclass
class IncomingFile:
    """One file of a micro-batch, as the binaryFile source reports it."""

    path: str
    arrival_ts: float  # the file's modification time (epoch seconds): when it appeared
    content: bytes | None
    vanished: bool = False  # listed by the source, gone from disk before it could be read
    length: int | None = None  # its size as listed, when its content was not collected (oversize)

    @property
    def name(self) -> str:
        return os.path.basename(local_path(self.path))


@dataclass
class Pending:
    """A request waiting in a micro-batch's queue. `seq` is its arrival rank in the micro-batch
    (file arrival time, then file path, then position in the file); `cost` is the grouping
    policy's estimate; `problems` are Request.problems(G) (empty: answerable)."""

    request: Request | TypedRequest
    file: str
    arrival_ts: float
    seq: int
    cost: float = 0.0
    problems: list = field(default_factory=list)
    error: str | None = None  # set when the request cannot be answered

    @property
    def request_id(self) -> str:
        return self.request.request_id


def local_path(path: str) -> str:
    """'file:/a/b' or 'file:///a/b' (what Spark reports) -> '/a/b'; other strings unchanged."""
    if path.startswith("file://"):
        return path[len("file://") :]
    if path.startswith("file:"):
        return path[len("file:") :]
    return path


@dataclass(frozen=True)
class FileLimits:
    """What one request file may hold (module doc); the request caps are the online service's
    defaults (serving.online.config.ServeConfig)."""

    max_bytes: int = 64 * 1024 * 1024
    max_rows: int = 1_000_000
    max_decompressed_bytes: int = 256 * 1024 * 1024
    max_queries: int = 4096
    max_edges: int = 131072

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_rows", "max_decompressed_bytes", "max_queries", "max_edges"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"request file limits: {name} must be an integer >= 1, got {value!r}")


def oversize_reason(name: str, size: int, limits: FileLimits) -> str:
    """The dead-letter reason of a file of `size` bytes over limits.max_bytes."""
    return (
        f"{name}: {size} bytes, over the job's limit of {limits.max_bytes} bytes a request file "
        "(max_file_bytes); not read"
    )


def check_footer(content: bytes, name: str, limits: FileLimits) -> None:
    """MalformedRequestFile when the Parquet footer of `content` declares more rows or more
    uncompressed bytes than `limits` allow (module doc); nothing when it is within them or is
    not a Parquet footer at all (the parser then says what the file is not)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(pa.BufferReader(content)).metadata
    except Exception:  # noqa: BLE001 - not Parquet: parse_request_bytes refuses it in its words
        return
    if meta.num_rows > limits.max_rows:
        raise MalformedRequestFile(
            f"{name}: its footer declares {meta.num_rows} rows, over the job's limit of {limits.max_rows} "
            "(max_file_rows); not decoded"
        )
    declared = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        chunks = sum(group.column(c).total_uncompressed_size for c in range(group.num_columns))
        declared += max(int(group.total_byte_size), int(chunks))
    if declared > limits.max_decompressed_bytes:
        raise MalformedRequestFile(
            f"{name}: its footer declares {declared} bytes of uncompressed data ({len(content)} bytes "
            f"compressed), over the job's limit of {limits.max_decompressed_bytes} "
            "(max_file_decompressed_bytes); not decoded"
        )


def parse_request_file(
    content: bytes | None, path: str = "<bytes>", limits: FileLimits | None = None, *, typed: bool = False
) -> list[Request] | list[TypedRequest]:
    """The requests of one file in SCHEMA, in file order; MalformedRequestFile says why not (the
    same checks and words as serving.request.read_requests: parse_request_bytes), or why the
    file is over `limits` (its bytes, or its footer's rows or uncompressed bytes). `typed`: the
    file is a typed request file (serving.typed_request) and its requests TypedRequests."""
    if limits is not None and content:
        if len(content) > limits.max_bytes:
            raise MalformedRequestFile(oversize_reason(path, len(content), limits))
        check_footer(content, path, limits)
    try:
        if typed:
            from sparkgnn.serving.typed_request import parse_typed_request_bytes

            return parse_typed_request_bytes(content, path)
        return parse_request_bytes(content, path)
    except RequestError as exc:
        raise MalformedRequestFile(str(exc)) from None
