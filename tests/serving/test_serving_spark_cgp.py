"""Computation graph parallelism as Spark tasks over P cached PE shards answers exactly what the
in-process executor answers (EXACT with subtracted messages for GCN, SRPE for GAT whose messages
read the destination), reading the same stored bytes."""

import numpy as np
import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.spark_cgp import use_spark_cgp


@pytest.mark.parametrize("kind, mode, opts", [("gcn", "exact", {}), ("gat", "srpe", {"gamma": 0.5})])
def test_spark_tasks_equal_in_process(spark, skewed_workload, tmp_path, kind, mode, opts):
    wl = skewed_workload
    G = wl.graph_G
    model = Model.from_pyg(pyg_model(kind, G.feature_dim, 3, seed=3))
    model.save(str(tmp_path / "model.pt"))
    write_graph_dir(G, str(tmp_path / "g"))
    store = precompute_local(G, model, str(tmp_path / "store"))
    local = QueryEngine(G, model, mode=mode, store=store, **opts)
    on_spark = QueryEngine(G, model, mode=mode, store=store, context=local.context, partitions=3, **opts)
    executor = use_spark_cgp(on_spark, spark, str(tmp_path / "g"), str(tmp_path / "model.pt"))
    r = wl.requests[0]
    jobs_before = executor.jobs
    a, b = on_spark.answer(r), local.answer(r)
    assert np.abs(a.h - b.h).max() <= 1e-5 * np.abs(b.h).max()
    np.testing.assert_array_equal(a.pred, b.pred)
    assert a.breakdown["bytes_fetched"] == b.breakdown["bytes_fetched"]
    assert a.breakdown["partial_bytes"] > 0
    # the same kernel in-process with the same P reports the same cross-partition bytes
    p3 = QueryEngine(G, model, mode=mode, store=store, context=local.context, partitions=3, **opts).answer(r)
    for key in ("partial_bytes", "allgather_bytes"):
        assert a.breakdown[key] == p3.breakdown[key], key
    # one Spark job per layer (+ a destination fetch per layer for GAT)
    assert executor.jobs - jobs_before == model.num_rounds * (2 if kind == "gat" else 1)
