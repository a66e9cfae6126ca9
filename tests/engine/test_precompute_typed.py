"""The Spark PE precompute on a typed graph (engine/precompute_typed.py): `sparkgnn.precompute`
runs the typed batch inference's per-relation rounds and writes a typed store equal to the one
precompute_local writes (two rounds, so round 2 reads round 1's values); a rerun finds every
layer committed and runs nothing."""

import os
import sys

import numpy as np

from sparkgnn import precompute
from sparkgnn.graph import write_typed_graph_dir
from sparkgnn.pe.local import precompute_local
from sparkgnn.pe.typed import TypedPEStore

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
from typed_testkit import authors_and_papers, to_hetero_sage, typed_graph  # noqa: E402


def test_spark_typed_precompute_equals_the_local_one(spark, tmp_path):
    d = authors_and_papers()  # two relations: four relation jobs over the two rounds
    graph = typed_graph(d)
    write_typed_graph_dir(graph, str(tmp_path / "graph"))
    _, model = to_hetero_sage(d, layers=2, aggr="sum")
    local = precompute_local(graph, model, tmp_path / "local")
    result = precompute(spark, str(tmp_path / "graph"), model, store=tmp_path / "store", partitions=2,
                        work_dir=str(tmp_path / "work"))  # fmt: skip
    assert isinstance(result.store, TypedPEStore) and result.report
    for layer in (1, 2):
        for t in local.types(layer):
            ids = graph.nodes[t].ids
            np.testing.assert_allclose(
                result.store.lookup(t, ids, layer), local.lookup(t, ids, layer), rtol=1e-5, atol=1e-5
            )
    assert not os.listdir(tmp_path / "work" / "typed_runs")
    again = precompute(spark, str(tmp_path / "graph"), model, store=tmp_path / "store")
    assert again.report is None and again.store.base == result.store.base
