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
file's, and a client reading the answers should learn about it under its request id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sparkgnn.errors import SparkGNNError
from sparkgnn.serving.request import Request, RequestError, parse_request_bytes


class MalformedRequestFile(SparkGNNError, ValueError):
    """A request file cannot be read as requests; the message says why."""


@dataclass
class IncomingFile:
    """One file of a micro-batch, as the binaryFile source reports it."""

    path: str
    arrival_ts: float  # the file's modification time (epoch seconds): when it appeared
    content: bytes | None
    vanished: bool = False  # listed by the source, gone from disk before it could be read

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


def parse_request_file(content: bytes | None, path: str = "<bytes>") -> list[Request]:
    """The requests of one file in SCHEMA, in file order; MalformedRequestFile says why not (the
    same checks and words as serving.request.read_requests: parse_request_bytes)."""
    try:
        return parse_request_bytes(content, path)
    except RequestError as exc:
        raise MalformedRequestFile(str(exc)) from None
