"""handler: one micro-batch without Spark. Answers equal QueryEngine.answer; invalid requests are
error rows naming their problem, as are requests over the service's caps; malformed files are
dead-lettered, and so are oversize files and a decompression bomb (from its footer, never
decoded), and the next micro-batch is answered; the degree policy answers
cheap requests first, FIFO in arrival order; timing columns add up."""

import io
import logging
import os
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from streaming_helpers import assert_rows_equal_answers, bad_requests, engine_answers, write_malformed

from sparkgnn.deadletter import DeadLetter, read_dead_letters
from sparkgnn.serving.request import requests_table
from sparkgnn.streaming.grouping import get_grouping
from sparkgnn.streaming.handler import MicroBatchHandler
from sparkgnn.streaming.intake import FileLimits, IncomingFile
from sparkgnn.streaming.sink import AnswerSink, read_answers, read_batch_meta


def as_file(requests, name, arrival):
    buf = io.BytesIO()
    pq.write_table(requests_table(requests), buf)
    return IncomingFile(f"file:/in/{name}", arrival, buf.getvalue())


def make_handler(tmp_path, engine, setup, grouping="degree", **options):
    return MicroBatchHandler(
        engine,
        setup.graph,
        get_grouping(grouping, **options),
        AnswerSink(str(tmp_path / "out")),
        DeadLetter(str(tmp_path / "dead")),
    )


def test_micro_batch_answers_equal_engine_and_errors_name_the_problem(tmp_path, setup, engine, caplog):
    good = setup.requests
    bad = bad_requests(setup.graph, good[0])
    files = [as_file([r], f"{r.request_id}.parquet", 100.0 + i) for i, r in enumerate(good)]
    files.append(as_file(list(bad.values()), "bad.parquet", 90.0))  # 3 invalid requests, one file
    files.append(as_file([good[0]], "again.parquet", 200.0))  # duplicate request id
    mal = write_malformed(str(tmp_path / "mal"))
    for name in mal:
        files.append(IncomingFile(f"file:/in/{name}", 95.0, open(tmp_path / "mal" / name, "rb").read()))
    caplog.set_level(logging.INFO, logger="sparkgnn")
    handler = make_handler(tmp_path, engine, setup)
    progress = handler.handle(files, 3)

    t = read_answers(str(tmp_path / "out"))
    assert_rows_equal_answers(t.filter(t.column("error").is_null()), engine_answers(engine, good))
    rows = {(r["request_id"], r["file"]): r for r in t.to_pylist()}
    for (rid, _), words in zip([(r.request_id, None) for r in bad.values()], bad, strict=True):
        row = rows[(rid, "file:/in/bad.parquet")]
        assert row["error"].startswith("invalid request:") and words in row["error"], row["error"]
        assert row["h"] is None and row["qid"] == good[0].qid.tolist()
    dup = rows[(good[0].request_id, "file:/in/again.parquet")]
    assert "duplicate request id" in dup["error"]
    assert t.num_rows == len(good) + len(bad) + 1 and set(t.column("batch_id").to_pylist()) == {3}

    reasons = {os.path.basename(d["file"]): d for d in read_dead_letters(str(tmp_path / "dead"))}
    assert set(reasons) == set(mal)
    for name, words in mal.items():
        assert words in reasons[name]["reason"] and reasons[name]["batch_id"] == 3
    assert (progress.requests, progress.errors, progress.dead_letters) == (t.num_rows, len(bad) + 1, len(mal))
    lines = caplog.messages
    assert lines[-1] == progress.line() and sum("dead-lettered" in l for l in lines) == len(mal) + 1
    meta = read_batch_meta(str(tmp_path / "out"), 3)
    assert len(meta["files"]) == len(files) and len(meta["dead_letters"]) == len(mal)


def test_timings_add_up_and_degree_serves_cheap_requests_first(tmp_path, setup, engine):
    now = time.time()  # real arrival times: aging (30 s default) must not kick in
    files = [as_file([r], f"{r.request_id}.parquet", now - 1 + 0.01 * i) for i, r in enumerate(setup.requests[::-1])]
    handler = make_handler(tmp_path, engine, setup, "degree", threshold=1e12)
    handler.handle(files, 0)
    t = read_answers(str(tmp_path / "out")).to_pylist()
    assert [r["order"] for r in t] == list(range(len(t)))
    costs = [r["cost"] for r in t]
    assert costs == sorted(costs) and costs[0] < costs[-1]
    assert {r["engine_batch"] for r in t} == {0}  # T_d above the total: one engine batch
    for r in t:
        assert r["queue_s"] == pytest.approx(r["start_ts"] - r["arrival_ts"])
        assert r["latency_s"] == pytest.approx(r["queue_s"] + r["service_s"])
        assert r["service_s"] > 0 and r["mode"] == "exact" and r["grouping"] == "degree"
    starts = [r["start_ts"] for r in t]
    assert starts == sorted(starts)


