"""AnswerSink: the job's output, one directory per micro-batch, written atomically and idempotently.

    <out>/batch_id=<id>/part-00000.parquet   one row per request (ANSWER_SCHEMA)
    <out>/batch_id=<id>/_batch.json          files, dead letters, timings of the micro-batch
    <out>/_stream.json                       the checkpoint (query id) this output belongs to
    <out>/_tmp/                              work area (ignored by readers; swept at start-up)

WHY this gives exactly-once output together with Spark's checkpoint. Spark's file source writes
the list of files of batch N to the checkpoint (offsets/N, sources/0/N) BEFORE running the batch
and marks it done (commits/N) only AFTER foreachBatch returns. A crash anywhere in between makes
the restarted query run batch N again, with the same id and the same files (and no file ever
belongs to two batch ids: the source remembers every file it has handed out). So the sink must
make "batch N's output" appear all at once and, when batch N runs again, replace it rather than
add to it:
  * all files of a batch are written into a fresh temp dir under <out>/_tmp, fsynced, then the
    temp dir is renamed to batch_id=<id> (a rename within one file system is atomic: a reader sees
    the whole batch or none of it);
  * a replay renames the old batch_id=<id> aside first, then the new one into place, then deletes
    the old one. A crash between the two renames leaves no batch_id=<id> at all, and since Spark
    has not committed N, the next start writes it again.
Answers are deterministic (FULL/HE/SRPE/EXACT, and NS is seeded per request id), so a replayed
batch has the same answers; only its timing columns differ.

The output directory is bound to ONE checkpoint (_stream.json holds its query id): a new
checkpoint restarts batch ids at 0 and would overwrite earlier answers, so the job refuses an
output directory that belongs to another checkpoint (job.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkgnn.errors import SparkGNNError

ANSWER_SCHEMA = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("request_id", pa.string()),
        ("file", pa.string()),  # the request file, as the source reported its path
        ("num_queries", pa.int64()),
        ("qid", pa.list_(pa.int64())),  # request order; null when the request could not be parsed
        # typed graphs: the node type of each qid (null on a homogeneous graph's rows)
        ("qtype", pa.list_(pa.string())),
        # [B][out]; null for error rows; typed: a query of a type the model gives no output has a null row
        ("h", pa.list_(pa.list_(pa.float32()))),
        ("pred", pa.list_(pa.int64())),  # argmax per query (logits models); null otherwise
        ("error", pa.string()),  # null when answered; else what is wrong
        ("arrival_ts", pa.float64()),  # file modification time (epoch s): when the request arrived
        ("start_ts", pa.float64()),  # when its answer started
        ("done_ts", pa.float64()),  # when its answer was ready
        ("queue_s", pa.float64()),  # start - arrival: trigger wait, Spark, requests ahead of it
        ("service_s", pa.float64()),  # done - start: QueryEngine.answer (or validation) only
        ("latency_s", pa.float64()),  # done - arrival: end to end, file arrival to answer
        ("engine_batch", pa.int32()),  # group index within the micro-batch (grouping policy)
        ("order", pa.int32()),  # answer position within the micro-batch
        ("cost", pa.float64()),  # the grouping cost estimate (grouping.RequestCost)
        ("mode", pa.string()),
        ("grouping", pa.string()),
        ("breakdown", pa.string()),  # JSON of Answer.breakdown
    ]
)
BATCH_DIR = re.compile(r"^batch_id=(\d+)$")
PART_FILE = "part-00000.parquet"
META_FILE = "_batch.json"
BINDING_FILE = "_stream.json"
TMP_DIR = "_tmp"


class SinkError(SparkGNNError):
    """The output directory cannot be used (bound to another checkpoint, not a directory)."""


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    try:
        _fsync_file(path)
    except OSError:  # some file systems do not allow opening a directory for fsync
        pass


def answers_table(rows: list[dict]) -> pa.Table:
    """Rows (dicts with ANSWER_SCHEMA's keys; qid/h/pred as numpy arrays or None) -> a table. A
    typed graph's rows carry h and pred as lists with one entry per query, None for a query the
    model gives no output (typed rows are converted value by value; homogeneous ones stay
    vectorised)."""
    cols: dict[str, list] = {f.name: [] for f in ANSWER_SCHEMA}
    for r in rows:
        for name in cols:
            cols[name].append(r.get(name))
    typed = any(v is not None for v in cols["qtype"])
    arrays = []
    for f in ANSWER_SCHEMA:
        if typed and f.name in ("h", "pred"):
            arrays.append(pa.array([_plain(v) for v in cols[f.name]], type=f.type))
        elif f.name == "h":
            arrays.append(_matrix_list(cols["h"]))
        elif f.name in ("qid", "pred"):
            arrays.append(_vector_list(cols[f.name], pa.int64()))
        else:
            arrays.append(pa.array(cols[f.name], type=f.type))
    return pa.Table.from_arrays(arrays, schema=ANSWER_SCHEMA)


def _plain(value):
    """A typed row's h or pred as Python lists (numpy rows and scalars converted; None kept)."""
    if value is None:
        return None
    return [None if v is None else np.asarray(v).tolist() for v in value]


def _vector_list(values: list, value_type) -> pa.Array:
    """list<value_type> from 1-D numpy arrays (None -> null), without a per-element loop."""
    lengths = np.array([0 if v is None else len(v) for v in values], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    parts = [np.asarray(v) for v in values if v is not None]
    flat = np.concatenate(parts) if parts else np.empty(0)
    mask = pa.array([v is None for v in values], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, value_type), mask=mask)


def _matrix_list(values: list) -> pa.Array:
    """list<list<float32>> from [B, out] float32 matrices (None -> null)."""
    rows_per = np.array([0 if v is None else v.shape[0] for v in values], np.int64)
    parts = [np.asarray(v, np.float32) for v in values if v is not None]
    widths = (
        np.concatenate([np.full(p.shape[0], p.shape[1], np.int64) for p in parts]) if parts else np.empty(0, np.int64)
    )
    inner_offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int32)
    flat = np.concatenate([p.reshape(-1) for p in parts]) if parts else np.empty(0, np.float32)
    inner = pa.ListArray.from_arrays(pa.array(inner_offsets), pa.array(flat, pa.float32()))
    outer_offsets = np.concatenate([[0], np.cumsum(rows_per)]).astype(np.int32)
    mask = pa.array([v is None for v in values], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(outer_offsets), inner, mask=mask)


