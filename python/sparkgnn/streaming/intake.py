"""Request file bytes -> requests, and the queue entry (Pending) each request becomes.

WHY the job parses the bytes itself (Spark's binaryFile source hands over path + content) instead
of letting Spark read the files as Parquet: a Parquet stream source with a fixed schema fails the
whole query on one corrupt or foreign file (and every restart replays the same batch, so the query
never gets past it). Parsing each file on its own turns "this file is unusable" into a value: the
file goes to the dead-letter directory with the reason and the rest of the micro-batch is served.

What counts as malformed (the whole file is refused): not Parquet, a column of SCHEMA missing, a
column whose type cannot be cast to SCHEMA's, a kind other than node/edge, null ids, feature
vectors of different lengths inside one request, or no row at all. A file that parses but holds
an invalid REQUEST (unknown ids, wrong width, NaN) is not malformed: that request is answered
with an error row naming the problem (handler.py), because the fault is the request's, not the
file's, and a client reading the answers should learn about it under its request id.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import pyarrow as pa
import pyarrow.parquet as pq

from sparkgnn.errors import SparkGNNError
from sparkgnn.serving.request import SCHEMA, Request, requests_from_table


class MalformedRequestFile(SparkGNNError, ValueError):
    """A request file cannot be read as requests; the message says why."""


@dataclass
class IncomingFile:
    """One file of a micro-batch, as the binaryFile source reports it."""

    path: str
    arrival_ts: float        # the file's modification time (epoch seconds): when it appeared
    content: bytes

    @property
    def name(self) -> str:
        return os.path.basename(local_path(self.path))


@dataclass
class Pending:
    """A request waiting in a micro-batch's queue. `seq` is its arrival rank in the micro-batch
    (file arrival time, then file path, then position in the file); `cost` is the grouping
    policy's estimate; `problems` are Request.problems(G) (empty: answerable)."""

    request: Request
    file: str
    arrival_ts: float
    seq: int
    cost: float = 0.0
    problems: list = field(default_factory=list)
    error: Optional[str] = None       # set when the request cannot be answered

    @property
    def request_id(self) -> str:
        return self.request.request_id


def local_path(path: str) -> str:
    """'file:/a/b' or 'file:///a/b' (what Spark reports) -> '/a/b'; other strings unchanged."""
    if path.startswith("file://"):
        return path[len("file://"):]
    if path.startswith("file:"):
        return path[len("file:"):]
    return path


def parse_request_file(content: bytes, path: str = "<bytes>") -> list[Request]:
    """The requests of one file in SCHEMA, in file order; MalformedRequestFile says why not."""
    if not content:
        raise MalformedRequestFile(f"{path}: empty file (0 bytes)")
    try:
        table = pq.read_table(pa.BufferReader(content))
    except Exception as exc:  # noqa: BLE001  (any failure to decode the bytes means: not Parquet)
        raise MalformedRequestFile(f"{path}: not a readable Parquet file ({type(exc).__name__}: "
                                   f"{_one_line(exc)})") from None
    missing = [f.name for f in SCHEMA if f.name not in table.column_names]
    if missing:
        raise MalformedRequestFile(f"{path}: lacks column(s) {missing}; a request file has "
                                   f"{SCHEMA.names}")
    if table.num_rows == 0:
        raise MalformedRequestFile(f"{path}: no rows (a request file holds at least one request)")
    try:
        table = table.select(SCHEMA.names).cast(SCHEMA)
    except Exception as exc:  # noqa: BLE001  (ArrowInvalid / NotImplemented: types do not fit)
        have = {f.name: str(f.type) for f in table.schema if f.name in SCHEMA.names}
        raise MalformedRequestFile(f"{path}: column types {have} do not fit the request schema "
                                   f"({_one_line(exc)})") from None
    try:
        return requests_from_table(table)
    except SparkGNNError as exc:
        raise MalformedRequestFile(f"{path}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:397] + "..."