def test_fifo_serves_in_arrival_order(tmp_path, setup, engine):
    reqs = setup.requests
    arrivals = np.linspace(10.0, 11.0, len(reqs))[::-1]  # last request arrived first
    files = [as_file([r], f"{r.request_id}.parquet", a) for r, a in zip(reqs, arrivals, strict=True)]
    handler = make_handler(tmp_path, engine, setup, "fifo", batch_size=2)
    handler.handle(files, 0)
    t = read_answers(str(tmp_path / "out")).to_pylist()
    assert [r["request_id"] for r in t] == [r.request_id for r in reqs[::-1]]
    assert [r["engine_batch"] for r in t] == [i // 2 for i in range(len(reqs))]


def bomb_bytes(width: int = 1 << 20) -> bytes:
    """A request file of one query with `width` zero features, written plain (no dictionary) and
    zstd-compressed: a few KiB on disk, 4 MiB of column data once decompressed."""
    from sparkgnn.serving import Request

    bomb = Request("bomb", np.array([10**9]), np.zeros((1, width), np.float32), np.empty(0), np.empty(0))
    buf = io.BytesIO()
    pq.write_table(requests_table([bomb]), buf, use_dictionary=False, compression="zstd")
    return buf.getvalue()


def test_a_decompression_bomb_and_an_oversize_file_are_dead_lettered_and_the_stream_moves_on(
    tmp_path, setup, engine, monkeypatch
):
    from sparkgnn.streaming import intake

    decoded: list[str] = []
    real_parse = intake.parse_request_bytes
    monkeypatch.setattr(intake, "parse_request_bytes", lambda c, name: decoded.append(name) or real_parse(c, name))
    bomb = bomb_bytes()
    assert len(bomb) < 64 * 1024
    limits = FileLimits(max_bytes=256 * 1024, max_decompressed_bytes=1 << 20)
    handler = MicroBatchHandler(
        engine,
        setup.graph,
        get_grouping("fifo"),
        AnswerSink(str(tmp_path / "out")),
        DeadLetter(str(tmp_path / "dead")),
        limits=limits,
    )
    files = [
        IncomingFile("file:/in/bomb.parquet", 1.0, bomb),
        IncomingFile("file:/in/huge.parquet", 2.0, None, length=5 << 20),  # listed, never collected
        as_file(setup.requests[:1], "good.parquet", 3.0),
    ]
    progress = handler.handle(files, 0)
    assert (progress.requests, progress.dead_letters) == (1, 2)
    assert decoded == ["good.parquet"]  # the bomb was refused from its footer, never decoded
    reasons = {os.path.basename(d["file"]): d for d in read_dead_letters(str(tmp_path / "dead"))}
    assert "footer declares" in reasons["bomb.parquet"]["reason"]
    assert "max_file_decompressed_bytes" in reasons["bomb.parquet"]["reason"]
    assert "max_file_bytes" in reasons["huge.parquet"]["reason"] and reasons["huge.parquet"]["bytes"] == 5 << 20
    assert not os.path.exists(tmp_path / "dead" / "huge.parquet")  # its bytes were never read
    # the stream moves on: the next micro-batch is answered
    handler.handle([as_file(setup.requests[1:2], "next.parquet", 4.0)], 1)
    t = read_answers(str(tmp_path / "out"))
    assert t.num_rows == 2 and not any(t.column("error").to_pylist())
    assert_rows_equal_answers(t, engine_answers(engine, setup.requests[:2]))


def test_requests_over_the_service_caps_are_error_rows(tmp_path, setup, engine):
    request = next(r for r in setup.requests if r.num_edges > 1)
    handler = MicroBatchHandler(
        engine,
        setup.graph,
        get_grouping("fifo"),
        AnswerSink(str(tmp_path / "out")),
        DeadLetter(str(tmp_path / "dead")),
        limits=FileLimits(max_edges=request.num_edges - 1),
    )
    handler.handle([as_file([request], "big.parquet", 1.0)], 0)
    (error,) = read_answers(str(tmp_path / "out")).column("error").to_pylist()
    assert f"has {request.num_edges} edges; this service takes at most {request.num_edges - 1}" in error
