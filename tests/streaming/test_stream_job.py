"""The streaming job end to end on Spark: in-process (session fixture) answers equal
QueryEngine.answer with dead letters and error rows; a batch whose commit never reached the
checkpoint is replayed without duplicates; a job process SIGKILLed mid-stream and restarted from
its checkpoint answers every request exactly once; a stale PE store, a missing store, an unknown
mode and an output of another checkpoint are refused before Spark starts."""

import logging
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from streaming_helpers import (
    assert_rows_equal_answers,
    bad_requests,
    engine_answers,
    job_command,
    job_env,
    write_malformed,
    write_one_per_file,
)

from sparkgnn.deadletter import read_dead_letters
from sparkgnn.errors import StalePEStore
from sparkgnn.serving import Request
from sparkgnn.serving.modes import ModeError
from sparkgnn.serving.request import write_requests
from sparkgnn.streaming.job import StreamConfig, StreamJobError, StreamStartError, build_engine, run, start_query
from sparkgnn.streaming.sink import SinkError, committed_batch_ids, read_answers, read_batch_meta


def copies(requests, tag):
    return [Request(f"{r.request_id}-{tag}", r.qid, r.x, r.src, r.dst) for r in requests]


def config(setup, tmp_path, **kw):
    base = dict(
        graph=setup.graph_dir,
        model=setup.model_path,
        store=setup.store,
        mode="exact",
        requests=str(tmp_path / "in"),
        out=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"),
        available_now=True,
    )
    base.update(kw)
    return StreamConfig(**base)


