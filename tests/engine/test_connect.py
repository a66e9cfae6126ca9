"""sparkgnn through Spark Connect: a live Connect server (tests/connect_server.py, pyspark's own
sbin/start-connect-server.sh on loopback) and a `SparkSession.builder.remote` session.

What a Connect session lacks (sparkContext, accumulators, RDDs, the py4j gateway) is answered by
engine.spark_compat; these tests check each answer against the live server, then the parts that
use them: routing keys, the shuffle meter, CGP tasks (spark_cgp's run_tasks), the streaming job
(its handler runs in the server's foreachBatch process; the run loop follows the sink), and
infer end to end.

The server starts once for the module (~6-8 s). pyspark's builder (SparkSession.builder.remote)
refuses while a classic session runs in the process (the suite's `spark` fixture may) and sets
SPARK_CONNECT_MODE_ENABLED, which turns pyspark's module-level helpers (functions, UDF builders,
getActiveSession) to Connect for the classic tests after this module. So the fixture uses
pyspark.sql.connect's own builder (and restores the environment): this module and the classic
session share a test process in either order. job_session's SPARK_REMOTE path runs in a fresh
process, as a job does.
"""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from connect_server import ConnectServer
from torch_fixtures import _one_torch_thread  # noqa: F401  (autouse: answers compare bit for bit)

from sparkgnn.engine import session as session_mod
from sparkgnn.engine import spark_compat
from sparkgnn.engine.metrics import ShuffleMeter
from sparkgnn.engine.routing import owner_partition, partition_keys
from sparkgnn.serving.cgp_wire import from_bytes, to_bytes

CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")
pytestmark = pytest.mark.slow  # starts a Spark Connect server (~7 s) from pyspark's sbin


@pytest.fixture(scope="module")
def server():
    with ConnectServer(master="local[2]") as srv:
        yield srv


@pytest.fixture(scope="module")
def cspark(server):
    # pyspark.sql.connect's own builder: pyspark's (SparkSession.builder.remote) refuses while a
    # classic session runs in this process (the suite's `spark` fixture may), and sets
    # SPARK_CONNECT_MODE_ENABLED, which would turn the classic tests after this module to Connect.
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    saved = {key: os.environ.get(key) for key in CONNECT_ENV}
    spark = RemoteSession.builder.remote(server.url).getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_compat_answers_what_a_connect_session_lacks(cspark):
    assert spark_compat.is_connect(cspark) and not spark_compat.has_jvm(cspark)
    with pytest.raises(Exception, match="JVM_ATTRIBUTE_NOT_SUPPORTED"):
        cspark.sparkContext  # noqa: B018 - what the compat layer exists for
    app = spark_compat.application_id(cspark)
    assert app.startswith("local-") and app == cspark.conf.get("spark.app.id")
    assert spark_compat.conf_get(cspark, "spark.master") == "local[2]"
    assert spark_compat.conf_get(cspark, "spark.sparkgnn.no.such.key", "dflt") == "dflt"
    assert spark_compat.default_parallelism(cspark) == 2
    assert spark_compat.driver_is_here(cspark)
    assert spark_compat.task_counters(cspark, ["a_s"], ["peak"]) == {}  # not measured: no accumulators
    spark_compat.set_log_level(cspark, "ERROR")  # a no-op, not an error
    # the session helpers built on them
    session_mod.configure(cspark)
    assert cspark.conf.get("spark.sql.adaptive.coalescePartitions.enabled") == "false"
    assert session_mod.memory_per_task(cspark) > 0
    assert session_mod.mapped_memory_budget(cspark) is not None  # local master, server on this machine


def test_parallelism_without_a_local_master_is_asked_of_spark(cspark, monkeypatch):
    assert spark_compat.parallelism_from_master("local") == 1
    assert spark_compat.parallelism_from_master("local[3]") == 3
    assert spark_compat.parallelism_from_master("local[4, 2]") == 4
    assert spark_compat.parallelism_from_master("local-cluster[2, 3, 1024]") == 6
    assert spark_compat.parallelism_from_master("local[*]") is None
    assert spark_compat.parallelism_from_master("spark://h:7077") is None
    real = spark_compat.conf_get
    monkeypatch.setattr(
        spark_compat,
        "conf_get",
        lambda s, k, d=None: "spark://elsewhere:7077" if k == "spark.master" else real(s, k, d),
    )
    assert spark_compat.default_parallelism(cspark) == 2  # the probe job: spark.range's partitions


def test_job_description_is_a_job_tag_replaced_and_cleared(cspark):
    spark_compat.set_job_description(cspark, "sparkgnn layer 1/2: replicate, x")
    assert cspark.getTags() == {"sparkgnn_layer_1/2:_replicate_x"}
    assert cspark.range(3).count() == 3  # jobs run with the tag
    spark_compat.set_job_description(cspark, "sparkgnn layer 2/2")
    assert cspark.getTags() == {"sparkgnn_layer_2/2"}
    spark_compat.set_job_description(cspark, None)
    assert cspark.getTags() == set()


