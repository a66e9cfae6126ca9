"""GCN layers converted without edge weights (a forward that calls `conv(x, edge_index)`) on a graph
whose edges carry weights: the Spark engine's degree statistics count every edge as 1, as PyG's
forward without edge_weight does, under every strategy and both exchanges, the pruned local run
and PE precomputation (1e-5 relative, the skewed graph: self loops, duplicates, weights)."""

import numpy as np
import pytest
import torch
from engine_helpers import relative_error, spark_output
from torch.nn import ReLU
from torch_geometric.nn import GCNConv, Sequential

from sparkgnn import infer
from sparkgnn.engine import jvm
from sparkgnn.engine.precompute import precompute
from sparkgnn.models import Model


def _unweighted_gcn(f: int, c: int, self_loops: bool) -> Sequential:
    """GCNConv(f, 16) -> ReLU -> GCNConv(16, c), neither fed the edge weights."""
    return Sequential(
        "x, edge_index",
        [
            (GCNConv(f, 16, add_self_loops=self_loops), "x, edge_index -> x"),
            ReLU(),
            (GCNConv(16, c, add_self_loops=self_loops), "x, edge_index -> x"),
        ],
    )


def _module(data, self_loops: bool) -> Sequential:
    torch.manual_seed(17 + self_loops)
    return _unweighted_gcn(data.feature_dim, int(data.y.max()) + 1, self_loops).eval()


def _expected(module, data) -> np.ndarray:
    """PyG's forward WITHOUT the edge weights (what the model's forward does)."""
    with torch.no_grad():
        return module(torch.from_numpy(data.x), data.edge_index_torch()).numpy()


NO_JAR = pytest.mark.skipif(jvm.jar_path() is None, reason="the sparkgnn JVM jar is not built (make jar)")

# One Spark run per strategy, the exchange and the self-loop policy rotating.
RUNS = [
    ("edge_join", "shuffle", True),
    ("replicate", "files", False),
    ("combine", "files", True),
    pytest.param("pushdown", "shuffle", False, marks=NO_JAR),
]


@pytest.mark.parametrize("strategy, exchange, self_loops", RUNS)
def test_unweighted_gcn_equals_pyg_without_weights(spark, graph_dirs, work_dir, strategy, exchange, self_loops):
    path, data = graph_dirs["skewed"]
    assert data.weight is not None and not np.allclose(data.weight, 1.0)
    module = _module(data, self_loops)
    model = Model.from_pyg(module)
    assert not any(conv.uses_edge_weight for conv in model.conv_list())
    job = infer(spark, path, model, strategy=strategy, exchange=exchange, partitions=3, work_dir=work_dir)
    assert [layer.strategy for layer in job.plan.layers] == [strategy] * 2
    actual = spark_output(job.frame, data)
    assert not np.isnan(actual).any(), "some vertices have no output row"
    error = relative_error(actual, _expected(module, data))
    assert error <= 1e-5, (strategy, exchange, self_loops, error)


@pytest.mark.parametrize("self_loops", [True, False])
def test_unweighted_gcn_pruned_local_run_equals_pyg_rows(spark, graph_dirs, work_dir, self_loops):
    path, data = graph_dirs["skewed"]
    module = _module(data, self_loops)
    ids = np.random.default_rng(5).choice(data.ids, 23, replace=False)
    job = infer(spark, path, Model.from_pyg(module), ids=ids, prune="local", work_dir=work_dir)
    assert job.plan.pruning["mode"] == "local"
    table = job.frame.toArrow()
    got = table.column("id").to_numpy()
    assert sorted(got.tolist()) == sorted(ids.tolist())
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    expected = _expected(module, data)[data.index_of(got)]
    assert relative_error(h, expected) <= 1e-5, relative_error(h, expected)


def test_unweighted_gcn_precompute_stores_pyg_layers(spark, graph_dirs, work_dir, tmp_path):
    path, data = graph_dirs["skewed"]
    module = _module(data, True)
    model = Model.from_pyg(module)
    store = precompute(
        spark,
        path,
        model,
        store=str(tmp_path / "store"),
        strategy="replicate",
        partitions=3,
        work_dir=work_dir,
        metrics=False,
    ).store
    x, edge_index = torch.from_numpy(data.x), data.edge_index_torch()
    with torch.no_grad():
        first = module[0](x, edge_index).relu().numpy()  # h^(1): the first conv and its ReLU
    h, _ = store.lookup(data.ids, 1)
    assert relative_error(h, first) <= 1e-5, relative_error(h, first)
    last, _ = store.lookup(data.ids, 2)
    assert relative_error(last, _expected(module, data)) <= 1e-5
