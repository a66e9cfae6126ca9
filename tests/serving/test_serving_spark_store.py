"""The reuse modes read the store FORMAT, not one producer's output: a store written by the Spark
precompute job (replicate strategy, 3 partitions) serves EXACT answers equal to FULL, and its
states agree with the single-machine producer's."""

import numpy as np
from serving_testkit import pyg_model

from sparkgnn.engine.precompute import precompute
from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.context import Meter
from sparkgnn.serving.stored import StoredLayers


def test_exact_on_a_spark_written_store(spark, skewed_workload, tmp_path):
    wl = skewed_workload
    G = wl.graph_G
    model = Model.from_pyg(pyg_model("gcn", G.feature_dim, 3, seed=9))
    write_graph_dir(G, str(tmp_path / "g"))
    store = precompute(
        spark,
        str(tmp_path / "g"),
        model,
        store=str(tmp_path / "spark_store"),
        partitions=3,
        strategy="replicate",
        work_dir=str(tmp_path / "work"),
        metrics=False,
    ).store
    local = precompute_local(G, model, str(tmp_path / "local_store"))
    a, b = StoredLayers(store, G, model, True), StoredLayers(local, G, model, True)
    rows = np.arange(G.num_nodes)
    for l in (1, 2):
        np.testing.assert_allclose(
            a.value(l, rows, Meter()).numpy(), b.value(l, rows, Meter()).numpy(), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(
            a.stored_state(l, rows, Meter()).numpy(), b.stored_state(l, rows, Meter()).numpy(), rtol=1e-5, atol=1e-4
        )
    full = QueryEngine(G, model, mode="full")
    exact = QueryEngine(G, model, mode="exact", store=store, context=full.context)
    for r in wl.requests:
        ref, got = full.answer(r).h, exact.answer(r).h
        assert np.abs(got - ref).max() <= 1e-5 * max(np.abs(ref).max(), 1e-30)
