"""Spark batch inference equals PyTorch Geometric's forward (1e-5 relative), for every layer type,
every data-movement strategy and partition counts 1, 3 and 8, on Cora and a skewed graph (self
loops, duplicate edges, weights, isolated vertices). The cases are a covering array of strength 2,
not the whole product: every (layer type, strategy), (layer type, P) and (strategy, P) pair runs
once (a fault in one layer type under one partitioning or strategy shows), and every layer type,
strategy and P meets both graphs (CASES)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from engine_helpers import pyg_reference, relative_error, spark_output
from torch.nn import ReLU
from torch_geometric.nn import (
    APPNP,
    GAT,
    GCN,
    GIN,
    ChebConv,
    EdgeConv,
    GCNConv,
    GraphConv,
    GraphSAGE,
    JumpingKnowledge,
    LEConv,
    LGConv,
    ResGatedGraphConv,
    SAGEConv,
    Sequential,
    SGConv,
    TAGConv,
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
# layer type i, strategy j: P = PARTITIONS[(i + j) % 3] covers every (type, P) and (strategy, P) pair
# in 15 cases instead of 45; the graph GRAPHS[(i + j) % 2] gives each type, strategy and P both graphs.
CASES = [
    (name, strategy, PARTITIONS[(i + j) % 3], GRAPHS[(i + j) % 2])
    for i, name in enumerate(sorted(MODELS))
    for j, strategy in enumerate(STRATEGIES)
]


@pytest.mark.parametrize(("model_name", "strategy", "partitions", "graph_name"), CASES)
def test_spark_equals_pyg(spark, opened_graphs, work_dir, model_name, strategy, partitions, graph_name):
    for opened, data in (opened_graphs[graph_name],):
        module = _module(model_name, data)
        result = infer(
            spark,
            opened,
            Model.from_pyg(module),
            strategy=strategy,
            partitions=partitions,
            work_dir=work_dir,
        ).frame
        table = result.toArrow()
        actual = spark_output(table, data)
        expected = pyg_reference(module, data)
        assert not np.isnan(actual).any(), f"{graph_name}: some vertices have no output row"
        assert relative_error(actual, expected) <= 1e-5, (graph_name, relative_error(actual, expected))
        pred = table.column("pred").to_numpy()
        assert pred.min() >= 0 and pred.max() < expected.shape[1]


@pytest.mark.parametrize("model_name", ["sage_mean", "gat", "gcn"])
def test_three_layers_auto_strategy(spark, opened_graphs, work_dir, model_name):
    opened, data = opened_graphs["skewed"]
    torch.manual_seed(5)
    build = {"sage_mean": GraphSAGE, "gat": GAT, "gcn": GCN}[model_name]
    module = build(data.feature_dim, 12, 3, out_channels=6).eval()
    result = infer(spark, opened, Model.from_pyg(module), partitions=3, work_dir=work_dir).frame
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


def test_traced_model_class_equals_pyg(spark, opened_graphs, work_dir):
    opened, data = opened_graphs["skewed"]
    torch.manual_seed(11)
    module = TracedClass(data.feature_dim, 12, int(data.y.max()) + 1).eval()
    result = infer(spark, opened, Model.from_pyg(module), partitions=3, work_dir=work_dir).frame
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


def _forced_strategy_equals_pyg(spark, opened_graphs, work_dir, table, name, seed, graph="skewed", partitions=3):
    """Model `name` of `table` ({name: (strategy, weighted, build(f, c))}), seeded, run on
    `graph` (the skewed one unless told) with P=`partitions` and its strategy forced: every round
    runs that strategy, every vertex has a row and the rows equal the module's eval forward (fed
    the edge weights when `weighted`) to 1e-5 relative."""
    opened, data = opened_graphs[graph]
    strategy, weighted, build = table[name]
    torch.manual_seed(seed)
    module = build(data.feature_dim, int(data.y.max()) + 1).eval()
    model = Model.from_pyg(module)
    result = infer(spark, opened, model, strategy=strategy, partitions=partitions, work_dir=work_dir)
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
def test_destination_reading_convs_equal_pyg(spark, opened_graphs, work_dir, model_name):
    _forced_strategy_equals_pyg(spark, opened_graphs, work_dir, DST_READERS, model_name, seed=11)


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
def test_propagation_convs_equal_pyg(spark, opened_graphs, work_dir, model_name):
    _forced_strategy_equals_pyg(spark, opened_graphs, work_dir, PROPAGATIONS, model_name, seed=13)


def _appnp_head(f, c):
    """Linear -> APPNP (K=3: three rounds carrying x_0) -> Linear."""
    return Sequential(
        "x, edge_index",
        [
            (torch.nn.Linear(f, 16), "x -> x"),
            (APPNP(K=3, alpha=0.1), "x, edge_index -> x"),
            (torch.nn.Linear(16, c), "x -> x"),
        ],
    )


def _edgeconv(a, b):
    return EdgeConv(torch.nn.Sequential(torch.nn.Linear(2 * a, b), ReLU(), torch.nn.Linear(b, b)))


# Multi-hop convs whose rounds carry columns per vertex (TAGConv's running sum, APPNP's x_0,
# ChebConv's last two terms and sum) and
# EdgeConv (an nn over the destination's row per edge): one strategy, graph and P each,
# alternating the graphs.
HOPS_AND_EDGES = {
    "tagconv": (
        ("combine", True, lambda f, c: _two_layers(lambda a, b: TAGConv(a, b, K=2), f, c, True)),
        "skewed",
        3,
    ),
    "appnp": (("edge_join", False, _appnp_head), "cora", 1),
    # ChebConv: out-degree statistics (prepared by source), its rounds carry [T_{k-1} | T_{k-2} | sum]
    "chebconv": (
        ("combine", True, lambda f, c: _two_layers(lambda a, b: ChebConv(a, b, K=3), f, c, True)),
        "skewed",
        3,
    ),
    "edgeconv": (("replicate", False, lambda f, c: _two_layers(_edgeconv, f, c)), "skewed", 3),
}


@pytest.mark.parametrize("model_name", sorted(HOPS_AND_EDGES))
def test_multihop_and_edge_convs_equal_pyg(spark, opened_graphs, work_dir, model_name):
    case, graph, partitions = HOPS_AND_EDGES[model_name]
    table = {model_name: case}
    _forced_strategy_equals_pyg(
        spark, opened_graphs, work_dir, table, model_name, seed=17, graph=graph, partitions=partitions
    )


class ResidualGNN(torch.nn.Module):
    """Residual adds (layers/dag.py): the conv's input carried through its round and added after."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.lin_in = torch.nn.Linear(in_channels, hidden_channels)
        self.conv1 = GCNConv(hidden_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, hidden_channels)
        self.lin_out = torch.nn.Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = self.lin_in(x).relu()
        x = x + self.conv1(x, edge_index).relu()
        x = self.conv2(x, edge_index).relu() + x
        return F.log_softmax(self.lin_out(x), dim=-1)