def test_tasks_routing_keys_and_shuffle_meter(cspark):
    def task(p: int) -> bytes:
        return to_bytes({"p": p, "pid": os.getpid(), "x": np.full(3, p, np.float32)})

    results = spark_compat.run_tasks(cspark, 3, task, from_bytes)  # an Arrow codec, never pickle
    assert [r["p"] for r in results] == [0, 1, 2] and all(r["pid"] != os.getpid() for r in results)
    np.testing.assert_array_equal(results[2]["x"], np.full(3, 2, np.float32))
    keys = partition_keys(cspark, 5)
    np.testing.assert_array_equal(owner_partition(keys, 5), np.arange(5))  # Spark's hash, numpy port

    meter = ShuffleMeter(cspark)
    assert meter.not_measured and meter.delta() is None  # no status store behind a Connect session
    df = cspark.range(0, 1000, 1, 2).repartition(3, "id").selectExpr("id % 7 as k").groupBy("k").count()
    assert len(df.collect()) == 7
    shuffled = meter.delta(df)
    assert shuffled["shuffle_write_bytes"] > 0 and shuffled["shuffle_read_bytes"] > 0


def _stream_setup(root):
    from torch_geometric.nn import GraphSAGE

    from sparkgnn.datasets.synthetic import synthetic_graph
    from sparkgnn.graph import read_graph_dir, write_graph_dir
    from sparkgnn.models import Model
    from sparkgnn.serving import Request

    data = synthetic_graph(200, 800, 6, num_classes=3, seed=5)
    graph_dir = os.path.join(root, "graph")
    write_graph_dir(data, graph_dir)
    torch.manual_seed(3)
    model_path = os.path.join(root, "model")
    Model.from_pyg(GraphSAGE(6, 8, 2, out_channels=3).eval()).save(model_path)
    graph = read_graph_dir(graph_dir)
    rng = np.random.default_rng(0)
    base = int(graph.ids.max()) + 1
    requests = [
        Request(
            f"r{i}",
            np.array([base + i]),
            rng.standard_normal((1, 6)).astype(np.float32),
            graph.ids[rng.choice(graph.num_nodes, 3, replace=False)],
            np.full(3, base + i),
        )
        for i in range(2)
    ]
    return graph_dir, model_path, graph, requests


def test_streaming_job_through_connect_answers_like_the_engine(cspark, tmp_path, caplog):
    from sparkgnn.models import Model
    from sparkgnn.serving import QueryEngine
    from sparkgnn.serving.request import write_requests
    from sparkgnn.streaming.job import StreamConfig, run
    from sparkgnn.streaming.sink import read_answers

    graph_dir, model_path, graph, requests = _stream_setup(str(tmp_path))
    for r in requests:
        write_requests(str(tmp_path / "in" / f"{r.request_id}.parquet"), [r])
    cfg = StreamConfig(
        graph=graph_dir,
        model=model_path,
        requests=str(tmp_path / "in"),
        out=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "ck"),
        mode="full",
        available_now=True,
        max_files_per_trigger=1,
    )
    caplog.set_level(logging.INFO, logger="sparkgnn")
    result = run(cfg, cspark)
    assert result.stopped_by == "finished" and result.batches == 2 and result.last_batch_id == 1
    progress = [l for l in caplog.messages if l.startswith("stream batch") and "requests from" in l]
    assert len(progress) == 2 and all("1 requests from 1 files, 0 errors" in l for l in progress)
    engine = QueryEngine(graph, Model.load(model_path), mode="full")
    answers = {row["request_id"]: row for row in read_answers(cfg.out).to_pylist()}
    assert sorted(answers) == ["r0", "r1"]
    for r in requests:
        assert answers[r.request_id]["error"] is None
        np.testing.assert_array_equal(np.array(answers[r.request_id]["h"], np.float32), engine.answer(r).h)


def test_job_session_uses_spark_remote(server):
    """The jobs' session: SPARK_REMOTE gives a Connect session (in a fresh process, as a job is)."""
    code = (
        "from sparkgnn.engine.session import job_session\n"
        "from sparkgnn.engine.spark_compat import is_connect\n"
        "s = job_session('sparkgnn-test')\n"
        "print(is_connect(s), s.range(3).count())\n"
    )
    env = dict(os.environ, SPARK_REMOTE=server.url)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["True", "3"]


def test_infer_through_connect_equals_pyg(cspark, tmp_path):
    from engine_helpers import pyg_reference, relative_error
    from torch_geometric.nn import GraphSAGE

    from sparkgnn import infer
    from sparkgnn.datasets.synthetic import synthetic_graph
    from sparkgnn.graph import write_graph_dir
    from sparkgnn.models import Model

    data = synthetic_graph(300, 1500, 8, num_classes=3, seed=2)
    graph_dir = str(tmp_path / "graph")
    write_graph_dir(data, graph_dir)
    torch.manual_seed(1)
    module = GraphSAGE(8, 8, 2, out_channels=3).eval()
    out = str(tmp_path / "out")
    result = infer(cspark, graph_dir, Model.from_pyg(module), out=out, work_dir=str(tmp_path / "work")).frame
    table = result.toArrow()
    ids = table.column("id").to_numpy()
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    assert len(ids) == data.num_nodes
    assert relative_error(h, pyg_reference(module, data)[data.index_of(ids)]) <= 1e-5
