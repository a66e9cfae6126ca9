"""MicroBatchHandler: what foreachBatch(df, batch_id) does with one micro-batch of request files.

    1. parse every file (intake.py); an unreadable file goes to the dead-letter directory with
       its reason and is otherwise skipped;
    2. validate every request against G (Request.problems): an invalid request becomes an error
       row naming its problems, as does a request id seen twice in the micro-batch;
    3. estimate each request's cost and answer the queue group by group in the order the grouping
       policy chooses (grouping.py), each request by the ONE QueryEngine built at start-up, so
       an answer equals QueryEngine.answer on that request;
    4. write the micro-batch's rows atomically under its batch id (sink.py) and log one
       progress line (progress.py).

Errors a request causes (a deliberate refusal, sparkgnn.errors.USER_ERRORS, or a ValueError from
the engine, e.g. RequestError) are error rows; anything else is a fault of the job, not of the
request, and propagates: the query stops without committing the batch, and a restart from the
checkpoint runs it again. Turning such an exception into an error row would commit a wrong answer
exactly once, which is worse.

On a typed graph (a TypedGraphData G) the same steps read typed request files
(serving/typed_request.py) into TypedRequests, which the engine, a TypedQueryEngine, answers; a
row's `qtype` names the node type of each of its queries, and h / pred hold one entry per query,
null for a query of a type the model gives no output (typed_outputs).

`handle(files, batch_id)` is the whole logic on plain Python values, so tests drive it without
Spark; `__call__(df, batch_id)` is the foreachBatch adapter: it lists path, modification time and
length of the micro-batch's files, collects the content only of those within the limits' byte
cap (a filter on `length`, which the binaryFile source applies before reading a file: an oversize
file is never read, let alone collected; it is dead-lettered by its listed size), then adds the
files the checkpoint's source log assigns to the batch but the DataFrame lacks (Spark drops 0-byte
files from it, sourcelog.py; read from disk when within the cap, they are refused like any other
unreadable file).
"""

from __future__ import annotations

import json
import logging
import os
import time

import numpy as np
import pyarrow as pa

from sparkgnn.errors import USER_ERRORS
from sparkgnn.graph.typed import TypedGraphData
from sparkgnn.serving.online.config import over_caps
from sparkgnn.streaming.grouping import request_cost, run_schedule
from sparkgnn.streaming.intake import (
    FileLimits,
    IncomingFile,
    MalformedRequestFile,
    Pending,
    local_path,
    oversize_reason,
    parse_request_file,
)
from sparkgnn.streaming.progress import BatchProgress, batch_progress
from sparkgnn.streaming.sink import answers_table
from sparkgnn.streaming.sourcelog import LoggedFile, batch_files

log = logging.getLogger(__name__)


def _seconds(table: pa.Table) -> list[float]:
    """The `modificationTime` column of a collected listing as epoch seconds."""
    mtime_us = table.column("modificationTime").cast(pa.int64()).to_numpy(zero_copy_only=False)
    return [float(t) / 1e6 for t in mtime_us.tolist()]