class JKCat(torch.nn.Module):
    """JumpingKnowledge('cat') over three rounds: two outputs carried to the concatenation."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [SAGEConv(in_channels, hidden_channels), GCNConv(hidden_channels, hidden_channels)]
            + [SAGEConv(hidden_channels, hidden_channels)]
        )
        self.jump = JumpingKnowledge("cat")
        self.lin = torch.nn.Linear(3 * hidden_channels, out_channels)

    def forward(self, x, edge_index):
        xs = []
        for conv in self.convs:
            x = conv(x, edge_index).relu()
            xs.append(x)
        return self.lin(self.jump(xs))


class GenericResidual(torch.nn.Module):
    """A generic-fallback conv (MFConv) inside a residual add: its input carried through its round."""

    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        from torch_geometric.nn import MFConv

        self.lin_in = torch.nn.Linear(in_channels, hidden_channels)
        self.conv = MFConv(hidden_channels, hidden_channels, max_degree=4)
        self.lin_out = torch.nn.Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = self.lin_in(x).relu()
        x = x + self.conv(x, edge_index).relu()
        return self.lin_out(x)


# Skip connections (a DAG of rounds): one strategy, graph and P each.
SKIPS = {
    "generic_residual": (("replicate", False, lambda f, c: GenericResidual(f, 12, c)), "skewed", 3),
    "residual": (("combine", False, lambda f, c: ResidualGNN(f, 16, c)), "skewed", 3),
    "jk_cat": (("replicate", False, lambda f, c: JKCat(f, 8, c)), "cora", 1),
    "jk_cat_edge_join": (("edge_join", False, lambda f, c: JKCat(f, 8, c)), "skewed", 3),
}


@pytest.mark.parametrize("model_name", sorted(SKIPS))
def test_skip_connections_equal_pyg(spark, opened_graphs, work_dir, model_name):
    case, graph, partitions = SKIPS[model_name]
    _forced_strategy_equals_pyg(
        spark, opened_graphs, work_dir, {model_name: case}, model_name, seed=19, graph=graph, partitions=partitions
    )


@pytest.mark.parametrize("partitions", [1, 3])
def test_generic_fallback_conv_equals_pyg_under_replicate(spark, opened_graphs, work_dir, partitions):
    """A conv with no native layer (FeaStConv, then MFConv) runs as its own module on each
    partition's in-edge neighbourhoods (layers/generic.py): equal to PyG, on the skewed graph."""
    from torch_geometric.nn import FeaStConv, MFConv

    opened, data = opened_graphs["skewed"]
    torch.manual_seed(11)
    module = Sequential(
        "x, edge_index",
        [
            (FeaStConv(data.feature_dim, 12, heads=2), "x, edge_index -> x"),
            ReLU(),
            (MFConv(12, 5, max_degree=4), "x, edge_index -> x"),
        ],
    ).eval()
    model = Model.from_pyg(module, output="embedding")
    result = infer(spark, opened, model, strategy="replicate", partitions=partitions, work_dir=work_dir).frame
    actual = spark_output(result, data)
    expected = pyg_reference(module, data)
    assert not np.isnan(actual).any()
    assert relative_error(actual, expected) <= 1e-5, relative_error(actual, expected)
