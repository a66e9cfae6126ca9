"""PNAConv, converted from PyG, equals PyG's eval forward on the corner-case graph (self loops,
duplicated self loops, parallel edges, isolated vertices), with and without edge attributes, the
aggregation split over 1, 3 and 7 random partitions: every aggregator and degree scaler, towers
with and without divide_input, deeper pre / post stacks, trained degree averages; the merged
state and the save / load round trip; and the multi-aggregator's state arithmetic."""

import pytest
import torch
import torch_geometric.nn as gnn
import torch_test_graphs as graphs

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers import build_conv, compute_stats, propagate
from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import aggregate_state
from sparkgnn.models.pyg_convs import conv_layer

TOL = 1e-5
D = 5
ALL_AGGRS = ["mean", "min", "max", "std", "sum", "var"]
ALL_SCALERS = ["identity", "amplification", "attenuation", "linear", "inverse_linear"]
DEG = torch.tensor([3, 10, 6, 4, 2, 1])  # a training set's in-degree histogram


def _pna(f, out, **kwargs):
    options = {"aggregators": ALL_AGGRS, "scalers": ALL_SCALERS, "deg": DEG, **kwargs}
    return graphs.randomize(gnn.PNAConv(f, out, **options))


CASES = {
    "all": (lambda f: _pna(f, 8), None),
    "towers_divide": (lambda f: _pna(f, 8, towers=4, divide_input=True, pre_layers=2, post_layers=2), None),
    "towers_edge_dim": (
        lambda f: _pna(f, 6, aggregators=["max", "std"], scalers=["identity", "linear"], towers=2, edge_dim=D),
        D,
    ),
    "train_norm_elu": (lambda f: _pna(f, 8, aggregators=["mean"], train_norm=True, act="elu", edge_dim=D), D),
    "identity_only": (lambda f: _pna(f, 8, aggregators=["sum", "min"], scalers=["identity"]), None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_pna_equals_pyg(name, synthetic):
    build, width = CASES[name]
    conv = build(synthetic.num_features)
    attr = None
    if width is not None:
        attr = torch.randn(synthetic.edge_index.shape[1], width, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = conv(synthetic.x, synthetic.edge_index, attr)
    layer = conv_layer(conv, "conv")
    assert layer.edge_attr_dim == (width or 0)
    for parts in (1, 3, 7):
        out = propagate(layer, synthetic.x, *synthetic.edge_index, parts=parts, seed=parts, edge_attr=attr)
        assert graphs.rel_err(out, expected) <= TOL, (name, parts)
    state = aggregate_state(layer, synthetic.x, *synthetic.edge_index, edge_attr=attr)
    stats = compute_stats(layer, *synthetic.edge_index, None, synthetic.num_nodes)
    again = layer.update(synthetic.x, layer.aggregator.finalize(state), stats, False)
    assert graphs.rel_err(again, expected) <= TOL, name
    rebuilt = build_conv(layer.config())
    rebuilt.load_state_dict(layer.state_dict())
    rebuilt.eval()
    out = propagate(rebuilt, synthetic.x, *synthetic.edge_index, parts=3, edge_attr=attr)
    assert graphs.rel_err(out, expected) <= TOL, name


def _twice(n):
    return torch.cat([torch.arange(n), torch.arange(n)])


def test_multi_aggregator_merges_and_unmerges_by_parts():
    g = torch.Generator().manual_seed(0)
    m, index = torch.randn(40, 3, generator=g), torch.randint(0, 5, (40,), generator=g)
    multi = get_aggregator("multi", names=["sum", "var"])
    whole = multi.partial(m, index, 5)
    halves = torch.cat([multi.partial(m[:25], index[:25], 5), multi.partial(m[25:], index[25:], 5)])
    merged = multi.merge(halves, _twice(5), 5)
    assert torch.allclose(merged, whole, atol=1e-5)
    expected = torch.cat(
        [get_aggregator(n).finalize(get_aggregator(n).partial(m, index, 5)) for n in ("sum", "var")], 1
    )
    assert torch.allclose(multi.finalize(whole), expected, atol=1e-6)
    assert multi.invertible
    back = multi.merge(torch.cat([whole, multi.negate(multi.partial(m[25:], index[25:], 5))]), _twice(5), 5)
    assert torch.allclose(back, multi.partial(m[:25], index[:25], 5), atol=1e-5)
    assert not get_aggregator("multi", names=["mean", "max"]).invertible


def test_pna_refuses_an_aggregator_it_cannot_merge():
    conv = gnn.PNAConv(8, 8, aggregators=["mean", "median"], scalers=["identity"], deg=DEG)
    with pytest.raises(UnsupportedModelError, match="PNAConv.*MedianAggregation"):
        conv_layer(conv, "conv")


class _Net(torch.nn.Module):
    """A model class as PyG's examples write one: GENConv and PNAConv reading edge features."""

    def __init__(self, f):
        super().__init__()
        self.conv1 = gnn.GENConv(f, 16, edge_dim=D, learn_t=True)
        self.conv2 = gnn.PNAConv(16, 8, ALL_AGGRS, ALL_SCALERS, DEG, edge_dim=D, towers=2)

    def forward(self, x, edge_index, edge_attr):
        x = self.conv1(x, edge_index, edge_attr).relu()
        return self.conv2(x, edge_index, edge_attr)


def test_model_class_with_gen_and_pna_converts_and_reloads(synthetic, tmp_path):
    from sparkgnn.models import Model

    net = graphs.randomize(_Net(synthetic.num_features))
    attr = torch.randn(synthetic.edge_index.shape[1], D, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = net(synthetic.x, synthetic.edge_index, attr)
    model = Model.from_pyg(net)
    assert [c.kind for c in model.conv_list()] == ["gen", "pna"]
    assert graphs.rel_err(model(synthetic.x, synthetic.edge_index, parts=3, edge_attr=attr), expected) <= TOL
    model.save(tmp_path / "m")
    again = Model.load(tmp_path / "m")
    assert graphs.rel_err(again(synthetic.x, synthetic.edge_index, edge_attr=attr), expected) <= TOL
