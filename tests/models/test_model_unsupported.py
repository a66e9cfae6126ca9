"""Layers and options sparkgnn cannot run exactly are refused with UnsupportedModelError naming
the module (and its place in the model) and the offending option."""

import pytest
import torch
import torch_geometric.nn as gnn
import torch_geometric.nn.aggr as A

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.models import Model

F = 8


class Custom(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = gnn.GCNConv(F, 4)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index) * 2


class MyGCNConv(gnn.GCNConv):
    pass


CASES = [
    # (name, builder, substrings the message must contain)
    ("gatv2_edge_fill", lambda: gnn.GATv2Conv(F, 4, edge_dim=3, fill_value="add"), ["GATv2Conv", "fill_value='add'"]),
    ("gatv2_aggr_mean", lambda: gnn.GATv2Conv(F, 4, aggr="mean"), ["GATv2Conv", "aggr='mean'"]),
    ("resgated_edge_dim", lambda: gnn.ResGatedGraphConv(F, 4, edge_dim=2), ["ResGatedGraphConv", "edge_dim=2"]),
    ("resgated_act_none", lambda: gnn.ResGatedGraphConv(F, 4, act=None), ["ResGatedGraphConv", "act=None"]),
    (
        "resgated_act_prelu",
        lambda: gnn.ResGatedGraphConv(F, 4, act=torch.nn.PReLU()),
        ["ResGatedGraphConv", "parameter-free activation"],
    ),
    ("resgated_act_unknown", lambda: gnn.ResGatedGraphConv(F, 4, act=torch.nn.Hardswish()), ["act", "Hardswish"]),
    ("le_aggr_max", lambda: gnn.LEConv(F, 4, aggr="max"), ["LEConv", "aggr='max'"]),
    ("le_lazy", lambda: gnn.LEConv(-1, 4), ["LEConv", "lazy"]),
    ("gcn_improved", lambda: gnn.GCNConv(F, 4, improved=True), ["GCNConv", "improved=True"]),
    ("gcn_aggr_mean", lambda: gnn.GCNConv(F, 4, aggr="mean"), ["GCNConv", "aggr='mean'"]),
    ("gcn_flow", lambda: gnn.GCNConv(F, 4, flow="target_to_source"), ["GCNConv", "flow"]),
    ("gcn_lazy", lambda: gnn.GCNConv(-1, 4), ["GCNConv", "lazy"]),
    ("sg_cached", lambda: gnn.SGConv(F, 4, K=2, cached=True), ["SGConv", "cached=True"]),
    ("sg_aggr_mean", lambda: gnn.SGConv(F, 4, aggr="mean"), ["SGConv", "aggr='mean'"]),
    ("lg_first", lambda: gnn.LGConv(), ["model (LGConv)", "no in_channels", "put a Linear"]),
    (
        "graphconv_softmax",
        lambda: gnn.GraphConv(F, 4, aggr=A.SoftmaxAggregation()),
        ["GraphConv", "SoftmaxAggregation"],
    ),
    ("graphconv_median", lambda: gnn.GraphConv(F, 4, aggr=A.MedianAggregation()), ["GraphConv", "Median"]),
    ("sage_lstm", lambda: gnn.SAGEConv(F, 4, aggr="lstm"), ["SAGEConv", "LSTMAggregation"]),
    ("sage_multi", lambda: gnn.SAGEConv(F, 4, aggr=["mean", "max"]), ["SAGEConv", "MultiAggregation"]),
    ("sage_median", lambda: gnn.SAGEConv(F, 4, aggr=A.MedianAggregation()), ["MedianAggregation"]),
    ("sage_bipartite", lambda: gnn.SAGEConv((F, F + 1), 4), ["SAGEConv", "bipartite"]),
    ("gat_edge_fill", lambda: gnn.GATConv(F, 4, edge_dim=2, fill_value=0.5), ["GATConv", "fill_value=0.5"]),
    (
        "gin_groupnorm",
        lambda: gnn.GINConv(torch.nn.Sequential(torch.nn.Linear(F, 4), torch.nn.GroupNorm(2, 4))),
        ["nn.1", "GroupNorm"],
    ),
    (
        "gin_bn_no_stats",
        lambda: gnn.GINConv(
            torch.nn.Sequential(torch.nn.Linear(F, 4), torch.nn.BatchNorm1d(4, track_running_stats=False))
        ),
        ["BatchNorm1d", "track_running_stats=False"],
    ),
    ("cheb_no_norm", lambda: gnn.ChebConv(F, 4, K=2, normalization=None), ["ChebConv", "largest degree"]),
    ("cheb_k1", lambda: gnn.ChebConv(F, 4, K=1), ["ChebConv", "K=1"]),
    ("tag_k0", lambda: gnn.TAGConv(F, 4, K=0), ["TAGConv", "K=0"]),
    ("tag_aggr_mean", lambda: gnn.TAGConv(F, 4, aggr="mean"), ["TAGConv", "aggr='mean'"]),
    (
        "appnp_cached",
        lambda: torch.nn.Sequential(torch.nn.Linear(F, 4), gnn.APPNP(K=2, alpha=0.1, cached=True)),
        ["APPNP", "cached=True"],
    ),
    ("appnp_k0", lambda: torch.nn.Sequential(torch.nn.Linear(F, 4), gnn.APPNP(K=0, alpha=0.1)), ["APPNP", "K=0"]),
    ("appnp_first", lambda: gnn.APPNP(K=2, alpha=0.1), ["APPNP", "no in_channels"]),
    ("edgeconv_min", lambda: gnn.EdgeConv(torch.nn.Linear(2 * F, 4), aggr="min"), ["EdgeConv", "aggr='min'"]),
    ("edgeconv_no_width", lambda: gnn.EdgeConv(torch.nn.ReLU()), ["EdgeConv", "input width is unknown"]),
    ("gen_instance_norm", lambda: gnn.GENConv(F, 4, norm="instance"), ["mlp.1", "InstanceNorm1d"]),
    ("gen_multi_aggr", lambda: gnn.GENConv(F, 4, aggr=["mean", "max"]), ["GENConv", "multi-aggregation"]),
    ("transformer_lazy", lambda: gnn.TransformerConv(-1, 4), ["TransformerConv", "lazy"]),
    ("subclass", lambda: MyGCNConv(F, 4), ["MyGCNConv", "subclass of GCNConv"]),
    (
        "pna",
        lambda: gnn.PNA(F, 8, 2, aggregators=["mean"], scalers=["identity"], deg=torch.ones(3, dtype=torch.long)),
        ["PNA", "BasicGNN"],
    ),
    ("jk_lstm", lambda: gnn.GCN(F, 8, 2, jk="lstm"), ["GCN", "jk='lstm'", "LSTM"]),
    ("layer_norm", lambda: gnn.GCN(F, 8, 2, norm="layer_norm"), ["norms.0", "LayerNorm"]),
    ("custom", lambda: Custom(), ["Custom", "forward"]),
    (
        "conv_inside_gin_nn",
        lambda: gnn.GINConv(torch.nn.Sequential(torch.nn.Linear(F, 4), gnn.GCNConv(4, 4))),
        ["model.nn.1", "GCNConv", "nested"],
    ),
    (
        "seq_unknown_module",
        lambda: torch.nn.Sequential(gnn.GCNConv(F, 4), torch.nn.Hardswish()),
        ["model.1", "Hardswish"],
    ),
    ("seq_no_conv", lambda: torch.nn.Sequential(torch.nn.Linear(F, 4)), ["no graph convolution"]),
    (
        "pyg_seq_skip",
        lambda: gnn.Sequential(
            "x, edge_index",
            [
                (gnn.GCNConv(F, F), "x, edge_index -> x1"),
                (torch.nn.ReLU(), "x1 -> x2"),
                (gnn.GCNConv(F, 4), "x, edge_index -> x3"),
            ],
        ),
        ["module_2", "reads"],
    ),
    (
        "pyg_seq_edge_attr",
        lambda: gnn.Sequential("x, edge_index, edge_attr", [(gnn.GATConv(F, 4), "x, edge_index, edge_attr -> x")]),
        ["GATConv", "edge_attr"],
    ),
    (
        "width_mismatch",
        lambda: torch.nn.Sequential(gnn.GCNConv(F, 4), gnn.GCNConv(5, 3)),
        ["inconsistent layer widths", "expects width 5"],
    ),
    ("softmax_dim0", lambda: torch.nn.Sequential(gnn.GCNConv(F, 4), torch.nn.Softmax(dim=0)), ["Softmax", "dim=0"]),
]


@pytest.mark.parametrize("name,build,needles", CASES, ids=[c[0] for c in CASES])
def test_unsupported_is_refused_with_a_named_reason(name, build, needles):
    module = build()
    with pytest.raises(UnsupportedModelError) as info:
        Model.from_pyg(module)
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_bad_output_mode():
    with pytest.raises(UnsupportedModelError, match="output='probabilities'"):
        Model.from_pyg(gnn.GCN(F, 8, 2), output="probabilities")


def test_unsupported_error_is_a_sparkgnn_error():
    from sparkgnn.errors import SparkGNNError

    with pytest.raises(SparkGNNError):
        Model.from_pyg(gnn.ResGatedGraphConv(F, 4, edge_dim=2))
