"""spark_jobs/refresh_pe.py through spark-submit on a multi-process cluster (`local-cluster[2,1,1024]`),
one executor SIGKILLed while layer 1's pieces are being recomputed: every task reads and writes
only the run directory (a task lost with its executor rebuilds its piece elsewhere), so Spark
reruns the lost tasks and the refreshed store equals a from-scratch precompute of the updated
graph; the CLI names a bad update in one line and exits 2."""

import os
import sys

import pytest
from cluster_harness import Kill, run_job

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "pe"))
from test_refresh import assert_same_store, model_of, random_update  # noqa: E402

from sparkgnn.graph.updates import apply  # noqa: E402
from sparkgnn.graph.writer import write_graph_dir  # noqa: E402
from sparkgnn.pe import PEStore  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "serving"))
from serving_testkit import skewed_graph  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds executors in /proc"),
]


def _graph_model_store(tmp_path):
    """graph/, model/ and store/ (a local precompute with states) under tmp_path."""
    graph = skewed_graph()
    write_graph_dir(graph, str(tmp_path / "graph"))
    model = model_of("gcn", graph.feature_dim, 2)
    model.save(str(tmp_path / "model"))
    precompute_local(graph, model, str(tmp_path / "store"))
    return graph, model


def test_refresh_survives_an_executor_lost_mid_layer(tmp_path):
    graph, model = _graph_model_store(tmp_path)
    update = random_update(graph, seed=5)
    update.write(str(tmp_path / "update"))
    args = ["--graph", "graph", "--model", "model", "--store", "store", "--updates", "update",
            "--work-dir", "work", "--partitions", "4"]  # fmt: skip
    mid_layer = Kill(path="work/refresh/*/layer=1/out/part=*")
    run = run_job("refresh_pe.py", args, tmp_path, [mid_layer])
    assert run.returncode == 0, run.output()[-4000:]
    assert mid_layer.fired_at, "the kill never fired"
    assert "refresh_pe: store version" in run.output()
    new_graph = apply(update, graph).graph
    store = PEStore.open(str(tmp_path / "store"), model=model, graph=new_graph)
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(store, scratch, new_graph.ids, 2)
    assert os.listdir(tmp_path / "work" / "refresh") == []
    assert sorted(os.listdir(tmp_path / "work" / "refresh-pieces")) == sorted(
        [graph.fingerprint, new_graph.fingerprint]
    )  # the old graph's pieces built by Spark, the new one's kept by the refresh


def test_the_cli_names_a_bad_update_and_exits_2(tmp_path):
    import subprocess

    graph, _model = _graph_model_store(tmp_path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkgnn.graph.updates import UPDATE_SCHEMA

    row = {"kind": ["edge_insert"], "src": [int(graph.ids[0])], "dst": [10**12], "weight": [1.0], "node": [None],
           "x": [None]}  # fmt: skip
    os.makedirs(tmp_path / "update")
    pq.write_table(pa.table(row, schema=UPDATE_SCHEMA), str(tmp_path / "update" / "part-0.parquet"))
    script = os.path.join(os.path.dirname(__file__), "..", "..", "..", "spark_jobs", "refresh_pe.py")
    done = subprocess.run(
        [sys.executable, script, "--graph", "graph", "--model", "model", "--store", "store", "--updates", "update",
         "--engine", "local"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "refresh_pe: error:" in done.stderr and str(10**12) in done.stderr
