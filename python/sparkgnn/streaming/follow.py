"""SinkFollower: the driver's view of a micro-batch handler that runs elsewhere (Spark Connect).

Why: with a Spark Connect session, `foreachBatch(handler)` pickles the handler and runs it in a
Python process of the Connect server (one per query, kept for its micro-batches), not in this
process. The handler still answers every request and writes each micro-batch through the sink
(exactly-once as before: sink.py), but its counters, history and log lines stay in that process
(its logger's, in the server's Python process). The run loop needs them here: how many micro-batches this
run handled (max_batches, stop_when), the last batch id (to know it was committed), and one
progress line per batch for the console.

The sink already holds all of it: every handled micro-batch is a `batch_id=<id>` directory with
its answers (one row per request, with latencies and errors) and meta.json (files, dead letters,
start and write times). The follower snapshots the directories at start and, on each `poll()`,
reads the ones written since (a new directory, or a replayed batch's new `written_ts`), rebuilding
the handler's lines: a "dead-lettered" line per refused file and the progress line
(progress.batch_progress over the batch's rows; `seconds` runs to the sink write instead of just
after it). It offers the attributes the run loop and callbacks read of a MicroBatchHandler:
batches_handled, requests_handled, last_batch_id, history.
"""

from __future__ import annotations

import logging
import os

import pyarrow.parquet as pq

from sparkgnn.streaming.progress import BatchProgress, batch_progress
from sparkgnn.streaming.sink import PART_FILE, committed_batch_ids, read_batch_meta

log = logging.getLogger(__name__)


class SinkFollower:
    def __init__(self, out: str):
        self.out = os.path.abspath(out)
        self.batches_handled = 0
        self.requests_handled = 0
        self.last_batch_id: int | None = None
        self.history: list[BatchProgress] = []
        self._written = {b: self._written_ts(b) for b in committed_batch_ids(self.out)}

    def _written_ts(self, batch_id: int) -> float | None:
        try:
            return read_batch_meta(self.out, batch_id).get("written_ts")
        except (FileNotFoundError, ValueError):  # being replaced right now, or half-read: next poll
            return None

    def poll(self) -> list[BatchProgress]:
        """Log and count the micro-batches written since the last poll (batch id order)."""
        new = []
        for batch_id in committed_batch_ids(self.out):
            directory = os.path.join(self.out, f"batch_id={batch_id}")
            try:
                meta = read_batch_meta(self.out, batch_id)
                if meta.get("written_ts") == self._written.get(batch_id):
                    continue
                rows = pq.read_table(os.path.join(directory, PART_FILE)).to_pylist()
            except (FileNotFoundError, ValueError):
                continue  # replaced between listing and reading (sink.write): the next poll sees it
            self._written[batch_id] = meta.get("written_ts")
            for dead in meta.get("dead_letters", []):
                log.warning(f"stream batch {batch_id}: dead-lettered {dead.get('reason')}")
            progress = batch_progress(
                batch_id,
                len(meta.get("files", [])),
                rows,
                len(meta.get("dead_letters", [])),
                float(meta.get("written_ts", 0.0)) - float(meta.get("started_ts", 0.0)),
                str(meta.get("mode", "?")),
                str(meta.get("grouping", rows[0]["grouping"] if rows else "?")),
            )
            self.history.append(progress)
            self.batches_handled += 1
            self.requests_handled += len(rows)
            self.last_batch_id = batch_id
            log.info(progress.line())
            new.append(progress)
        return new