def test_stream_in_process_equals_engine_survives_bad_input_and_replays_once(spark, setup, engine, tmp_path, caplog):
    good = setup.requests
    write_one_per_file(str(tmp_path / "in"), good)
    bad = bad_requests(setup.graph, good[0])
    write_requests(str(tmp_path / "in" / "bad.parquet"), list(bad.values()))
    malformed = write_malformed(str(tmp_path / "in"))
    caplog.set_level(logging.INFO, logger="sparkgnn")
    cfg = config(setup, tmp_path, max_files_per_trigger=3)
    result = run(cfg, spark)

    files = len(good) + 1 + len(malformed)
    assert result.stopped_by == "finished" and result.batches == -(-files // 3)
    assert committed_batch_ids(cfg.out) == list(range(result.batches))
    t = read_answers(cfg.out)
    assert_rows_equal_answers(t.filter(t.column("error").is_null()), engine_answers(engine, good))
    errors = {r["request_id"]: r["error"] for r in t.to_pylist() if r["error"]}
    assert set(errors) == {r.request_id for r in bad.values()}
    for r, words in zip(bad.values(), bad, strict=True):
        assert words in errors[r.request_id]
    reasons = {os.path.basename(d["file"]): d["reason"] for d in read_dead_letters(cfg.dead_letter_dir)}
    assert {n: w in reasons[n] for n, w in malformed.items()} == {n: True for n in malformed}
    progress = [l for l in caplog.messages if l.startswith("stream batch") and "requests from" in l]
    assert len(progress) == result.batches and all("mode exact" in l and "p99" in l for l in progress)
    for b in range(result.batches):
        assert len(read_batch_meta(cfg.out, b)["files"]) <= 3

    # a crash after the sink wrote the last batch but before Spark committed it: drop the commit
    # entry, add new files, run again from the checkpoint: the last batch is replayed in place
    last = result.last_batch_id
    for name in (str(last), f".{last}.crc"):  # the commit entry and its Hadoop checksum
        os.remove(os.path.join(cfg.checkpoint, "commits", name))
    before = read_batch_meta(cfg.out, last)
    extra = copies(good[:2], "late")
    write_one_per_file(cfg.requests, extra)
    again = run(cfg, spark)
    assert again.batches >= 2 and read_batch_meta(cfg.out, last)["files"] == before["files"]
    assert read_batch_meta(cfg.out, last)["written_ts"] > before["written_ts"]
    t2 = read_answers(cfg.out)
    ids = t2.column("request_id").to_pylist()
    assert len(ids) == len(set(ids)) == len(good) + len(bad) + len(extra)
    assert_rows_equal_answers(t2.filter(t2.column("error").is_null()), engine_answers(engine, good + extra))

    with pytest.raises(SinkError, match="batch ids would restart at 0"):
        run(config(setup, tmp_path, checkpoint=str(tmp_path / "ck-new")), spark)


def test_sigkill_mid_stream_then_restart_answers_every_request_exactly_once(spark, setup, engine, tmp_path):
    """The job runs as its own process (stream_queries.py), SIGKILLed once it has committed two
    batches; the restart runs on the test's session (streaming.job.run, which the script calls)
    from the same checkpoint and output, with the script's defaults for the options not given."""
    requests = setup.requests + copies(setup.requests, "b")
    write_one_per_file(str(tmp_path / "in"), requests)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    cmd = job_command(setup, str(tmp_path / "in"), out, ck, "--mode", "exact")
    log1 = open(tmp_path / "run1.log", "w")
    proc = subprocess.Popen(
        cmd + ["--max-requests-per-batch", "1", "--timeout", "240"],
        stdout=log1,
        stderr=subprocess.STDOUT,
        env=job_env(),
    )
    try:
        deadline = time.monotonic() + 180
        while len(committed_batch_ids(out)) < 2:
            assert proc.poll() is None, open(tmp_path / "run1.log").read()
            assert time.monotonic() < deadline, "the job committed no batch in time"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    answered = read_answers(out).num_rows
    assert 2 <= answered < len(requests), "the kill must land mid-stream"

    done = run(config(setup, tmp_path), spark)  # the same requests, out and checkpoint as cmd
    assert done.stopped_by == "finished" and done.batches >= 1
    t = read_answers(out)
    ids = t.column("request_id").to_pylist()
    assert sorted(ids) == sorted(r.request_id for r in requests)  # each exactly once
    assert_rows_equal_answers(t, engine_answers(engine, requests))
    assert not os.listdir(os.path.join(out, "_tmp"))


def test_stale_store_is_refused_with_what_differs(setup, tmp_path):
    proc = subprocess.run(
        job_command(
            setup,
            str(tmp_path / "in"),
            str(tmp_path / "out"),
            str(tmp_path / "ck"),
            "--mode",
            "srpe",
            model=setup.other_model_path,
        ),
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [l for l in proc.stderr.splitlines() if l.startswith("stream_queries.py: error: ")]
    assert len(errors) == 1 and "model weights differ" in errors[0], proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / "ck")  # refused before any query started
    with pytest.raises(StalePEStore, match="model weights differ"):
        build_engine(config(setup, tmp_path, model=setup.other_model_path))


def test_other_start_up_refusals(setup, tmp_path):
    with pytest.raises(StreamStartError, match="--store is required"):
        build_engine(config(setup, tmp_path, store=None, mode="srpe"))
    with pytest.raises(ModeError, match="unknown serving mode 'magic'.*exact"):
        build_engine(config(setup, tmp_path, mode="magic"))
    with pytest.raises(StreamStartError, match="--workers local.2. runs the CGP partitions of a reuse mode"):
        build_engine(config(setup, tmp_path, store=None, mode="full", workers="local[2]"))
    _, eng = build_engine(config(setup, tmp_path, store=None, mode="full"))
    assert eng.mode_name == "full"


class FailingOnce:
    """An engine whose answer to one request fails like a bug would (not a request error)."""

    def __init__(self, engine, request_id):
        self.engine, self.request_id, self.mode_name = engine, request_id, engine.mode_name

    def answer(self, request):
        if request.request_id == self.request_id:
            raise RuntimeError("simulated fault in the job")
        return self.engine.answer(request)


def test_a_fault_of_the_job_stops_the_query_uncommitted_and_a_restart_replays_the_batch(spark, setup, engine, tmp_path):
    good = setup.requests[:3]
    write_one_per_file(str(tmp_path / "in"), good)
    cfg = config(setup, tmp_path)
    with pytest.raises(StreamJobError, match="simulated fault"):
        run(cfg, spark, engine=(setup.graph, FailingOnce(engine, good[1].request_id)))
    assert committed_batch_ids(cfg.out) == []
    assert not os.path.exists(os.path.join(cfg.checkpoint, "commits", "0"))
    result = run(cfg, spark, engine=(setup.graph, engine))
    assert result.batches == 1 and result.last_batch_id == 0  # the same batch, run again
    assert_rows_equal_answers(read_answers(cfg.out), engine_answers(engine, good))


def _run_partitioned(spark, setup, engine, tmp_path, caplog, workers: str, requests: int, says: str):
    """Run the job with the CGP partitions on `workers`; its answers equal the in-process engine's
    up to rounding (partials are summed in another order) and the log says where they ran."""
    good = setup.requests[:requests]
    write_one_per_file(str(tmp_path / "in"), good)
    cfg = config(setup, tmp_path, workers=workers, mode_options={"partitions": 2})
    caplog.set_level(logging.INFO, logger="sparkgnn")
    result = run(cfg, spark)
    assert result.batches == 1 and any(says in l for l in caplog.messages)
    t = read_answers(cfg.out).to_pylist()
    expected = engine_answers(engine, good)
    assert sorted(r["request_id"] for r in t) == sorted(expected)
    for r in t:
        a = expected[r["request_id"]]
        np.testing.assert_allclose(np.array(r["h"], np.float32), a.h, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.array(r["pred"]), a.pred)
        assert r["error"] is None


def test_workers_spark_runs_cgp_partitions_as_spark_tasks_with_the_same_answers(spark, setup, engine, tmp_path, caplog):
    _run_partitioned(spark, setup, engine, tmp_path, caplog, "spark", 3, "run as 2 Spark tasks")
    with pytest.raises(StreamStartError, match="--workers spark runs the CGP partitions"):
        build_engine(config(setup, tmp_path, store=None, mode="full", workers="spark"))


def test_workers_local_runs_cgp_partitions_on_messenger_workers(spark, setup, engine, tmp_path, caplog):
    """local[2]: a broker and two sparkgnn-worker processes serve the partitions (op
    serving_partials); answers equal the engine's, and the workers are stopped with the job."""
    _run_partitioned(spark, setup, engine, tmp_path, caplog, "local[2]", 2, "partitions on messenger workers local[2]")


class _Chain:
    """Stands in for a SparkSession's readStream / writeStream builders: records each call."""

    def __init__(self):
        self.calls: list = []

    def __getattr__(self, name):
        if name in ("readStream", "writeStream"):
            return self

        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return self

        return call


@pytest.mark.parametrize("given, admitted", [(None, 64), (5, 5)])
def test_the_source_admits_max_files_per_trigger_files_a_batch_by_default_too(tmp_path, given, admitted):
    chain = _Chain()
    cfg = StreamConfig(
        graph="g", model="m", requests=str(tmp_path / "in"), out="o", checkpoint="ck", max_files_per_trigger=given
    )
    start_query(chain, cfg, handler=None)
    options = dict(args for name, args, _ in chain.calls if name == "option")
    assert options["maxFilesPerTrigger"] == admitted
