"""Spark batch inference equals PyTorch Geometric's forward (1e-5 relative), for every layer type,
every data-movement strategy and partition counts 1, 3 and 8, on Cora and a skewed graph."""

import numpy as np
import pytest
import torch
from engine_helpers import pyg_reference, relative_error, spark_output
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

from sparkgnn import infer
from sparkgnn.models import Model

MODELS = {
    "gcn": lambda f, c: GCN(f, 16, 2, out_channels=c),
    "sage_mean": lambda f, c: GraphSAGE(f, 16, 2, out_channels=c),
    "sage_max": lambda f, c: GraphSAGE(f, 16, 2, out_channels=c, aggr="max"),
    "gin": lambda f, c: GIN(f, 16, 2, out_channels=c),
    "gat": lambda f, c: GAT(f, 8, 2, out_channels=c, heads=2),
}


def _module(name, data):
    torch.manual_seed(len(name))
    return MODELS[name](data.feature_dim, int(data.y.max()) + 1).eval()


def _silent(_line):
    pass


@pytest.mark.parametrize("partitions", [1, 3, 8])
@pytest.mark.parametrize("strategy", ["edge_join", "replicate", "combine"])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_spark_equals_pyg(spark, graph_dirs, work_dir, model_name, strategy, partitions):
    for graph_name, (path, data) in graph_dirs.items():
        module = _module(model_name, data)
        result = infer(
            spark,
            path,
            Model.from_pyg(module),
            strategy=strategy,
            partitions=partitions,
            work_dir=work_dir,
            log=_silent,
        )
        actual = spark_output(result, data)
        expected = pyg_reference(module, data)
        assert not np.isnan(actual).any(), f"{graph_name}: some vertices have no output row"
        assert relative_error(actual, expected) <= 1e-5, (graph_name, relative_error(actual, expected))
        pred = result.toArrow().column("pred").to_numpy()
        assert pred.min() >= 0 and pred.max() < expected.shape[1]


@pytest.mark.parametrize("model_name", ["sage_mean", "gat", "gcn"])
def test_three_layers_auto_strategy(spark, graph_dirs, work_dir, model_name):
    path, data = graph_dirs["skewed"]
    torch.manual_seed(5)
    build = {"sage_mean": GraphSAGE, "gat": GAT, "gcn": GCN}[model_name]
    module = build(data.feature_dim, 12, 3, out_channels=6).eval()
    result = infer(spark, path, Model.from_pyg(module), partitions=3, work_dir=work_dir, log=_silent)
    assert relative_error(spark_output(result, data), pyg_reference(module, data)) <= 1e-5
