"""GENConv, converted from PyG, equals PyG's eval forward on the corner-case graph (self loops,
duplicated self loops, parallel edges, isolated vertices), with and without edge attributes, the
aggregation split over 1, 3 and 7 random partitions: softmax (fixed and learnable t) and power
mean (fixed and learnable p) aggregations, lin_src / lin_dst, msg_norm, the MLP's norms, and
the save / load round trip."""

import pytest
import torch
import torch_geometric.nn as gnn
import torch_test_graphs as graphs

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers import build_conv, propagate
from sparkgnn.layers.base import aggregate_state
from sparkgnn.models.pyg_convs import conv_layer

TOL = 1e-5
D = 5


def _learned(conv, **values):
    """randomize, then set the aggregation's learnable t / p (randn could give p near 0)."""
    graphs.randomize(conv)
    with torch.no_grad():
        for name, value in values.items():
            getattr(conv.aggr_module, name).fill_(value)
    return conv


CASES = {
    "softmax": (lambda f: graphs.randomize(gnn.GENConv(f, 8)), None),
    "softmax_t_bias_layer_norm": (
        lambda f: graphs.randomize(gnn.GENConv(f, 8, t=0.5, bias=True, norm="layer", num_layers=3)),
        None,
    ),
    "softmax_learn_t_same_width": (lambda f: _learned(gnn.GENConv(f, f, learn_t=True), t=1.7), None),
    "powermean": (lambda f: graphs.randomize(gnn.GENConv(f, 8, aggr="powermean", p=2.0)), None),
    "powermean_learn_p": (
        lambda f: _learned(gnn.GENConv(f, 8, aggr="powermean", learn_p=True, bias=True), p=1.5),
        None,
    ),
    "mean_msg_norm": (
        lambda f: graphs.randomize(gnn.GENConv(f, 8, aggr="mean", msg_norm=True, learn_msg_scale=True)),
        None,
    ),
    "softmax_edge_dim": (lambda f: graphs.randomize(gnn.GENConv(f, 8, edge_dim=D, t=0.8)), D),
    "powermean_edge_same_width": (lambda f: graphs.randomize(gnn.GENConv(f, 8, aggr="powermean", p=3.0)), 8),
    "max_edge_dim_bias": (lambda f: graphs.randomize(gnn.GENConv(f, f, aggr="max", edge_dim=D, bias=True)), D),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gen_equals_pyg(name, synthetic):
    build, width = CASES[name]
    conv = build(synthetic.num_features)
    attr = None
    if width is not None:
        attr = torch.randn(synthetic.edge_index.shape[1], width, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = conv(synthetic.x, synthetic.edge_index, attr)
    layer = conv_layer(conv, "conv", use_edge_weight=attr is not None)
    assert layer.edge_attr_dim == (width or 0)
    for parts in (1, 3, 7):
        out = propagate(layer, synthetic.x, *synthetic.edge_index, parts=parts, seed=parts, edge_attr=attr)
        assert graphs.rel_err(out, expected) <= TOL, (name, parts)
    # the merged state (what a PE store keeps) finalizes to the same rows
    state = aggregate_state(layer, synthetic.x, *synthetic.edge_index, edge_attr=attr)
    again = layer.update(synthetic.x, layer.aggregator.finalize(state), {}, False)
    assert graphs.rel_err(again, expected) <= TOL, name
    rebuilt = build_conv(layer.config())
    rebuilt.load_state_dict(layer.state_dict())
    rebuilt.eval()
    out = propagate(rebuilt, synthetic.x, *synthetic.edge_index, parts=3, edge_attr=attr)
    assert graphs.rel_err(out, expected) <= TOL, name


def test_gen_called_without_edge_attr_reads_none(synthetic):
    conv = graphs.randomize(gnn.GENConv(synthetic.num_features, 8, edge_dim=D))
    with torch.no_grad():
        expected = conv(synthetic.x, synthetic.edge_index)
    layer = conv_layer(conv, "conv", use_edge_weight=False)
    assert layer.edge_attr_dim == 0
    assert graphs.rel_err(propagate(layer, synthetic.x, *synthetic.edge_index, parts=3), expected) <= TOL


def test_gen_refuses_a_multi_aggregation():
    conv = gnn.GENConv(8, 8, aggr=["mean", "max"])
    with pytest.raises(UnsupportedModelError, match="GENConv.*multi-aggregation"):
        conv_layer(conv, "conv", use_edge_weight=False)
