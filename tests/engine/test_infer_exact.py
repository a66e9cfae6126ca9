"""Spark batch inference equals PyTorch Geometric's forward (1e-5 relative), for every layer type,
every data-movement strategy and partition counts 1, 3 and 8, on Cora and a skewed graph (self
loops, duplicate edges, weights, isolated vertices). Each (layer type, strategy, P) case runs on one
of the two graphs, alternating, so every (layer type, strategy), (layer type, P) and (strategy, P)
pair meets both graphs without running the whole matrix twice."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from engine_helpers import pyg_reference, relative_error, spark_output
from torch.nn import ReLU
from torch_geometric.nn import (
    GAT,
    GCN,
    GIN,
    GCNConv,
    GraphConv,
    GraphSAGE,
    LEConv,
    LGConv,
    ResGatedGraphConv,
    SAGEConv,
    Sequential,
    SGConv,
)

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


PARTITIONS = (1, 3, 8)
STRATEGIES = ("edge_join", "replicate", "combine")
GRAPHS = ("cora", "skewed")


@pytest.mark.parametrize("partitions", PARTITIONS)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_spark_equals_pyg(spark, graph_dirs, work_dir, model_name, strategy, partitions):
    turn = sorted(MODELS).index(model_name) + STRATEGIES.index(strategy) + PARTITIONS.index(partitions)
    graph_name = GRAPHS[turn % 2]
    for path, data in (graph_dirs[graph_name],):
        module = _module(model_name, data)
        result = infer(
            spark,
            path,
            Model.from_pyg(module),
            strategy=strategy,
            partitions=partitions,
            work_dir=work_dir,
        ).frame
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
    result = infer(spark, path, Model.from_pyg(module), partitions=3, work_dir=work_dir).frame
    assert relative_error(spark_output(result, data), pyg_reference(module, data)) <= 1e-5


class TracedClass(torch.nn.Module):
    """A model class as PyG's tutorials write it; Model.from_pyg traces its forward (models.pyg_fx)."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, out_channels)

    def forward(self, x, edge_index, edge_weight=None):
        x = self.conv1(x, edge_index, edge_weight).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv2(x, edge_index)
        return F.log_softmax(x, dim=1)


def test_traced_model_class_equals_pyg(spark, graph_dirs, work_dir):
    path, data = graph_dirs["skewed"]
    torch.manual_seed(11)
    module = TracedClass(data.feature_dim, 12, int(data.y.max()) + 1).eval()
    result = infer(spark, path, Model.from_pyg(module), partitions=3, work_dir=work_dir).frame
    with torch.no_grad():
        expected = module(torch.from_numpy(data.x), data.edge_index_torch(), torch.from_numpy(data.weight)).numpy()
    assert relative_error(spark_output(result, data), expected) <= 1e-5
    assert "pred" in result.columns


def _two_layers(conv, f, c, weighted=False):
    """conv(f, 16) -> ReLU -> conv(16, c) as a PyG Sequential, fed the edge weights when `weighted`."""
    if weighted:
        return Sequential(
            "x, edge_index, edge_weight",
            [
                (conv(f, 16), "x, edge_index, edge_weight -> x"),
                ReLU(),
                (conv(16, c), "x, edge_index, edge_weight -> x"),
            ],
        )
    return Sequential(
        "x, edge_index", [(conv(f, 16), "x, edge_index -> x"), ReLU(), (conv(16, c), "x, edge_index -> x")]
    )


def _forced_strategy_equals_pyg(spark, graph_dirs, work_dir, table, name, seed):
    """Model `name` of `table` ({name: (strategy, weighted, build(f, c))}), seeded, run on the
    skewed graph with P=3 and its strategy forced: every round runs that strategy, every vertex has
    a row and the rows equal the module's eval forward (fed the edge weights when `weighted`) to
    1e-5 relative."""
    path, data = graph_dirs["skewed"]
    strategy, weighted, build = table[name]
    torch.manual_seed(seed)
    module = build(data.feature_dim, int(data.y.max()) + 1).eval()
    model = Model.from_pyg(module)
    result = infer(spark, path, model, strategy=strategy, partitions=3, work_dir=work_dir)
    assert [layer.strategy for layer in result.plan.layers] == [strategy] * model.num_rounds
    x, edge_index = torch.from_numpy(data.x), data.edge_index_torch()
    weights = (torch.from_numpy(data.weight),) if weighted else ()
    with torch.no_grad():
        expected = module(x, edge_index, *weights).numpy()
    actual = spark_output(result.frame, data)
    assert not np.isnan(actual).any(), f"{name}: some vertices have no output row"
    assert relative_error(actual, expected) <= 1e-5, (name, relative_error(actual, expected))


# Messages that read the destination's payload, one strategy each (P=3, the skewed graph: self
# loops, parallel edges, isolated vertices, edge weights, which LEConv reads).
DST_READERS = {
    "gatv2": ("replicate", False, lambda f, c: GAT(f, 8, 2, out_channels=c, heads=2, v2=True)),
    "resgated": ("combine", False, lambda f, c: _two_layers(ResGatedGraphConv, f, c)),
    "le": ("edge_join", True, lambda f, c: _two_layers(LEConv, f, c, weighted=True)),
}


@pytest.mark.parametrize("model_name", sorted(DST_READERS))
def test_destination_reading_convs_equal_pyg(spark, graph_dirs, work_dir, model_name):
    _forced_strategy_equals_pyg(spark, graph_dirs, work_dir, DST_READERS, model_name, seed=11)


def _lightgcn_head(f, c):
    """Linear -> LGConv (weighted) -> ReLU -> Linear: LGConv has no in_channels, the Linear gives it
    one. Its default normalisation reads the weighted in-degree (no self loops), which the batch
    engine's prepared vertices carry beside GCN's degree."""
    return Sequential(
        "x, edge_index, edge_weight",
        [
            (torch.nn.Linear(f, 16), "x -> x"),
            (LGConv(), "x, edge_index, edge_weight -> x"),
            ReLU(),
            (torch.nn.Linear(16, c), "x -> x"),
        ],
    )


# The propagation convs of layers/graphconv.py, SAGEConv(project=True), LGConv and SGConv (K GCN
# rounds), one strategy each, P=3 on the skewed graph; weighted where the conv reads edge weights.
PROPAGATIONS = {
    "graphconv_max": ("combine", True, lambda f, c: _two_layers(lambda a, b: GraphConv(a, b, aggr="max"), f, c, True)),
    "sage_project": ("replicate", False, lambda f, c: _two_layers(lambda a, b: SAGEConv(a, b, project=True), f, c)),
    "lgconv": ("edge_join", True, _lightgcn_head),
    "sgconv_k2": (
        "replicate",
        True,
        lambda f, c: Sequential("x, edge_index, edge_weight", [(SGConv(f, c, K=2), "x, edge_index, edge_weight -> x")]),
    ),
}


@pytest.mark.parametrize("model_name", sorted(PROPAGATIONS))
def test_propagation_convs_equal_pyg(spark, graph_dirs, work_dir, model_name):
    _forced_strategy_equals_pyg(spark, graph_dirs, work_dir, PROPAGATIONS, model_name, seed=13)
