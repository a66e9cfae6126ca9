"""The streaming job on a multi-process cluster (`local-cluster[2,1,1024]`, two executor JVMs)
through spark-submit, its CGP partitions run as Spark tasks on the executors (--workers spark):
every request is answered once, equal to QueryEngine's answers up to the rounding of summing
partials in another order."""

import sys

import numpy as np
import pytest
from cluster_harness import run_job
from streaming_helpers import engine_answers, job_command, write_one_per_file

from sparkgnn.streaming.sink import read_answers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="spark-submit on local-cluster"),
]


def test_stream_job_on_local_cluster_answers_like_the_engine(setup, engine, tmp_path):
    good = setup.requests[:4]
    write_one_per_file(str(tmp_path / "in"), good)
    command = job_command(
        setup, str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ck"),
        "--mode", "exact", "--workers", "spark", "--partitions", "2", "--available-now", "--timeout", "300",
    )  # fmt: skip
    run = run_job("stream_queries.py", command[2:], tmp_path)  # the job's arguments, after python and the script
    assert run.returncode == 0, run.output()[-4000:]
    rows = read_answers(str(tmp_path / "out")).to_pylist()
    expected = engine_answers(engine, good)
    assert sorted(r["request_id"] for r in rows) == sorted(expected)
    for row in rows:
        answer = expected[row["request_id"]]
        assert row["error"] is None
        np.testing.assert_allclose(np.array(row["h"], np.float32), answer.h, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.array(row["pred"]), answer.pred)