def _json_safe(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def typed_outputs(request, answer) -> tuple[list, list | None]:
    """A TypedAnswer as one output row per query of the request (its `qid` order): h[i] and
    pred[i] are the query's output and argmax, None for a query of a type the model gives no
    output; pred is None for a model that outputs no logits."""
    h: list = []
    pred: list | None = None if answer.pred is None else []
    for t, (ids, _) in request.nodes.items():
        n = int(np.asarray(ids).size)
        rows = answer.h.get(t)
        h += [None] * n if rows is None else list(rows.numpy())
        if pred is not None:
            p = answer.pred.get(t)
            pred += [None] * n if p is None else p.tolist()
    return h, pred


def read_logged(entry: LoggedFile, max_bytes: int | None = None) -> IncomingFile:
    """A file of the source log that the DataFrame lacked, with its bytes as they are on disk now
    (Spark skipped it for being empty, so usually none); one grown past `max_bytes` since is not
    read (its size only)."""
    try:
        with open(entry.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if max_bytes is not None and size > max_bytes:
                return IncomingFile(f"file:{entry.path}", entry.arrival_ts, None, length=size)
            return IncomingFile(f"file:{entry.path}", entry.arrival_ts, fh.read())
    except FileNotFoundError:
        return IncomingFile(f"file:{entry.path}", entry.arrival_ts, b"", vanished=True)


class MicroBatchHandler:
    def __init__(
        self,
        engine,
        graph,
        grouping,
        sink,
        dead_letter,
        clock=time.time,
        checkpoint: str | None = None,
        limits: FileLimits | None = None,
    ):
        self.engine = engine
        self.limits = limits or FileLimits()
        self.checkpoint = checkpoint  # whose source log lists every file of a batch
        self.graph = graph
        self.grouping = grouping
        self.sink = sink
        self.dead_letter = dead_letter
        self.clock = clock
        self.cost = request_cost(graph)
        self.typed = isinstance(graph, TypedGraphData)  # typed request files, TypedRequests
        self.mode = getattr(engine, "mode_name", "?")
        self.batches_handled = 0
        self.requests_handled = 0
        self.last_batch_id: int | None = None
        self.history: list[BatchProgress] = []

    # -- foreachBatch adapter ----------------------------------------------------------------
    def __call__(self, df, batch_id) -> None:
        cap = int(self.limits.max_bytes)
        listed = df.select("path", "modificationTime", "length").toArrow()
        files = [
            IncomingFile(p, t, None, length=n)
            for p, t, n in zip(
                listed.column("path").to_pylist(), _seconds(listed), listed.column("length").to_pylist(), strict=True
            )
            if n is not None and n > cap
        ]
        table = df.where(f"length <= {cap}").select("path", "modificationTime", "content").toArrow()
        files += [
            IncomingFile(p, t, c)
            for p, t, c in zip(
                table.column("path").to_pylist(), _seconds(table), table.column("content").to_pylist(), strict=True
            )
        ]
        files += self.undelivered(files, int(batch_id))
        self.handle(files, int(batch_id))

    def undelivered(self, delivered: list[IncomingFile], batch_id: int) -> list[IncomingFile]:
        """The files the source consumed for this batch (checkpoint source log) that are not among
        `delivered`: without them a 0-byte request file would vanish unanswered (module doc)."""
        logged = batch_files(self.checkpoint, batch_id) if self.checkpoint else None
        if logged is None:
            return []
        got = {local_path(f.path) for f in delivered}
        return [read_logged(entry, self.limits.max_bytes) for entry in logged if entry.path not in got]

    # -- the micro-batch -----------------------------------------------------------------------
    def handle(self, files: list[IncomingFile], batch_id: int) -> BatchProgress:
        started = self.clock()
        files = sorted(files, key=lambda f: (f.arrival_ts, f.path))
        pending, dead = self._intake(files, batch_id)
        self._check(pending)
        rows: list[dict] = []
        grouping_name = self.grouping.name

        def serve(group_index: int, group: list[Pending]) -> None:
            for p in group:
                start = self.clock()
                answer, error = None, p.error
                if error is None:
                    try:
                        answer = self.engine.answer(p.request)
                    except USER_ERRORS + (ValueError,) as exc:
                        error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                done = self.clock()
                rows.append(self._row(batch_id, p, answer, error, start, done, group_index, len(rows), grouping_name))

        run_schedule(self.grouping, pending, self.clock, serve)
        answered = self.clock()
        meta = {
            "batch_id": batch_id,
            "files": [f.path for f in files],
            "dead_letters": dead,
            "requests": len(rows),
            "errors": sum(1 for r in rows if r["error"]),
            "started_ts": started,
            "answered_ts": answered,
            "written_ts": self.clock(),
            "mode": self.mode,
            **self.grouping.describe(),
        }
        self.sink.write(batch_id, answers_table(rows), meta)
        progress = batch_progress(
            batch_id, len(files), rows, len(dead), self.clock() - started, self.mode, grouping_name
        )
        self.history.append(progress)
        self.batches_handled += 1
        self.requests_handled += len(rows)
        self.last_batch_id = batch_id
        log.info(progress.line())
        return progress

    def _intake(self, files, batch_id):
        pending: list[Pending] = []
        dead: list[dict] = []
        for f in files:
            try:
                if f.vanished:
                    raise MalformedRequestFile(
                        f"{f.name}: the stream source listed this file but it was gone before it could be read"
                    )
                if f.content is None and f.length is not None:
                    raise MalformedRequestFile(oversize_reason(f.name, f.length, self.limits))
                requests = parse_request_file(f.content, f.name, self.limits, typed=self.typed)
            except MalformedRequestFile as exc:
                reason = str(exc)
                oversize = f.length if f.content is None else len(f.content)
                unread = f.content is None or oversize > self.limits.max_bytes
                self.dead_letter.put(
                    f.name,
                    None if unread else f.content,
                    reason,
                    batch_id,
                    f.path,
                    f.arrival_ts,
                    size=oversize if unread else None,
                )
                dead.append({"file": f.path, "reason": reason})
                log.warning(f"stream batch {batch_id}: dead-lettered {reason}")
                continue
            for r in requests:
                pending.append(Pending(r, f.path, f.arrival_ts, seq=len(pending)))
        return pending, dead

    def _check(self, pending: list[Pending]) -> None:
        first_file: dict[str, str] = {}
        for p in pending:
            if p.request_id in first_file:
                p.error = (
                    f"duplicate request id {p.request_id!r} in this micro-batch (first in "
                    f"{first_file[p.request_id]}); only the first one is answered"
                )
                continue
            first_file[p.request_id] = p.file
            too_large = over_caps(p.request, self.limits.max_queries, self.limits.max_edges)
            if too_large:
                p.error = too_large
                continue
            p.problems = p.request.problems(self.graph)
            if p.problems:
                p.error = "invalid request: " + "; ".join(p.problems)
            else:
                p.cost = self.cost(p.request)

    def _row(self, batch_id, p: Pending, answer, error, start, done, group_index, order, grouping):
        breakdown = h = pred = None
        if answer is not None:
            breakdown = json.dumps({k: _json_safe(v) for k, v in answer.breakdown.items()}, sort_keys=True)
            h, pred = typed_outputs(p.request, answer) if self.typed else (answer.h, answer.pred)
        return {
            "batch_id": batch_id,
            "request_id": p.request_id,
            "file": p.file,
            "num_queries": p.request.batch_size,
            "qid": p.request.qid,
            "qtype": getattr(p.request, "qtype", None),  # TypedRequest's; None on a homogeneous row
            "h": h,
            "pred": pred,
            "error": error,
            "arrival_ts": p.arrival_ts,
            "start_ts": start,
            "done_ts": done,
            "queue_s": start - p.arrival_ts,
            "service_s": done - start,
            "latency_s": done - p.arrival_ts,
            "engine_batch": group_index,
            "order": order,
            "cost": p.cost,
            "mode": self.mode,
            "grouping": grouping,
            "breakdown": breakdown,
        }
