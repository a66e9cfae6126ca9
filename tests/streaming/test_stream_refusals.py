"""Nothing the stream consumes is lost: a 0-byte request file (which Spark's file index leaves out
of the micro-batch although the source marks it consumed), a truncated file, a foreign file and a
file of the wrong schema are each dead-lettered with a reason naming the file and counted in the
micro-batch line, as are a file over the byte cap (never collected) and a decompression bomb
(refused from its footer), the stream answering the good files around them; the job's command
line refuses bad numbers in argparse and every other user error as one
`stream_queries.py: error: ...` line with exit code 2, before Spark starts."""

import importlib.util
import io
import json
import logging
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from streaming_helpers import JOB, assert_rows_equal_answers, engine_answers, write_one_per_file
from test_stream_handler import bomb_bytes

from sparkgnn.deadletter import DeadLetter, read_dead_letters
from sparkgnn.serving.request import requests_table
from sparkgnn.streaming.grouping import get_grouping
from sparkgnn.streaming.handler import MicroBatchHandler
from sparkgnn.streaming.intake import IncomingFile
from sparkgnn.streaming.job import StreamConfig, run
from sparkgnn.streaming.sink import AnswerSink, read_answers, read_batch_meta
from sparkgnn.streaming.sourcelog import batch_files, uri_to_local


def _bytes(requests) -> bytes:
    buf = io.BytesIO()
    pq.write_table(requests_table(requests), buf)
    return buf.getvalue()


