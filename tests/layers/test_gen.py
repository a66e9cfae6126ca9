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


def test_a_bare_gen_conv_reads_edge_features_only_where_its_construction_says(synthetic):
    """PyG's GENConv reads edge_attr only when its call passes them and keeps no edge_dim, so a
    GENConv converted on its own (no call to read) without lin_edge reads none, as PyG's
    conv(x, edge_index) does, and edge features of its out width are refused in one line naming
    the fix (convert it with its call) instead of silently left out; with lin_edge (edge_dim !=
    out_channels) it reads them; the flag survives the save / load round trip."""
    from sparkgnn.models import Model

    f, ei = synthetic.num_features, synthetic.edge_index
    gen = torch.Generator().manual_seed(4)
    same, other = (torch.randn(ei.shape[1], w, generator=gen) for w in (8, D))
    for conv in (graphs.randomize(gnn.GENConv(f, 8)), graphs.randomize(gnn.GENConv(f, 8, edge_dim=8))):
        model = Model.from_pyg(conv, output="embedding")
        assert model.edge_attr_dim == 0
        with torch.no_grad():
            plain = conv(synthetic.x, ei)
            assert graphs.rel_err(model(synthetic.x, ei, parts=3), plain) <= TOL
            # edge features of another width: a call passing them would fail in PyG, so none are meant
            assert graphs.rel_err(model(synthetic.x, ei, parts=3, edge_attr=other), plain) <= TOL
            with pytest.raises(ValueError, match=r"layer 1 \(gen\) was converted from a GENConv on its own") as info:
                model(synthetic.x, ei, edge_attr=same)
        assert "Sequential('x, edge_index, edge_attr'" in str(info.value) and "\n" not in str(info.value)
        rebuilt = build_conv(model.conv(0).config())
        assert rebuilt.ambiguous_edge_dim == 8 and rebuilt.edge_attr_dim == 0
        # converted with its call, as the refusal says: the features are read
        called = Model.from_pyg(
            gnn.Sequential("x, edge_index, edge_attr", [(conv, "x, edge_index, edge_attr -> x")]), output="embedding"
        )
        assert called.edge_attr_dim == 8
        with torch.no_grad():
            want = conv(synthetic.x, ei, same)
            assert graphs.rel_err(called(synthetic.x, ei, parts=3, edge_attr=same), want) <= TOL
    explicit = graphs.randomize(gnn.GENConv(f, 8, edge_dim=D))  # lin_edge: the constructor asked for them
    model = Model.from_pyg(explicit, output="embedding")
    assert model.edge_attr_dim == D and getattr(model.conv(0), "ambiguous_edge_dim", None) is None
    with torch.no_grad():
        assert graphs.rel_err(model(synthetic.x, ei, parts=3, edge_attr=other), explicit(synthetic.x, ei, other)) <= TOL
