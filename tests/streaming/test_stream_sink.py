"""sink: one atomic directory per batch id; a replayed batch replaces its output (never adds);
readers see committed batches only; the output is bound to one checkpoint."""

import json
import os

import numpy as np
import pytest

from sparkgnn.streaming.sink import (
    ANSWER_SCHEMA,
    AnswerSink,
    SinkError,
    answers_table,
    committed_batch_ids,
    read_answers,
    read_batch_meta,
)


def row(batch_id, rid, h=None, error=None):
    qid = np.array([5, 6], np.int64)
    return {
        "batch_id": batch_id,
        "request_id": rid,
        "file": f"{rid}.parquet",
        "num_queries": 2,
        "qid": qid,
        "h": h,
        "pred": None if h is None else h.argmax(1),
        "error": error,
        "arrival_ts": 1.0,
        "start_ts": 2.0,
        "done_ts": 3.5,
        "queue_s": 1.0,
        "service_s": 1.5,
        "latency_s": 2.5,
        "engine_batch": 0,
        "order": 0,
        "cost": 7.0,
        "mode": "full",
        "grouping": "fifo",
        "breakdown": None,
    }


def test_answers_table_keeps_matrices_and_nulls():
    h = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = answers_table([row(0, "a", h), row(0, "b", error="invalid request: x")])
    assert t.schema == ANSWER_SCHEMA
    a, b = t.to_pylist()
    assert a["h"] == h.tolist() and a["pred"] == [2, 2] and a["error"] is None
    assert b["h"] is None and b["pred"] is None and b["qid"] == [5, 6] and b["error"].startswith("invalid")
    assert answers_table([]).num_rows == 0


def test_replayed_batch_replaces_its_output(tmp_path):
    sink = AnswerSink(str(tmp_path / "out"))
    h = np.ones((2, 3), np.float32)
    sink.write(0, answers_table([row(0, "a", h), row(0, "b", h)]), {"attempt": 1})
    sink.write(1, answers_table([row(1, "c", h)]), {"attempt": 1})
    sink.write(1, answers_table([row(1, "c", 2 * h)]), {"attempt": 2})  # the replay
    t = read_answers(sink.out)
    assert t.column("request_id").to_pylist() == ["a", "b", "c"]
    assert t.to_pylist()[2]["h"] == (2 * h).tolist()
    assert read_batch_meta(sink.out, 1)["attempt"] == 2
    assert committed_batch_ids(sink.out) == [0, 1]
    assert os.listdir(os.path.join(sink.out, "_tmp")) == []  # nothing left behind


def test_uncommitted_temp_output_is_invisible_and_swept(tmp_path):
    sink = AnswerSink(str(tmp_path / "out"))
    half = os.path.join(sink.out, "_tmp", "batch_id=3-123-abc")  # a writer killed mid-batch
    os.makedirs(half)
    open(os.path.join(half, "part-00000.parquet"), "wb").close()
    assert committed_batch_ids(sink.out) == [] and read_answers(sink.out).num_rows == 0
    sink.sweep()
    assert os.listdir(os.path.join(sink.out, "_tmp")) == []


def test_output_is_bound_to_one_checkpoint(tmp_path):
    sink = AnswerSink(str(tmp_path / "out"))
    sink.check_binding(None, str(tmp_path / "ck"))  # fresh output, fresh checkpoint
    sink.bind("q-1", str(tmp_path / "ck"))
    sink.write(0, answers_table([row(0, "a")]), {})
    sink.check_binding("q-1", str(tmp_path / "ck"))  # restart with the same checkpoint
    with pytest.raises(SinkError, match="batch ids would restart at 0"):
        sink.check_binding(None, str(tmp_path / "new-ck"))
    with pytest.raises(SinkError, match="belongs to query q-1"):
        sink.check_binding("q-2", str(tmp_path / "other-ck"))
    assert json.load(open(os.path.join(sink.out, "_stream.json")))["query_id"] == "q-1"