def write_unreadable(folder) -> dict:
    """Unreadable request files -> the words their dead-letter reason must contain."""
    os.makedirs(folder, exist_ok=True)
    good = _bytes([_tiny_request()])
    files = {
        "empty.parquet": (b"", "empty file (0 bytes)"),
        "empty two.parquet": (b"", "empty file (0 bytes)"),  # a name Spark's log URI-encodes
        "truncated.parquet": (good[: len(good) // 2], "not a readable Parquet file, truncated"),
        "foreign.parquet": (b'{"not": "parquet"}', "not a readable Parquet file"),
    }
    for name, (content, _) in files.items():
        with open(os.path.join(folder, name), "wb") as fh:
            fh.write(content)
    pq.write_table(pa.table({"id": [1, 2], "value": [0.5, 0.7]}), os.path.join(folder, "schema.parquet"))
    out = {name: words for name, (_, words) in files.items()}
    out["schema.parquet"] = "lacks column(s)"
    return out


def _tiny_request():
    import numpy as np

    from sparkgnn.serving import Request

    return Request("tiny", np.array([10**9]), np.zeros((1, 3), np.float32), np.empty(0), np.empty(0))


# -- the source log ----------------------------------------------------------------------------


def _write_log(path, entries):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("v1\n" + "".join(json.dumps(e) + "\n" for e in entries))


def test_source_log_lists_a_batch_from_plain_and_compact_entries(tmp_path):
    ck = str(tmp_path / "ck")
    log = os.path.join(ck, "sources", "0")
    _write_log(os.path.join(log, "8"), [{"path": "file:///in/a%20b.parquet", "timestamp": 1500, "batchId": 8}])
    _write_log(
        os.path.join(log, "9.compact"),
        [
            {"path": "file:///in/old.parquet", "timestamp": 1000, "batchId": 8},
            {"path": "file:///in/c.parquet", "timestamp": 2000, "batchId": 9},
            {"path": "file:///in/d%25.parquet", "timestamp": 2500, "batchId": 9},
        ],
    )
    assert [(f.path, f.arrival_ts) for f in batch_files(ck, 8)] == [("/in/a b.parquet", 1.5)]
    assert [f.path for f in batch_files(ck, 9)] == ["/in/c.parquet", "/in/d%.parquet"]
    assert batch_files(ck, 10) is None and batch_files(str(tmp_path / "none"), 0) is None
    assert uri_to_local("file:/x/y z.parquet") == "/x/y z.parquet"


def test_handler_dead_letters_files_the_log_has_but_the_dataframe_lacks(tmp_path, setup, engine, caplog):
    """The foreachBatch adapter's complement, without Spark: the micro-batch delivered one good
    file; the log also lists a 0-byte file (Spark skipped it) and a file deleted since."""
    folder = tmp_path / "in"
    good_path = write_one_per_file(str(folder), setup.requests[:1])[0]
    (folder / "empty.parquet").write_bytes(b"")
    ck = str(tmp_path / "ck")
    _write_log(
        os.path.join(ck, "sources", "0", "5"),
        [
            {"path": f"file://{p}", "timestamp": 1000 * (i + 1), "batchId": 5}
            for i, p in enumerate([good_path, str(folder / "empty.parquet"), str(folder / "gone.parquet")])
        ],
    )
    caplog.set_level(logging.INFO, logger="sparkgnn")
    handler = MicroBatchHandler(
        engine,
        setup.graph,
        get_grouping("fifo"),
        AnswerSink(str(tmp_path / "out")),
        DeadLetter(str(tmp_path / "dead")),
        checkpoint=ck,
    )
    delivered = [IncomingFile(f"file:{good_path}", 1.0, open(good_path, "rb").read())]
    extra = handler.undelivered(delivered, 5)
    assert [os.path.basename(f.path) for f in extra] == ["empty.parquet", "gone.parquet"]
    progress = handler.handle(delivered + extra, 5)

    assert (progress.files, progress.requests, progress.dead_letters) == (3, 1, 2)
    assert "1 requests from 3 files, 0 errors, 2 dead-lettered" in caplog.messages[-1]
    reasons = {os.path.basename(d["file"]): d for d in read_dead_letters(str(tmp_path / "dead"))}
    assert reasons["empty.parquet"]["reason"] == (
        "empty.parquet: empty file (0 bytes); a request file is a "
        "Parquet file with columns ['request_id', 'kind', 'node', "
        "'x', 'src', 'dst']"
    )
    assert "gone.parquet: the stream source listed this file but it was gone" in reasons["gone.parquet"]["reason"]
    assert reasons["empty.parquet"]["batch_id"] == 5 and reasons["empty.parquet"]["bytes"] == 0
    assert_rows_equal_answers(read_answers(str(tmp_path / "out")), engine_answers(engine, setup.requests[:1]))
    assert (folder / "empty.parquet").exists()  # the original stays where it was


def test_stream_dead_letters_empty_truncated_foreign_and_wrong_schema_files(spark, setup, engine, tmp_path, caplog):
    good = setup.requests[:2]
    folder = str(tmp_path / "in")
    write_one_per_file(folder, good)
    unreadable = write_unreadable(folder)
    with open(os.path.join(folder, "oversize.parquet"), "wb") as fh:  # over max_file_bytes: never collected
        fh.write(os.urandom(300 * 1024))
    with open(os.path.join(folder, "bomb.parquet"), "wb") as fh:  # a few KiB, 4 MiB decompressed
        fh.write(bomb_bytes())
    unreadable["oversize.parquet"] = "over the job's limit of 262144 bytes"
    unreadable["bomb.parquet"] = "footer declares"
    cfg = StreamConfig(
        graph=setup.graph_dir,
        model=setup.model_path,
        store=setup.store,
        mode="exact",
        requests=folder,
        out=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"),
        available_now=True,
        max_files_per_trigger=4,
        max_file_bytes=256 * 1024,
        max_file_decompressed_bytes=1 << 20,
    )
    caplog.set_level(logging.INFO, logger="sparkgnn")
    result = run(cfg, spark, engine=(setup.graph, engine))

    reasons = {os.path.basename(d["file"]): d for d in read_dead_letters(cfg.dead_letter_dir)}
    assert set(reasons) == set(unreadable)
    for name, words in unreadable.items():
        assert reasons[name]["reason"].startswith(f"{name}: ") and words in reasons[name]["reason"], reasons[name]
        kept = os.path.exists(os.path.join(cfg.dead_letter_dir, name))
        assert kept == (name != "oversize.parquet")  # an oversize file's bytes are never read
        assert os.path.exists(os.path.join(folder, name))
    t = read_answers(cfg.out)
    assert t.num_rows == len(good)
    assert_rows_equal_answers(t, engine_answers(engine, good))
    progress = [l for l in caplog.messages if "requests from" in l]
    assert len(progress) == result.batches
    assert sum(int(l.split(" errors, ")[1].split(" dead-lettered")[0]) for l in progress) == len(unreadable)
    files = [f for b in range(result.batches) for f in read_batch_meta(cfg.out, b)["files"]]
    assert sorted(os.path.basename(f) for f in files) == sorted(os.listdir(folder))  # every file accounted for


# -- the command line --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def job():
    spec = importlib.util.spec_from_file_location("stream_queries_under_test", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _argv(setup, tmp_path, *extra):
    return [
        "--graph",
        setup.graph_dir,
        "--model",
        setup.model_path,
        "--store",
        setup.store,
        "--requests",
        str(tmp_path / "in"),
        "--out",
        str(tmp_path / "out"),
        "--checkpoint",
        str(tmp_path / "ck"),
        "--no-warmup",
        *extra,
    ]


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--gamma", "0", "must be in (0, 1]"),
        ("--gamma", "2", "must be in (0, 1]"),
        ("--fanouts", "a,b", "'a' must be an integer"),
        ("--fanouts", "5,0", "'0' must be >= 1"),
        ("--partitions", "0", "must be >= 1"),
        ("--trigger", "-1", "must be a finite number >= 0"),
        ("--trigger", "soon", "must be a number"),
        ("--max-requests-per-batch", "0", "must be >= 1"),
        ("--max-file-bytes", "0", "must be >= 1"),
        ("--max-file-bytes", "64MB", "must be an integer"),
        ("--max-file-rows", "-5", "must be >= 1"),
        ("--max-file-decompressed-bytes", "1.5", "must be an integer"),
        ("--max-queries", "0", "must be >= 1"),
        ("--max-edges", "x", "must be an integer"),
        ("--timeout", "0", "must be a finite number > 0"),
        ("--seed", "-2", "must be >= 0"),
        ("--degree-threshold", "x", "must be a number"),
    ],
)
def test_job_bad_numbers_are_usage_errors_naming_the_flag(job, setup, tmp_path, capsys, flag, value, words):
    with pytest.raises(SystemExit) as exit_:
        job.parse_args(_argv(setup, tmp_path, flag, value))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"stream_queries.py: error: argument {flag}: " in err and words in err, err


def test_job_file_and_request_caps_reach_the_job_from_their_flags(job, setup, tmp_path):
    flags = ["--max-file-bytes", "1000", "--max-file-rows", "20", "--max-file-decompressed-bytes", "3000"]
    flags += ["--max-queries", "7", "--max-edges", "9", "--max-requests-per-batch", "5"]
    cfg = job.config_from_args(job.parse_args(_argv(setup, tmp_path, *flags)))
    limits = cfg.file_limits()
    assert (limits.max_bytes, limits.max_rows, limits.max_decompressed_bytes) == (1000, 20, 3000)
    assert (limits.max_queries, limits.max_edges, cfg.max_files_per_trigger) == (7, 9, 5)
    default = job.config_from_args(job.parse_args(_argv(setup, tmp_path)))
    assert default.file_limits() == type(limits)()  # no flag: intake.FileLimits' defaults


def _one_error_line(err: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("stream_queries.py: error: "), err
    return lines[0]


def test_job_refusals_are_one_line_exit_2_before_spark_and_touch_nothing(job, setup, tmp_path, capsys):
    def refused(*extra) -> str:
        assert job.main(_argv(setup, tmp_path, *extra)) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert not os.path.exists(tmp_path / "ck")  # no query was started
        return line

    assert "unknown serving mode 'magic'" in refused("--mode", "magic")
    assert "unknown grouping policy 'sjf'" in refused("--grouping", "sjf")
    assert "model weights differ" in refused("--mode", "exact", "--model", setup.other_model_path)
    assert "unknown SRPE policy 'best'" in refused("--mode", "srpe", "--policy", "best")
    (tmp_path / "out").write_text("an existing file")  # --out is a file: refused, kept
    assert "is not a directory" in refused("--mode", "full")
    assert (tmp_path / "out").read_text() == "an existing file"