class AnswerSink:
    def __init__(self, out: str):
        self.out = os.path.abspath(out)
        if os.path.exists(self.out) and not os.path.isdir(self.out):
            raise SinkError(f"--out {self.out} exists and is not a directory")
        os.makedirs(os.path.join(self.out, TMP_DIR), exist_ok=True)

    def batch_dir(self, batch_id: int) -> str:
        return os.path.join(self.out, f"batch_id={int(batch_id)}")

    def sweep(self) -> None:
        """Remove leftovers of a killed writer (temp dirs, replaced batches) under <out>/_tmp.
        Only at start-up: one job writes one output directory at a time."""
        tmp = os.path.join(self.out, TMP_DIR)
        for name in os.listdir(tmp):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)

    def write(self, batch_id: int, table: pa.Table, meta: dict) -> str:
        """Make batch_id's output exactly `table` + `meta` (see module doc). Returns its dir."""
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp = os.path.join(self.out, TMP_DIR, f"batch_id={int(batch_id)}-{tag}")
        os.makedirs(tmp)
        part = os.path.join(tmp, PART_FILE)
        pq.write_table(table, part)
        _fsync_file(part)
        with open(os.path.join(tmp, META_FILE), "w") as fh:
            json.dump(meta, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        final = self.batch_dir(batch_id)
        old = None
        if os.path.exists(final):  # a replayed batch: replace, never add
            old = os.path.join(self.out, TMP_DIR, f"replaced-{int(batch_id)}-{tag}")
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return final

    # -- binding to a checkpoint ----------------------------------------------------------------
    def binding(self) -> dict | None:
        path = os.path.join(self.out, BINDING_FILE)
        if not os.path.exists(path):
            return None
        with open(path) as fh:
            return json.load(fh)

    def bind(self, query_id: str, checkpoint: str) -> None:
        doc = {"query_id": str(query_id), "checkpoint": os.path.abspath(checkpoint)}
        tmp = os.path.join(self.out, TMP_DIR, f"{BINDING_FILE}.{uuid.uuid4().hex[:8]}")
        with open(tmp, "w") as fh:
            json.dump(doc, fh)
        os.replace(tmp, os.path.join(self.out, BINDING_FILE))

    def check_binding(self, checkpoint_query_id: str | None, checkpoint: str) -> None:
        """Refuse an output directory written under another checkpoint (module doc)."""
        bound = self.binding()
        if checkpoint_query_id is None:
            if bound is not None or committed_batch_ids(self.out):
                raise SinkError(
                    f"--out {self.out} already holds answers of a streaming query "
                    f"({(bound or {}).get('checkpoint', 'unknown checkpoint')}), but checkpoint "
                    f"{os.path.abspath(checkpoint)} is new: its batch ids would restart at 0 and "
                    f"overwrite them. Restart with the original --checkpoint or use a new --out."
                )
        elif bound is not None and bound.get("query_id") != checkpoint_query_id:
            raise SinkError(
                f"--out {self.out} belongs to query {bound.get('query_id')} (checkpoint "
                f"{bound.get('checkpoint')}), not to query {checkpoint_query_id} of checkpoint "
                f"{os.path.abspath(checkpoint)}"
            )


def committed_batch_ids(out: str) -> list[int]:
    if not os.path.isdir(out):
        return []
    ids = []
    for name in os.listdir(out):
        m = BATCH_DIR.match(name)
        if m and os.path.isdir(os.path.join(out, name)):
            ids.append(int(m.group(1)))
    return sorted(ids)


def read_batch_meta(out: str, batch_id: int) -> dict:
    with open(os.path.join(out, f"batch_id={int(batch_id)}", META_FILE)) as fh:
        return json.load(fh)


def read_answers(out: str) -> pa.Table:
    """Every committed batch's rows (batch id order), in ANSWER_SCHEMA; empty when none. A batch
    being replaced at this very moment (its directory renamed aside) is skipped: poll again."""
    tables = []
    for b in committed_batch_ids(out):
        try:
            tables.append(pq.read_table(os.path.join(out, f"batch_id={b}", PART_FILE), schema=ANSWER_SCHEMA))
        except FileNotFoundError:
            continue
    return pa.concat_tables(tables) if tables else ANSWER_SCHEMA.empty_table()
